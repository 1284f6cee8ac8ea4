package dlq_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

func TestForOtherConsumer(t *testing.T) {
	t.Parallel()
	plain := source(`{"mailbox_id":"x"}`)
	if dlq.ForOtherConsumer(plain, "registry") {
		t.Fatal("a record never redriven is for every consumer")
	}
	e := dlq.Parse(dlq.NewRecord("", plain, dlq.Failure{Consumer: "registry", Code: domain.CodeInvalid, Err: "x", Attempts: 1}))
	r := dlq.RedriveRecord(e, "0190a5e4-0000-7000-8000-0000000000aa")
	if dlq.ForOtherConsumer(r, "registry") {
		t.Fatal("a redriven record is for its consumer")
	}
	for _, other := range []string{"mailbox-state", "placement-engine", "sync-activity", "health", ""} {
		if !dlq.ForOtherConsumer(r, other) {
			t.Fatalf("a record redriven for registry must be skipped by %q", other)
		}
	}
}

// The names the consumers write in their dead letters are the names the
// redrive policy and ForOtherConsumer know them by.
func TestConsumerNames(t *testing.T) {
	t.Parallel()
	if projections.RegistryName != string(sla.Registry) || mailboxstate.ConsumerName != string(sla.MailboxState) ||
		engine.DeadLetterConsumer != string(sla.PlacementEngine) {
		t.Fatalf("consumer names differ from internal/sla's: %s %s %s", projections.RegistryName, mailboxstate.ConsumerName, engine.DeadLetterConsumer)
	}
	got := dlq.RedrivableConsumers()
	if want := []string{"health", "mailbox-state", "registry"}; !equal(got, want) {
		t.Fatalf("redrivable %v, want %v", got, want)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestRedriveRecord(t *testing.T) {
	t.Parallel()
	src := source(`{"mailbox_id":"x"}`)
	// A record redriven before, failing again: its old redrive headers go.
	src.Headers = append(src.Headers, kgo.RecordHeader{Key: dlq.HeaderRedriveID, Value: []byte("old")},
		kgo.RecordHeader{Key: dlq.HeaderRedriveConsumer, Value: []byte("mailbox-state")})
	e := dlq.Parse(dlq.NewRecord("", src, dlq.Failure{Consumer: "registry", Code: domain.CodeInvalid, Err: "x", Attempts: 3}))
	e.Partition, e.Offset = 0, 17
	// An entry built by hand may carry dead-letter headers: never copied.
	e.Headers = append(e.Headers, kgo.RecordHeader{Key: dlq.HeaderConsumer, Value: []byte("forged")})
	r := dlq.RedriveRecord(e, "0190a5e4-0000-7000-8000-0000000000aa")
	if r.Topic != src.Topic || r.Partition != src.Partition || !bytes.Equal(r.Key, src.Key) || !bytes.Equal(r.Value, src.Value) {
		t.Fatalf("record %s/%d key %q value %q; want the original's place, key and value", r.Topic, r.Partition, r.Key, r.Value)
	}
	got := map[string][]string{}
	for _, h := range r.Headers {
		got[h.Key] = append(got[h.Key], string(h.Value))
	}
	want := map[string]string{
		topics.HeaderID:               "0190a5e4-0000-7000-8000-0000000000ff",
		topics.HeaderType:             domain.TypeMailboxAdded,
		dlq.HeaderRedriveConsumer:     "registry",
		dlq.HeaderRedriveID:           "0190a5e4-0000-7000-8000-0000000000aa",
		dlq.HeaderRedriveDLQPartition: "0",
		dlq.HeaderRedriveDLQOffset:    "17",
		dlq.HeaderRedriveSourceOffset: "42",
	}
	if len(got) != len(want) {
		t.Fatalf("headers %v, want %v", got, want)
	}
	for k, v := range want {
		if len(got[k]) != 1 || got[k][0] != v {
			t.Fatalf("header %s = %v, want [%s] (all: %v)", k, got[k], v, got)
		}
	}
}

func off(n int64) *int64 { return &n }

func TestSelectionCheck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		sel  dlq.Selection
		code domain.Code
	}{
		{"ok", dlq.Selection{Consumer: "registry"}, ""},
		{"ok range", dlq.Selection{Consumer: "mailbox-state", Code: "malformed_json", FromOffset: off(3), ToOffset: off(3)}, ""},
		{"no consumer", dlq.Selection{}, domain.CodeRequired},
		{"control character", dlq.Selection{Consumer: "registry\n"}, domain.CodeForbiddenCharacter},
		{"bidi override", dlq.Selection{Consumer: "\u202eregistry"}, domain.CodeForbiddenCharacter},
		{"unknown consumer", dlq.Selection{Consumer: "billing"}, domain.CodeInvalid},
		{"placement engine", dlq.Selection{Consumer: "placement-engine"}, domain.CodeNotRedrivable},
		{"placement projection", dlq.Selection{Consumer: "placement-projection"}, domain.CodeInvalid},
		{"bad code", dlq.Selection{Consumer: "registry", Code: "x'; DROP TABLE dlq_redrives;--"}, domain.CodeInvalid},
		{"negative offset", dlq.Selection{Consumer: "registry", FromOffset: off(-5)}, domain.CodeOutOfRange},
		{"empty range", dlq.Selection{Consumer: "registry", FromOffset: off(9), ToOffset: off(3)}, domain.CodeOutOfRange},
	} {
		err := c.sel.Check()
		if got := domain.ErrorCode(err); (err == nil) != (c.code == "") || err != nil && got != c.code {
			t.Errorf("%s: %v (code %s), want code %q", c.name, err, got, c.code)
		}
	}
}

