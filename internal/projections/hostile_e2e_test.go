package projections_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// hostileStrings returns n strings for the fields of a fuzzed event, from a
// fixed seed: controls (NUL, CR/LF, ESC, C1), invalid UTF-8, line
// separators and bidi overrides, very long text, unicode oddities that are
// allowed (RTL marks, combining marks, emoji, U+FFFD, BOM, zero-width
// joiners), and SQL- or format-ish text.
func hostileStrings(rng *rand.Rand, n int) []string {
	pieces := []string{
		"\x00", "\r\n", "\n", "\r", "\t", "\x1b[2J", "\x7f", "\u0085", "\u009b", "\u2028", "\u2029", "\u202e", "\u2066", "\xff", "\xc3",
		"\u200f", "e\u0301", "😀", "\uFFFD", "\uFEFF", "\u200d", "ß", "日本", "عربى",
		"'); DROP TABLE placement_workers;--", `\x00`, "$1", "%s%n", `"},{"`, "NULL", "\\", "'", "\"",
	}
	out := make([]string, n)
	for i := range out {
		var b strings.Builder
		b.WriteString("10.0.0.1:25")
		for k := rng.IntN(4); k >= 0; k-- {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		if rng.IntN(10) == 0 {
			b.WriteString(strings.Repeat("é", 200+rng.IntN(400))) // long: some past the limit
		}
		out[i] = b.String()
	}
	return out
}

// TestHostileStringsNeverStallAProjection feeds hostile strings through
// ingest (the producer client, which validates as the API does) and
// straight onto the domain topics (as a non-mailplane producer would), and
// proves that no projection stalls: the engine, the registry projector and
// the placement projector all reach the end of their logs. What ingest
// refuses never reaches the log; what a consumer cannot read goes to the
// DLQ; what the engine decides is stored as it was sent.
func TestHostileStringsNeverStallAProjection(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k, err := sealing.ParseKeys("k1:"+base64.StdEncoding.EncodeToString(make([]byte, sealing.KeySize)), "")
	if err != nil {
		t.Fatal(err)
	}
	client := producer.New(e.prod, producer.WithSealer(k), producer.WithSchema(eventschema.Default()), producer.WithSource("mailplane/test"),
		producer.WithNamespace(e.kcfg.Namespace))
	rng := rand.New(rand.NewPCG(9, 9))

	org, user := "00000003-0000-4000-8000-000000000001", "00000004-0000-4000-8000-000000000001"
	if _, err := client.PublishOrgPlanChanged(ctx, domain.OrgPlanChanged{OrgID: org, Plan: domain.PlanPremium, Paid: true, Source: "billing"}); err != nil {
		t.Fatal(err)
	}
	strs := hostileStrings(rng, 120)
	accepted, refused := map[string]string{}, 0 // worker id -> address
	var raw []*kgo.Record
	for i, s := range strs {
		worker := fmt.Sprintf("00000001-0000-4000-8000-%012x", i+1)
		mailbox := fmt.Sprintf("00000002-0000-4000-8000-%012x", i+1)
		hb := domain.WorkerHeartbeat{WorkerID: worker, Tier: domain.TierSharedPremium, Egress: domain.EgressOAuthAPI, Address: s}
		_, herr := client.PublishWorkerHeartbeat(ctx, hb)
		ma := domain.MailboxAdded{MailboxID: mailbox, OrgID: org, UserID: user, Address: "box" + strconv.Itoa(i) + "@example.com",
			Provider: domain.ProviderSMTPIMAP, IMAP: domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit, Username: s},
			Credentials: &domain.Credentials{Password: s}}
		_, merr := client.PublishMailboxAdded(ctx, ma)
		_, rerr := client.PublishOrgPlanChanged(ctx, domain.OrgPlanChanged{OrgID: org, Plan: domain.PlanPremium, Paid: true, Source: s})
		clean := domain.IsCleanText(s) && len([]rune(s)) <= 255
		for _, err := range []error{herr, rerr} {
			if (err == nil) != clean && len([]rune(s)) <= 200 {
				t.Errorf("%+q: published = %v (%v), want %v", s, err == nil, err, clean)
			}
		}
		if herr == nil {
			accepted[worker] = s
		} else {
			refused++
			if domain.IsCleanText(s) || domain.ErrorCode(herr) != domain.CodeForbiddenCharacter && domain.ErrorCode(herr) != domain.CodeInvalid {
				if !strings.Contains(herr.Error(), "too_long") {
					t.Errorf("%+q: refused with %v", s, herr)
				}
			}
			// The same heartbeat straight onto the topic, past ingest. JSON
			// carries invalid UTF-8 as U+FFFD: such a record is clean on the
			// log, and consumers decide and project it.
			r := rawHeartbeat(worker, s, "mailplane/test")
			var onLog struct{ Address string }
			_ = json.Unmarshal(r.Value, &onLog)
			if domain.IsCleanText(onLog.Address) && len([]rune(onLog.Address)) <= 255 {
				accepted[worker] = onLog.Address
				e.produceRaw(r)
			} else {
				raw = append(raw, r)
			}
		}
		if merr == nil && !domain.IsCleanText(s) {
			t.Errorf("%+q: mailbox.added with it published", s)
		}
	}
	// Hostile attributes on otherwise valid records.
	for i, src := range []string{"mailplane/test\r\nforged: line", "mailplane/\x00", "mailplane/\xff", "with space"} {
		raw = append(raw, rawHeartbeat(fmt.Sprintf("00000001-0000-4000-8000-%012x", 900+i), "10.0.0.9:25", src))
	}
	e.produceRaw(raw...)
	if refused == 0 || len(accepted) == 0 {
		t.Fatalf("the fuzz is not hostile enough: %d accepted, %d refused", len(accepted), refused)
	}

	// The engine, the registry projector and the placement projector.
	eng, err := engine.New(e.kcfg, engine.WithSessionTimeout(kafkatest.SessionTimeout(2*time.Second)),
		engine.WithHeartbeatInterval(200*time.Millisecond), engine.WithLogger(mailplanetest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	engCtx, engStop := context.WithCancel(context.Background())
	engDone := make(chan error, 1)
	go func() { engDone <- eng.Run(engCtx) }()
	t.Cleanup(func() {
		engStop()
		if err := <-engDone; err != nil {
			t.Errorf("engine: %v", err)
		}
	})
	reg, _ := e.projector(e.db.Pool, projections.NewRegistry())
	start(t, reg)
	pp, err := postgres.NewProjector(e.kcfg, e.db.Pool, postgres.WithLogger(mailplanetest.Logger(t)), postgres.WithStandbyPoll(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ppCtx, ppStop := context.WithCancel(context.Background())
	ppDone := make(chan error, 1)
	go func() { ppDone <- pp.Run(ppCtx) }()
	t.Cleanup(func() {
		ppStop()
		if err := <-ppDone; err != nil {
			t.Errorf("placement projector: %v", err)
		}
	})

	// Every consumer reaches the end of its log.
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, projections.NewRegistry().Topics(), time.Minute)
	engineCaughtUp(t, e.kcfg, time.Minute)
	decEnd := endOffsets(t, e.kcfg, []string{topics.PlacementDecisions})[tp{topics.PlacementDecisions, 0}]
	if decEnd == 0 {
		t.Fatal("the engine decided nothing")
	}
	waitCaughtUp(t, e.kcfg, e.db.Pool, postgres.Name, []string{topics.PlacementDecisions}, time.Minute)

	// What the engine decided is stored as it was sent.
	for worker, addr := range accepted {
		var got string
		if err := e.db.Pool.QueryRow(ctx, `SELECT address FROM placement_workers WHERE worker_id = $1`, worker).Scan(&got); err != nil {
			t.Fatalf("worker %s (%+q): %v", worker, addr, err)
		}
		if got != addr {
			t.Errorf("worker %s: address stored as %+q, sent %+q", worker, got, addr)
		}
	}
	// Nothing refused was decided: no such worker in the projection.
	if n := count(t, e.db.Pool, `SELECT count(*) FROM placement_workers`); n != len(accepted) {
		t.Errorf("%d workers projected, %d accepted", n, len(accepted))
	}
	// Every raw hostile record is in the DLQ, from the engine and from the
	// registry projector.
	dead := deadLetters(t, e.kcfg)
	for _, r := range raw {
		for _, consumer := range []string{engine.DeadLetterConsumer, projections.RegistryName} {
			if !dead[fmt.Sprintf("%s/%s/%d/%d", consumer, r.Topic, r.Partition, r.Offset)] {
				t.Errorf("%s did not dead-letter %s/%d/%d", consumer, r.Topic, r.Partition, r.Offset)
			}
		}
	}
}

// rawHeartbeat is a heartbeat record as a non-mailplane producer would
// write it, with no validation.
func rawHeartbeat(worker, address, source string) *kgo.Record {
	v, _ := json.Marshal(map[string]any{"worker_id": worker, "tier": "shared_premium", "egress": "oauth_api", "address": address})
	return &kgo.Record{Topic: topics.WorkerEvents, Key: []byte(worker), Value: v, Headers: []kgo.RecordHeader{
		{Key: topics.HeaderSpecVersion, Value: []byte("1.0")}, {Key: topics.HeaderID, Value: []byte(domain.NewEventID())},
		{Key: topics.HeaderType, Value: []byte(domain.TypeWorkerHeartbeat)}, {Key: topics.HeaderSource, Value: []byte(source)},
		{Key: topics.HeaderTime, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))}, {Key: topics.HeaderSubject, Value: []byte(worker)},
	}}
}

// engineCaughtUp waits until the engine group's committed offsets reach the
// end of every non-empty partition it reads.
func engineCaughtUp(t *testing.T, kcfg kafka.Config, timeout time.Duration) {
	t.Helper()
	cl, err := kafka.NewClient(kafka.Config{Brokers: kcfg.Brokers}, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	in := []string{topics.MailboxEvents, topics.OrgEvents, topics.WorkerEvents}
	ends := endOffsets(t, kcfg, in)
	waitFor(t, timeout, "the engine to reach the end of its inputs", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		os, err := adm.FetchOffsets(ctx, kcfg.Group(engine.DefaultGroup))
		if err != nil {
			return false, err
		}
		for k, end := range ends {
			o, ok := os.Lookup(kcfg.Topic(k.topic), k.partition)
			if end > 0 && (!ok || o.At != end) {
				return false, fmt.Errorf("%s[%d] at %v of %d", k.topic, k.partition, o.At, end)
			}
		}
		return true, nil
	})
}

// deadLetters reads the DLQ to its end: consumer/topic/partition/offset.
func deadLetters(t *testing.T, kcfg kafka.Config) map[string]bool {
	t.Helper()
	// To the high watermark as of now, waiting for transactions open then:
	// the engine dead-letters in its transactions, and a log ending in a
	// commit marker has no record at its last offset to wait for.
	out := map[string]bool{}
	_, err := kafka.ReadToEnd(context.Background(), kcfg, kafka.ReadSpec{Topics: []string{kcfg.Topic(topics.DLQ)}, HighWatermark: true,
		Timeout: 30 * time.Second}, func(r *kgo.Record) error {
		h := func(k string) string { v, _ := topics.Header(r, k); return v }
		out[fmt.Sprintf("%s/%s/%s/%s", h(dlq.HeaderConsumer), h(dlq.HeaderSourceTopic), h(dlq.HeaderSourcePartition), h(dlq.HeaderSourceOffset))] = true
		return nil
	})
	if err != nil {
		t.Fatalf("reading the DLQ: %v", err)
	}
	return out
}

// unstorable is the registry, except that one event's text reaches
// Postgres with a NUL in it, as a projection would have stored an event
// validated before the text rule: Postgres refuses it (SQLSTATE 22021).
type unstorable struct {
	*projections.Registry
	bad string
}

func (u *unstorable) Apply(ctx context.Context, tx pgx.Tx, recs []projections.Record) error {
	for _, r := range recs {
		if r.Event.ID == u.bad {
			var s string
			return tx.QueryRow(ctx, `SELECT $1::text`, "10.0.0.1:25\x00").Scan(&s)
		}
	}
	return u.Registry.Apply(ctx, tx, recs)
}

// TestUnstorableRecordGoesToDLQ: a record Postgres refuses as data (class
// 22, the NUL of issue 9) is not retried forever: it is tried Attempts
// times, dead-lettered with code invalid, and the projector reaches the end
// of its log.
func TestUnstorableRecordGoesToDLQ(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(8, 1)
	events := g.events(40)
	bad := events[17]
	recs := e.produce(events...)
	p, reg := e.projector(e.db.Pool, &unstorable{Registry: projections.NewRegistry(), bad: bad.ID},
		projections.WithRetry(projections.RetryPolicy{Attempts: 2, Backoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}))
	start(t, p)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, projections.NewRegistry().Topics(), time.Minute)
	entries, err := dlq.List(t.Context(), e.kcfg, 0)
	must(t, err)
	if len(entries) != 1 || entries[0].SourceOffset != recs[17].Offset || entries[0].ErrorCode != domain.CodeInvalid {
		t.Fatalf("dead letters %+v, want the one unstorable record with code invalid", entries)
	}
	if got := counter(t, reg, "mailplane_dlq_records_total", "projector", "registry", "code", "invalid"); got != 1 {
		t.Fatalf("dlq metric = %v", got)
	}
}
