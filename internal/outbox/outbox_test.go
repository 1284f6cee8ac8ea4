package outbox_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/topics"
)

// topic is a catalog topic the outbox really publishes to: outbox rows
// hold catalog names only.
const topic = topics.SyncAudit

func setup(t *testing.T) (*pgxpool.Pool, []string) {
	t.Helper()
	pool, c := setupCluster(t)
	return pool, c.ListenAddrs()
}

// setupCluster is setup with the broker's handle, for its fault hooks
// and its Close.
func setupCluster(t *testing.T) (*pgxpool.Pool, *kfake.Cluster) {
	t.Helper()
	pool := pgtest.Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return pool, kafkatest.Fake(t, kfake.SeedTopics(2, topic))
}

func startRelay(t *testing.T, ctx context.Context, pool *pgxpool.Pool, brokers []string, opts ...outbox.Option) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = outbox.NewRelay(pool, kafka.Config{Brokers: brokers}, append([]outbox.Option{outbox.WithPollInterval(50 * time.Millisecond)}, opts...)...).Run(ctx)
	}()
	var once bool
	stop = func() {
		if once {
			return
		}
		once = true
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return stop
}

func add(t *testing.T, pool *pgxpool.Pool, commit bool, recs ...*kgo.Record) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := outbox.Add(ctx, tx, recs...); err != nil {
		t.Fatal(err)
	}
	if commit {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// consume reads n records of topic (both partitions) or fails after 10 s.
func consume(t *testing.T, brokers []string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kafka.NewClient(kafka.Config{Brokers: brokers}, kafka.KindReader, kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records", len(out), n)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

func pending(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM event_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitEmpty(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for pending(t, pool) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("outbox still holds %d records", pending(t, pool))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRelayPublishesCommittedInOrder(t *testing.T) {
	t.Parallel()
	pool, brokers := setup(t)
	startRelay(t, context.Background(), pool, brokers)

	// Rolled back: never published.
	add(t, pool, false, &kgo.Record{Topic: topic, Key: []byte("k0"), Value: []byte("rolled back")})
	var want []*kgo.Record
	for i := range 50 {
		r := &kgo.Record{Topic: topic, Key: []byte("k" + strconv.Itoa(i%3)), Value: []byte(fmt.Sprintf("v%02d", i)),
			Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(fmt.Sprint(i))}, {Key: "empty", Value: nil}}}
		if i == 49 {
			r.Value = nil // a tombstone
		}
		want = append(want, r)
	}
	for i := 0; i < len(want); i += 7 {
		add(t, pool, true, want[i:min(i+7, len(want))]...)
	}
	got := consume(t, brokers, len(want))
	waitEmpty(t, pool)
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	// Per key, the order of commit.
	last := map[string]int{}
	for _, r := range got {
		if string(r.Value) == "rolled back" {
			t.Fatal("a rolled back record was published")
		}
		i, _ := strconv.Atoi(string(r.Headers[0].Value))
		if prev, ok := last[string(r.Key)]; ok && i < prev {
			t.Fatalf("key %s: record %d after %d", r.Key, i, prev)
		}
		last[string(r.Key)] = i
		w := want[i]
		if string(r.Key) != string(w.Key) || string(r.Value) != string(w.Value) || (r.Value == nil) != (w.Value == nil) {
			t.Fatalf("record %d: got %q=%q, want %q=%q", i, r.Key, r.Value, w.Key, w.Value)
		}
		if len(r.Headers) != 2 || r.Headers[1].Key != "empty" || len(r.Headers[1].Value) != 0 {
			t.Fatalf("record %d: headers %v", i, r.Headers)
		}
	}
}

// Two relays on one outbox: one publishes, and when it stops the other
// takes over; nothing is lost.
func TestRelayStandbyTakesOver(t *testing.T) {
	t.Parallel()
	pool, brokers := setup(t)
	stopA := startRelay(t, context.Background(), pool, brokers)
	add(t, pool, true, &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("1")})
	consume(t, brokers, 1)
	// Published and deleted: a relay stopped between its commit to Kafka
	// and its delete leaves the batch to the next (at least once), which
	// is not what this test is about.
	waitEmpty(t, pool)
	startRelay(t, context.Background(), pool, brokers)
	stopA()
	add(t, pool, true, &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("2")})
	got := consume(t, brokers, 2)
	waitEmpty(t, pool)
	if len(got) != 2 || string(got[0].Value) != "1" || string(got[1].Value) != "2" {
		t.Fatalf("got %d records", len(got))
	}
}

// Records added while no relay runs wait; a relay started later publishes
// them.
func TestRelayPublishesBacklog(t *testing.T) {
	t.Parallel()
	pool, brokers := setup(t)
	for i := range 2500 {
		add(t, pool, true, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(strconv.Itoa(i))})
	}
	startRelay(t, context.Background(), pool, brokers, outbox.WithBatch(1000))
	got := consume(t, brokers, 2500)
	waitEmpty(t, pool)
	for i, r := range got {
		if string(r.Value) != strconv.Itoa(i) {
			t.Fatalf("record %d is %s", i, r.Value)
		}
	}
}