// TestRedriveNeedsOps: a caller without the ops scope redrives nothing,
// before anything is read or written.
func TestRedriveNeedsOps(t *testing.T) {
	t.Parallel()
	sel := dlq.Selection{Consumer: "registry"}
	for _, c := range []*domain.Caller{nil, {Name: "reader", Scopes: []string{domain.ScopeAuditRead, domain.ScopeWorkersRead}}} {
		_, err := dlq.Redrive(t.Context(), kafka.Config{Brokers: []string{"127.0.0.1:1"}}, nil, c, sel)
		if domain.ErrorCode(err) != domain.CodeForbidden {
			t.Fatalf("caller %+v: %v, want forbidden", c, err)
		}
	}
}

// redriveEnv is a broker with the catalog and a migrated schema.
func redriveEnv(t *testing.T) (kafka.Config, *pgtest.DB, *kgo.Client) {
	t.Helper()
	cfg := kafkatest.Config(t, 4)
	cfg.ClientID = "dlq-redrive-test"
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	cl, err := kafka.NewProducer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cfg, db, cl
}

var ops = &domain.Caller{Name: "test-ops", Scopes: []string{domain.ScopeOps}, Source: "/ops"}

// deadLetter produces the dead letter of a record at topic/partition/offset
// (topic a catalog name, in cfg's namespace) and returns it as listed.
func deadLetter(t *testing.T, ctx context.Context, cfg kafka.Config, cl *kgo.Client, topic string, partition int32, offset int64, value, consumer string, code domain.Code) dlq.Entry {
	t.Helper()
	src := source(value)
	src.Topic, src.Partition, src.Offset = cfg.Topic(topic), partition, offset
	r := dlq.NewRecord(cfg.Namespace, src, dlq.Failure{Consumer: consumer, Code: code, Err: "test", Attempts: 1})
	if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return dlq.Parse(r)
}

