package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/topics"
)

// produce writes decisions to the decision log (not transactionally: a
// read_committed reader sees them at once) and returns their records.
func produce(t testing.TB, kcfg kafka.Config, ds []domain.PlacementDecision) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kcfg.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for _, d := range ds {
		r, err := topics.EncodeDecision(topics.Decision{ID: uuid.Must(uuid.NewV7()).String(), Source: "test", Data: d,
			Cause: topics.Cause{ID: topics.CauseTick, Type: topics.CauseTick, Index: 0, Count: 1}})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, kafkatest.InNamespace(kcfg, recs...)...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return recs
}

func startProjector(t testing.TB, kcfg kafka.Config, pool *pgxpool.Pool, opts ...postgres.Option) (stop func()) {
	t.Helper()
	base := []postgres.Option{
		postgres.WithStandbyPoll(20 * time.Millisecond),
		postgres.WithRetry(projections.RetryPolicy{Backoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}),
	}
	p, err := postgres.NewProjector(kcfg, pool, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("Run did not return")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func waitCheckpoint(t testing.TB, pool *pgxpool.Pool, want int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ck, err := postgres.ReadCheckpoint(context.Background(), pool)
		if err != nil {
			t.Fatal(err)
		}
		if ck.NextOffset == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the projection stands at %d, want %d", ck.NextOffset, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func metric(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			return metricNumber(m)
		}
	}
	return 0
}

func metricNumber(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}

// TestPlacementProjectorTakesTurnsAndNeverSkips: two projectors on one
// schema: one leads, the other stands by and takes over when the first
// stops, going on exactly where it stood. A record that cannot be decoded
// is not skipped (the decision log is the engine's changelog): the
// projection stays before it, retrying, with the lag showing.
func TestPlacementProjectorTakesTurnsAndNeverSkips(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 4)
	kcfg.ClientID = "placement-projector-test"
	brokers := kcfg.Brokers
	db := newDB(t)

	st := placement.NewState(testConfig)
	g := newInputGen(99)
	now := t0
	var ds []domain.PlacementDecision
	for len(ds) < 300 {
		ds = append(ds, st.Apply(g.next(&now))...)
	}
	half := len(ds) / 2
	produce(t, kcfg, ds[:half])

	var mu sync.Mutex
	commits := map[int]int{}
	hook := func(i int) postgres.Option {
		return postgres.WithCommitted(func(c postgres.Commit) { mu.Lock(); commits[i] += c.Decisions; mu.Unlock() })
	}
	stop1 := startProjector(t, kcfg, db.Pool, hook(1))
	waitCheckpoint(t, db.Pool, int64(half))
	startProjector(t, kcfg, db.Pool, hook(2))
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	if commits[1] != half || commits[2] != 0 {
		t.Fatalf("before the hand-over: projector 1 applied %d, projector 2 %d; want %d and 0", commits[1], commits[2], half)
	}
	mu.Unlock()
	stop1()
	produce(t, kcfg, ds[half:])
	waitCheckpoint(t, db.Pool, int64(len(ds)))
	mu.Lock()
	if commits[1]+commits[2] != len(ds) || commits[2] != len(ds)-half {
		t.Fatalf("after the hand-over: projector 1 applied %d, projector 2 %d of %d", commits[1], commits[2], len(ds))
	}
	mu.Unlock()
	// The leader records its position in its Kafka group too, where lag
	// tools (Console, rpk group describe) look.
	adm := kadm.NewClient(client(t, brokers))
	deadline := time.Now().Add(15 * time.Second)
	for {
		offs, err := adm.FetchOffsets(context.Background(), kcfg.Group(projections.GroupName("placement")))
		if err == nil {
			if o, ok := offs.Lookup(kcfg.Topic(topics.PlacementDecisions), 0); ok && o.At == int64(len(ds)) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the group's committed offset is not %d: %v %v", len(ds), offs, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	st2, _ := restored(t, db.Pool)
	if a, b := toJSON(st2.Snapshot()), toJSON(st.Snapshot()); a != b {
		t.Fatalf("the projection restores to\n%s\nthe decider's state is\n%s", a, b)
	}

	// A record the projection cannot read, then a good one.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: kcfg.Topic(topics.PlacementDecisions), Key: []byte("x"), Value: []byte("{")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Minute)
	var more []domain.PlacementDecision
	for len(more) == 0 {
		more = st.Apply(g.next(&now))
	}
	produce(t, kcfg, more)
	reg := prometheus.NewRegistry()
	db2 := newDB(t)
	startProjector(t, kcfg, db2.Pool, postgres.WithRegisterer(reg))
	waitCheckpoint(t, db2.Pool, int64(len(ds)))
	deadline = time.Now().Add(10 * time.Second)
	for metric(t, reg, "mailplane_projector_retries_total", map[string]string{"projector": "placement", "kind": "permanent"}) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the projector did not retry the bad record")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ck, _ := postgres.ReadCheckpoint(context.Background(), db2.Pool); ck.NextOffset != int64(len(ds)) {
		t.Fatalf("the projection moved past the bad record to %d", ck.NextOffset)
	}
	if lag := metric(t, reg, "mailplane_consumer_lag_records", map[string]string{"consumer": "placement-projection", "partition": "0"}); lag < 1 {
		t.Errorf("lag %v with a record stuck", lag)
	}
	if lag := metric(t, reg, "mailplane_consumer_lag_seconds", map[string]string{"consumer": "placement-projection", "partition": "0"}); lag <= 0 {
		t.Errorf("%v s behind with a record stuck", lag)
	}
}

// TestPlacementProjectorCommitsWholeInputs: with polls smaller than an
// input's decisions, the projector still commits only at input
// boundaries, so the tables never show half an input.
func TestPlacementProjectorCommitsWholeInputs(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 4)
	kcfg.ClientID = "placement-projector-test"
	brokers := kcfg.Brokers
	db := newDB(t)
	st := placement.NewState(testConfig)
	g := newInputGen(7)
	now := t0
	var recs []*kgo.Record
	total := 0
	for total < 300 {
		ds := st.Apply(g.next(&now))
		for i, d := range ds {
			r, err := topics.EncodeDecision(topics.Decision{ID: uuid.Must(uuid.NewV7()).String(), Source: "test", Data: d,
				Cause: topics.Cause{ID: topics.CauseTick, Type: topics.CauseTick, Index: i, Count: len(ds)}})
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
		total += len(ds)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), kafkatest.InNamespace(kcfg, recs...)...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var bad []string
	commits := 0
	startProjector(t, kcfg, db.Pool, postgres.WithBatchSize(2),
		postgres.WithCommitted(func(c postgres.Commit) {
			mu.Lock()
			defer mu.Unlock()
			commits++
			if n := len(c.Records); n > 0 {
				if last := c.Records[n-1].Decision.Cause; last.Index+1 != last.Count {
					bad = append(bad, toJSON(last))
				}
				if first := c.Records[0].Decision.Cause; first.Index != 0 {
					bad = append(bad, toJSON(first))
				}
			}
		}))
	waitCheckpoint(t, db.Pool, int64(total))
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("commits cut inputs: %v", bad)
	}
	if err := postgres.CheckInvariants(context.Background(), db.Pool); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d decisions in %d commits", total, commits)
}

func client(t *testing.T, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}