func TestAddRejectsRecordWithoutTopic(t *testing.T) {
	t.Parallel()
	pool := pgtest.Schema(t)
	ctx := context.Background()
	if err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.Add(ctx, tx, &kgo.Record{Value: []byte("x")})
	})
	if err == nil {
		t.Fatal("a record without a topic was accepted")
	}
}

// TestOutboxNamespace: rows hold catalog names, and a relay publishes them
// into the namespace of its Kafka configuration; a namespaced name (or any
// name outside the catalog) is refused when queued, so it can never be
// namespaced twice.
func TestOutboxNamespace(t *testing.T) {
	t.Parallel()
	pool := pgtest.Schema(t)
	ctx := context.Background()
	if err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	ns := topics.Namespace("staging")
	c := kafkatest.Fake(t, kfake.SeedTopics(2, topic, ns.Topic(topic)))
	for _, bad := range []string{ns.Topic(topic), "outbox-test", "mailplane.sync.audit.v2"} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return outbox.Add(ctx, tx, &kgo.Record{Topic: bad, Key: []byte("k"), Value: []byte("x")})
		})
		if err == nil || !strings.Contains(err.Error(), "not a catalog name") {
			t.Errorf("Add to %q: %v, want a refusal", bad, err)
		}
	}
	add(t, pool, true, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("in staging")})
	kcfg := kafka.Config{Brokers: c.ListenAddrs(), Namespace: ns}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = outbox.NewRelay(pool, kcfg, outbox.WithPollInterval(50*time.Millisecond)).Run(rctx)
	}()
	defer func() { cancel(); <-done }()
	waitEmpty(t, pool)
	ends := func(name string) int64 {
		adm, err := kafka.NewAdmin(kcfg)
		if err != nil {
			t.Fatal(err)
		}
		defer adm.Close()
		lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
		defer lcancel()
		listed, err := adm.ListEndOffsets(lctx, name)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		listed.Each(func(o kadm.ListedOffset) { n += o.Offset })
		return n
	}
	// One record and its transaction's commit marker.
	if got := ends(ns.Topic(topic)); got != 2 {
		t.Errorf("%s ends at %d, want the record and its commit marker (2)", ns.Topic(topic), got)
	}
	if got := ends(topic); got != 0 {
		t.Errorf("%s (outside the namespace) ends at %d, want 0", topic, got)
	}
}

// A publisher that stops between reading a batch and producing it loses
// its lease; a standby takes over and publishes; when the stopped one
// resumes, its late transaction is fenced: read_committed consumers see
// each record once, in order.
func TestRelayZombieFenced(t *testing.T) {
	t.Parallel()
	pool, brokers := setup(t)
	paused, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	startRelay(t, context.Background(), pool, brokers, outbox.WithLease(time.Second), outbox.WithOperationTimeout(300*time.Millisecond),
		outbox.WithBeforeProduce(func() {
			once.Do(func() {
				close(paused)
				<-resume // stopped: no statement, no heartbeat
			})
		}))
	add(t, pool, true, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("1")})
	<-paused
	// The standby takes over once the lease ran out, publishes 1, then 2.
	startRelay(t, context.Background(), pool, brokers)
	add(t, pool, true, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("2")})
	if got := consume(t, brokers, 2); string(got[0].Value) != "1" || string(got[1].Value) != "2" {
		t.Fatalf("the standby published %q, %q", got[0].Value, got[1].Value)
	}
	waitEmpty(t, pool)
	close(resume) // the zombie produces 1 again, late
	// Then something new, to read past whatever the zombie wrote.
	add(t, pool, true, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("3")})
	got := consume(t, brokers, 3)
	var vals []string
	for _, r := range got {
		vals = append(vals, string(r.Value))
	}
	if strings.Join(vals, ",") != "1,2,3" {
		t.Fatalf("read_committed saw %v, want 1,2,3", vals)
	}
}

// A relay told to stop while its transaction's records cannot reach the
// broker (gone mid-produce) stops at once, not after the records' delivery
// timeout: compose gives a role 10 s to stop. The rows stay in the outbox.
func TestRelayStopsWhileTheBrokerIsAway(t *testing.T) {
	t.Parallel()
	pool, c := setupCluster(t)
	brokers := c.ListenAddrs()
	var armed atomic.Bool
	gone := make(chan struct{})
	stop := startRelay(t, context.Background(), pool, brokers, outbox.WithBeforeProduce(func() {
		if armed.CompareAndSwap(true, false) {
			c.Close() // the broker goes away between reading and producing
			close(gone)
		}
	}))
	// A first record goes through: the producer knows the partitions, so
	// the next records are buffered for them and retried, not waiting
	// for metadata.
	add(t, pool, true, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("1")})
	consume(t, brokers, 1)
	waitEmpty(t, pool)
	armed.Store(true)
	add(t, pool, true, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("2")})
	<-gone
	time.Sleep(300 * time.Millisecond) // the produce is in flight, retrying
	start := time.Now()
	stop()
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the relay took %s to stop", took)
	}
	if n := pending(t, pool); n != 1 {
		t.Errorf("%d rows in the outbox after the failed publish, want 1", n)
	}
}