// redrivenCopies returns the offsets of the records in topic/partition
// (topic a catalog name, in cfg's namespace) carrying redrive id.
func redrivenCopies(t *testing.T, ctx context.Context, cfg kafka.Config, topic string, partition int32, id string) []int64 {
	t.Helper()
	topic = cfg.Topic(topic)
	var out []int64
	spec := kafka.ReadSpec{Topics: []string{topic}, Partitions: func(string, int) []int32 { return []int32{partition} }}
	if _, err := kafka.ReadToEnd(ctx, cfg, spec, func(r *kgo.Record) error {
		for _, h := range r.Headers {
			if h.Key == dlq.HeaderRedriveID && string(h.Value) == id {
				out = append(out, r.Offset)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRedriveRefusals: what redrive refuses, with its code, and that a
// refused dead letter writes nothing.
func TestRedriveRefusals(t *testing.T) {
	t.Parallel()
	cfg, db, cl := redriveEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	withheld := deadLetter(t, ctx, cfg, cl, topics.MailboxEvents, 1, 5, `{"mailbox_id":"x","credentials":{"password":"hunter2"}}`, "registry", domain.CodeInvalid)
	if withheld.ValueWithheld == "" {
		t.Fatal("the DLQ kept a secret")
	}
	// Dead letters forged onto the DLQ by hand: a secret in the value, a
	// source topic the consumer does not read (a redrive must never write
	// the decision log), no value.
	forge := func(edit func(r *kgo.Record)) {
		src := source(`{"n":1}`)
		src.Topic, src.Partition, src.Offset = cfg.Topic(topics.MailboxEvents), 1, 6
		r := dlq.NewRecord(cfg.Namespace, src, dlq.Failure{Consumer: "registry", Code: domain.CodeInvalid, Err: "x", Attempts: 1})
		edit(r)
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	forge(func(r *kgo.Record) { r.Value = []byte(`{"mailbox_id":"x","Password":"hunter2"}`) })
	forge(func(r *kgo.Record) {
		for i := range r.Headers {
			if r.Headers[i].Key == dlq.HeaderSourceTopic {
				r.Headers[i].Value = []byte(cfg.Topic(topics.PlacementDecisions))
			}
		}
	})
	forge(func(r *kgo.Record) { r.Value = nil })
	// Not the selection's: another consumer's, another code.
	deadLetter(t, ctx, cfg, cl, topics.MailboxEvents, 1, 7, `{"n":2}`, "mailbox-state", domain.CodeInvalid)
	deadLetter(t, ctx, cfg, cl, topics.MailboxEvents, 1, 8, `{"n":3}`, "registry", domain.CodeUnknownType)

	sel := dlq.Selection{Consumer: "registry", Code: domain.CodeInvalid}
	rep, err := dlq.Redrive(ctx, cfg, db.Pool, ops, sel)
	if err != nil {
		t.Fatal(err)
	}
	codes := map[domain.Code]int{}
	for _, it := range rep.Items {
		if it.Outcome != dlq.OutcomeRefused {
			t.Errorf("item %d/%d: %s, want refused", it.Entry.Partition, it.Entry.Offset, it.Outcome)
		}
		codes[it.Code]++
	}
	if len(rep.Items) != 4 || codes[domain.CodeValueWithheld] != 2 || codes[domain.CodeNotRedrivable] != 2 {
		t.Fatalf("refusals %v in %+v; want 2 value_withheld, 2 not_redrivable", codes, rep.Items)
	}
	if n := rowCount(t, db, `SELECT count(*) FROM dlq_redrives`); n != 0 {
		t.Fatalf("refused dead letters recorded %d redrives", n)
	}
	if rep.RedriveID != "" {
		t.Fatalf("a redrive that redrove nothing has id %s", rep.RedriveID)
	}
	// The engine's dead letters are refused as a whole.
	if _, err := dlq.Redrive(ctx, cfg, db.Pool, ops, dlq.Selection{Consumer: "placement-engine"}); domain.ErrorCode(err) != domain.CodeNotRedrivable {
		t.Fatalf("engine redrive: %v, want not_redrivable", err)
	}
}

func rowCount(t *testing.T, db *pgtest.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(t.Context(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRedriveCompletesPending: a redrive that died between recording and
// producing left pending rows. The next redrive produces the record that
// is missing, and only marks done the one that landed: neither is lost,
// neither appended twice.
func TestRedriveCompletesPending(t *testing.T) {
	t.Parallel()
	cfg, db, cl := redriveEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	deadLetter(t, ctx, cfg, cl, topics.MailboxEvents, 2, 10, `{"n":1}`, "registry", domain.CodeInvalid)
	deadLetter(t, ctx, cfg, cl, topics.MailboxEvents, 2, 11, `{"n":2}`, "registry", domain.CodeInvalid)
	entries, err := dlq.List(ctx, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Fatalf("%d dead letters", len(entries))
	}
	// Listed, they carry their DLQ offsets.
	lost, landed := entries[0], entries[1]

	const id = "0190a5e4-0000-7000-8000-0000000000bb"
	for _, e := range []dlq.Entry{lost, landed} {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO dlq_redrives (dlq_partition, dlq_offset, redrive_id, consumer, error_code,
    source_topic, source_partition, source_offset, actor, actor_source, again, state, scan_from, requested_at)
VALUES ($1, $2, $3, 'registry', 'invalid', $4, $5, $6, 'test-ops', '/ops', false, 'pending', 0, now())`,
			e.Partition, e.Offset, id, e.SourceTopic, e.SourcePartition, e.SourceOffset); err != nil {
			t.Fatal(err)
		}
	}
	// One of the two had been produced before the crash.
	mr := kgo.RecordPartitioner(kgo.ManualPartitioner())
	manual, err := kafka.NewProducer(cfg, mr)
	if err != nil {
		t.Fatal(err)
	}
	defer manual.Close()
	rec := dlq.RedriveRecord(landed, id)
	if err := manual.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}

	// A dry run completes nothing.
	if rep, err := dlq.Redrive(ctx, cfg, db.Pool, ops, dlq.Selection{Consumer: "registry", DryRun: true}); err != nil ||
		rep.Count(dlq.OutcomeCompleted) != 0 || rep.Count(dlq.OutcomeSkipped) != 2 {
		t.Fatalf("dry run: %+v, %v", rep, err)
	}
	if n := rowCount(t, db, `SELECT count(*) FROM dlq_redrives WHERE state = 'pending'`); n != 2 {
		t.Fatalf("a dry run completed %d pending rows", 2-n)
	}

	rep, err := dlq.Redrive(ctx, cfg, db.Pool, ops, dlq.Selection{Consumer: "registry"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Count(dlq.OutcomeCompleted) != 2 || rep.Count(dlq.OutcomeSkipped) != 2 || rep.Count(dlq.OutcomeRedriven) != 0 {
		t.Fatalf("report %+v; want both completed, then skipped as redriven", rep.Items)
	}
	copies := redrivenCopies(t, ctx, cfg, topics.MailboxEvents, 2, id)
	if len(copies) != 2 || copies[0] != rec.Offset {
		t.Fatalf("copies of redrive %s at %v; want the one produced before (%d) and one more", id, copies, rec.Offset)
	}
	for i, e := range []dlq.Entry{landed, lost} {
		var off int64
		if err := db.Pool.QueryRow(ctx, `SELECT redriven_offset FROM dlq_redrives WHERE state = 'done' AND dlq_offset = $1 AND redrive_id = $2`,
			e.Offset, id).Scan(&off); err != nil {
			t.Fatalf("dead letter %d: %v", e.Offset, err)
		}
		if off != copies[i] {
			t.Fatalf("dead letter %d recorded at %d, landed at %d", e.Offset, off, copies[i])
		}
	}
	// Nothing left to complete: a third run appends nothing.
	rep, err = dlq.Redrive(ctx, cfg, db.Pool, ops, dlq.Selection{Consumer: "registry"})
	if err != nil || rep.Count(dlq.OutcomeCompleted) != 0 || rep.Count(dlq.OutcomeSkipped) != 2 {
		t.Fatalf("third run: %+v, %v", rep, err)
	}
	if got := redrivenCopies(t, ctx, cfg, topics.MailboxEvents, 2, id); len(got) != 2 {
		t.Fatalf("copies after a third run: %v", got)
	}
}

// TestRedriveRefusesOutOfOrder: a dead letter whose key has a later
// record in its source partition (the mailbox added again after the
// removal that failed) is refused: redriven, it would be applied after it.
// Records of other keys, and records redriven for other consumers, do not
// count; --out-of-order redrives it all the same.
func TestRedriveRefusesOutOfOrder(t *testing.T) {
	t.Parallel()
	cfg, db, _ := redriveEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	manual, err := kafka.NewProducer(cfg, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer manual.Close()
	produce := func(key, value string, headers ...kgo.RecordHeader) *kgo.Record {
		r := &kgo.Record{Topic: cfg.Topic(topics.MailboxEvents), Partition: 3, Key: []byte(key), Value: []byte(value), Headers: headers}
		if err := manual.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	const a, b = "0190a5b2-4c5e-7b1a-9c3d-00000000f00a", "0190a5b2-4c5e-7b1a-9c3d-00000000f00b"
	removedA := produce(a, `{"mailbox_id":"`+a+`","reason":"x"}`)
	removedB := produce(b, `{"mailbox_id":"`+b+`","reason":"x"}`)
	produce(b, `{"n":"another consumer's redrive"}`, kgo.RecordHeader{Key: dlq.HeaderRedriveConsumer, Value: []byte("mailbox-state")})
	produce(a, `{"mailbox_id":"`+a+`","added":"again"}`)
	dl, err := kafka.NewProducer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	for _, r := range []*kgo.Record{removedA, removedB} {
		if err := dl.ProduceSync(ctx, dlq.NewRecord(cfg.Namespace, r, dlq.Failure{Consumer: "registry", Code: domain.CodeInvalid, Err: "x", Attempts: 3})).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	sel := dlq.Selection{Consumer: "registry"}
	rep, err := dlq.Redrive(ctx, cfg, db.Pool, ops, sel)
	if err != nil {
		t.Fatal(err)
	}
	outcome := map[string]dlq.Item{}
	for _, it := range rep.Items {
		outcome[string(it.Entry.Key)] = it
	}
	if it := outcome[a]; it.Outcome != dlq.OutcomeRefused || it.Code != domain.CodeOutOfOrder || !strings.Contains(it.Reason, "offset 3") {
		t.Fatalf("the removal of a, followed by a's re-add: %+v", it)
	}
	if it := outcome[b]; it.Outcome != dlq.OutcomeRedriven {
		t.Fatalf("the removal of b, followed by nothing b's consumer applies: %+v", it)
	}
	sel.OutOfOrder = true
	// On a pool of one connection: the redrive's statements run on the
	// connection holding its lock.
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	rep, err = dlq.Redrive(ctx, cfg, one, ops, sel)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Count(dlq.OutcomeRedriven) != 1 || rep.Count(dlq.OutcomeSkipped) != 1 {
		t.Fatalf("--out-of-order: %+v", rep.Items)
	}
}
