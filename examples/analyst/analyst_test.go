package analyst_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// python is Debian's interpreter, where python3-confluent-kafka and
// python3-jsonschema are installed (scripts/deps.sh).
const python = "/usr/bin/python3"

// pyRecord is one line read.py prints per record.
type pyRecord struct {
	Topic      string            `json:"topic"`
	Partition  int32             `json:"partition"`
	Offset     int64             `json:"offset"`
	Key        string            `json:"key"`
	ID         string            `json:"id"`
	Type       string            `json:"type"`
	Source     string            `json:"source"`
	DataSchema string            `json:"dataschema"`
	Extensions map[string]string `json:"extensions"`
	Data       map[string]any    `json:"data"`
	Valid      bool              `json:"valid"`
	Problems   []string          `json:"problems"`
	Summary    *struct {
		Records map[string]int `json:"records"`
		Invalid int            `json:"invalid"`
	} `json:"summary"`
}

// TestPythonAnalystReadsCommittedRecords: an analyst's non-Go client
// (read.py on Debian's python3-confluent-kafka, librdkafka underneath)
// reads the decision log, written by the placement engine in Kafka
// transactions, and the audit topic (sync.audit), written by a sync
// worker's fence through the outbox relay, also transactional, both in
// batches compressed as mailplane's producers compress them (gzip, the
// default; librdkafka decompresses). It decodes the CloudEvents
// headers, validates every value against the reader schema the API serves
// and sees exactly the committed records, in each partition's order:
// the records of a transaction the test aborts on both topics, which a
// read_uncommitted reader does see, never reach it, and the records
// committed after them do.
func TestPythonAnalystReadsCommittedRecords(t *testing.T) {
	t.Parallel()
	script := requirePython(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	kcfg := kafkatest.Config(t, 4)
	kcfg.ClientID = "analyst-test"
	brokers := kcfg.Brokers
	db := pgtest.New(t)
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}

	// The writers: the engine, and the relay of the sync fence's outbox.
	// A group and transactional id of its own: against a real broker
	// (MAILPLANE_TEST_BROKERS) another test's engine may have left theirs.
	eng, err := engine.New(kcfg, engine.WithSessionTimeout(kafkatest.SessionTimeout(time.Second)),
		engine.WithHeartbeatInterval(100*time.Millisecond),
		engine.WithGroup("analyst-test-engine-"+db.Schema), engine.WithTransactionalID("analyst-test-engine-"+db.Schema))
	if err != nil {
		t.Fatal(err)
	}
	stopEngine := run(t, ctx, "engine", eng.Run)
	stopRelay := run(t, ctx, "relay", outbox.NewRelay(db.Pool, kcfg, outbox.WithPollInterval(50*time.Millisecond)).Run)

	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	pub := producer.New(kc, producer.WithSource("/analyst-test"), producer.WithNamespace(kcfg.Namespace))
	fence := mailsync.NewFence(db.Pool, nil, 0)

	// Round one: two workers and a mailbox; the fence takes partitions.
	last := publish(t, ctx, pub,
		&domain.WorkerHeartbeat{WorkerID: id(1, 1), Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Address: "10.0.0.1:25"},
		&domain.WorkerHeartbeat{WorkerID: id(1, 2), Tier: domain.TierSharedPremium, Egress: domain.EgressColdSMTP, Address: "10.0.0.2:25"},
		mailboxAdded(1))
	if _, err := fence.Acquire(ctx, "analyst-worker-a", []int32{0, 1}); err != nil {
		t.Fatal(err)
	}
	waitDecided(t, ctx, kcfg, last)
	waitAudit(t, ctx, kcfg, 2)

	// An aborted transaction on both topics, of records read.py would
	// take for valid ones.
	aborted := abortTransaction(t, ctx, kcfg)

	// Round two, after it: more decisions and audit records.
	last = publish(t, ctx, pub, mailboxAdded(2), mailboxAdded(3))
	if _, err := fence.Acquire(ctx, "analyst-worker-b", []int32{0, 2, 3}); err != nil {
		t.Fatal(err)
	}
	waitDecided(t, ctx, kcfg, last)
	waitAudit(t, ctx, kcfg, 5)
	// Nothing more is written (an engine's tick could decide again).
	stopEngine()
	stopRelay()

	// What read_committed must see (mailplane's own reader), and proof
	// the aborted records are in the log.
	want := committed(t, ctx, kcfg)
	seeUncommitted(t, ctx, kcfg, aborted)

	apiURL, token := startAPI(t, pub)
	cmd := exec.CommandContext(ctx, python, script, "--brokers", strings.Join(brokers, ","), "--schemas", apiURL,
		"--group", "analytics-test", "--namespace", string(kcfg.Namespace), "--timeout", "60")
	cmd.Env = append(os.Environ(), "MAILPLANE_API_TOKEN="+token)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("read.py: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), out)
	}

	var got []pyRecord
	var summary *pyRecord
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r pyRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("read.py printed %q: %v", sc.Text(), err)
		}
		if r.Summary != nil {
			summary = &r
			continue
		}
		got = append(got, r)
	}
	if summary == nil || summary.Summary.Invalid != 0 {
		t.Fatalf("read.py summary %+v\n%s", summary, out)
	}

	perTopic := map[string][]string{}
	lastOffset := map[string]int64{}
	for _, r := range got {
		if slices.Contains(aborted, r.ID) {
			t.Errorf("read.py saw %s of an aborted transaction on %s", r.ID, r.Topic)
		}
		if !r.Valid || r.DataSchema != domain.SchemaURI(r.Type) || r.Key == "" || r.Data == nil {
			t.Errorf("record %s/%d/%d: %+v", r.Topic, r.Partition, r.Offset, r)
		}
		pk := fmt.Sprintf("%s/%d", r.Topic, r.Partition)
		if off, ok := lastOffset[pk]; ok && r.Offset <= off {
			t.Errorf("%s: offset %d after %d", pk, r.Offset, off)
		}
		lastOffset[pk] = r.Offset
		base, _ := kcfg.Namespace.Base(r.Topic)
		switch base {
		case topics.PlacementDecisions:
			if !strings.HasPrefix(r.Type, "mailplane.placement.") || r.Extensions["causeid"] == "" || r.Extensions["causecount"] == "" {
				t.Errorf("decision %s: type %s, extensions %v", r.ID, r.Type, r.Extensions)
			}
		case topics.SyncAudit:
			if r.Type != domain.TypeSyncOwnershipAcquired || !strings.HasPrefix(r.Source, "mailplane/sync/analyst-worker-") {
				t.Errorf("audit %s: type %s, source %s", r.ID, r.Type, r.Source)
			}
		default:
			t.Errorf("read.py read topic %s", r.Topic)
		}
		perTopic[base] = append(perTopic[base], r.ID)
	}
	for _, topic := range []string{topics.PlacementDecisions, topics.SyncAudit} {
		g, w := slices.Sorted(slices.Values(perTopic[topic])), slices.Sorted(slices.Values(want[topic]))
		if !slices.Equal(g, w) {
			t.Errorf("%s: read.py saw %d records %v, read_committed holds %d %v", topic, len(g), g, len(w), w)
		}
		if n := summary.Summary.Records[kcfg.Topic(topic)]; n != len(w) {
			t.Errorf("%s: summary counts %d, want %d", kcfg.Topic(topic), n, len(w))
		}
	}
	if n := len(want[topics.SyncAudit]); n != 5 {
		t.Errorf("%d audit records committed, want 5 (2 + 3 partitions taken)", n)
	}
	t.Logf("read.py read %d decisions and %d audit records; %d aborted records unseen",
		len(perTopic[topics.PlacementDecisions]), len(perTopic[topics.SyncAudit]), len(aborted))
}

// requirePython fails the test when the interpreter or its modules are
// missing, and returns the script's path.
func requirePython(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(python, "-c", "import confluent_kafka, jsonschema").CombinedOutput()
	if err != nil {
		t.Fatalf("%s with confluent_kafka and jsonschema is needed (apt-get install python3-confluent-kafka python3-jsonschema, or make deps): %v\n%s", python, err, out)
	}
	return "read.py"
}

// startAPI serves the API with its schema routes as the api role mounts
// them (any authenticated caller), and returns its URL and an analyst's
// token (scope audit:read).
func startAPI(t *testing.T, pub *producer.Client) (string, string) {
	t.Helper()
	const token = "analyst-test-token-0123456789abcdef"
	auth, err := access.FromBytes([]byte(access.Line("analyst", token, []string{domain.ScopeAuditRead}, "/analysts") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(pub, api.WithAuthenticator(auth),
		api.WithRoute("GET /v1/schemas", api.SchemaListHandler(), true),
		api.WithRoute("GET /v1/schemas/{type}", api.SchemaHandler(), true))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	run(t, context.Background(), "api", func(ctx context.Context) error { return srv.Serve(ctx, ln) })
	base := "http://" + ln.Addr().String()
	// Without the token the schemas are refused: read.py really sends it.
	resp, err := http.Get(base + "/v1/schemas/" + domain.TypeUserActive)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /v1/schemas/{type} without a token: %d", resp.StatusCode)
	}
	return base, token
}

// run runs fn until stop is called or the test ends.
func run(t *testing.T, ctx context.Context, name string, fn func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("%s: %v", name, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("%s did not stop within 30s", name)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func id(kind, n int) string { return fmt.Sprintf("0000000%d-0000-4000-8000-%012x", kind, n) }

func mailboxAdded(n int) *domain.MailboxAdded {
	return &domain.MailboxAdded{
		MailboxID: id(2, n), OrgID: id(3, 1), UserID: id(4, 1), Address: fmt.Sprintf("box%d@example.com", n),
		Provider:          domain.ProviderSMTPIMAP,
		IMAP:              domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit, Username: fmt.Sprintf("box%d@example.com", n)},
		SealedCredentials: &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAECAwQFBgcICQoL", Ciphertext: "c2VhbGVk"},
	}
}

// publish publishes ds as events and returns the last one's id.
func publish(t *testing.T, ctx context.Context, pub *producer.Client, ds ...domain.Data) string {
	t.Helper()
	evs := make([]domain.Event, len(ds))
	for i, d := range ds {
		evs[i] = pub.NewEvent(d)
	}
	if _, err := pub.Publish(ctx, evs...); err != nil {
		t.Fatalf("publish: %v", err)
	}
	return evs[len(evs)-1].ID
}

// gzipCodec is gzip's number in a record batch's attributes.
const gzipCodec = 1

// committed reads both topics read_committed: record ids by topic, each
// checked to have come in a gzip batch of a transaction.
func committed(t *testing.T, ctx context.Context, kcfg kafka.Config) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	_, err := kafka.ReadToEnd(ctx, kcfg, kafka.ReadSpec{Topics: kcfg.Namespace.Topics(topics.PlacementDecisions, topics.SyncAudit), ClientID: "committed"},
		func(r *kgo.Record) error {
			id, _ := topics.Header(r, topics.HeaderID)
			base, _ := kcfg.Namespace.Base(r.Topic)
			out[base] = append(out[base], id)
			if c := r.Attrs.CompressionType(); c != gzipCodec {
				t.Errorf("%s: record %s in a batch compressed with codec %d, not gzip: read.py would not be reading gzip", r.Topic, id, c)
			}
			if !r.Attrs.IsTransactional() {
				t.Errorf("%s: record %s was not written in a transaction", r.Topic, id)
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// waitDecided waits until the decision log holds every decision made on
// the input event eventID.
func waitDecided(t *testing.T, ctx context.Context, kcfg kafka.Config, eventID string) {
	t.Helper()
	waitFor(t, ctx, "the decisions on "+eventID, func() bool {
		n, count := 0, -1
		_, err := kafka.ReadToEnd(ctx, kcfg, kafka.ReadSpec{Topics: []string{kcfg.Topic(topics.PlacementDecisions)}, ClientID: "wait"},
			func(r *kgo.Record) error {
				if c, _ := topics.Header(r, topics.HeaderCauseID); c == eventID {
					n++
					if c, err := strconv.Atoi(headerOf(r, topics.HeaderCauseCount)); err == nil {
						count = c
					}
				}
				return nil
			})
		return err == nil && n > 0 && n == count
	})
}

// waitAudit waits until the audit topic holds n committed records.
func waitAudit(t *testing.T, ctx context.Context, kcfg kafka.Config, n int) {
	t.Helper()
	waitFor(t, ctx, fmt.Sprintf("%d audit records", n), func() bool {
		got := 0
		_, err := kafka.ReadToEnd(ctx, kcfg, kafka.ReadSpec{Topics: []string{kcfg.Topic(topics.SyncAudit)}, ClientID: "wait"},
			func(*kgo.Record) error { got++; return nil })
		return err == nil && got >= n
	})
}

func headerOf(r *kgo.Record, key string) string {
	v, _ := topics.Header(r, key)
	return v
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// abortTransaction produces, in one transaction it then aborts, a copy
// of the newest committed record of each topic under a fresh id, and
// returns the ids.
func abortTransaction(t *testing.T, ctx context.Context, kcfg kafka.Config) []string {
	t.Helper()
	newest := map[string]*kgo.Record{}
	_, err := kafka.ReadToEnd(ctx, kcfg, kafka.ReadSpec{Topics: kcfg.Namespace.Topics(topics.PlacementDecisions, topics.SyncAudit), ClientID: "newest"},
		func(r *kgo.Record) error { newest[r.Topic] = r; return nil })
	if err != nil || len(newest) != 2 {
		t.Fatalf("newest records: %v (%d topics)", err, len(newest))
	}
	cl, err := kafka.NewProducer(kcfg, kgo.TransactionalID(kcfg.TransactionalID("analyst-test-aborted")))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, topic := range kcfg.Namespace.Topics(topics.PlacementDecisions, topics.SyncAudit) {
		src := newest[topic]
		r := &kgo.Record{Topic: topic, Partition: src.Partition, Key: src.Key, Value: src.Value}
		fresh := domain.NewEventID()
		for _, h := range src.Headers {
			if h.Key == topics.HeaderID {
				h.Value = []byte(fresh)
			}
			r.Headers = append(r.Headers, h)
		}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, fresh)
	}
	if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	return ids
}

// seeUncommitted reads both topics read_uncommitted until it has seen
// every record of ids.
func seeUncommitted(t *testing.T, ctx context.Context, kcfg kafka.Config, ids []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kcfg.Brokers...), kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.ConsumeTopics(kcfg.Namespace.Topics(topics.PlacementDecisions, topics.SyncAudit)...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	missing := slices.Clone(ids)
	for len(missing) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("a read_uncommitted reader did not see the aborted records %v: the test would prove nothing", missing)
		}
		fs.EachRecord(func(r *kgo.Record) {
			id, _ := topics.Header(r, topics.HeaderID)
			missing = slices.DeleteFunc(missing, func(m string) bool { return m == id })
		})
	}
}
