package consume_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/consume"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/sla"
)

const topic = "consume-test"

// cluster starts a kfake with topic in parts partitions.
func cluster(t *testing.T, parts int32) kafka.Config {
	t.Helper()
	c := kafkatest.Fake(t, kfake.SeedTopics(parts, topic, topic+"-out"))
	return kafka.Config{Brokers: c.ListenAddrs(), ClientID: t.Name(), Logger: testLogger(t)}
}

func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("MAILPLANE_TEST_LOG") == "debug" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: level}))
}

// produce writes values to partition p of topic.
func produce(t *testing.T, kcfg kafka.Config, p int32, values ...string) {
	t.Helper()
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		recs[i] = &kgo.Record{Topic: topic, Partition: p, Value: []byte(v)}
	}
	produceRecords(t, kcfg, recs...)
}

func produceRecords(t *testing.T, kcfg kafka.Config, recs ...*kgo.Record) {
	t.Helper()
	prod, err := kafka.NewProducer(kcfg, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond until it holds, failing t after a long bound.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// run runs c until the test ends (or stop is called); stop waits for Run
// and returns its error.
func run(t *testing.T, c *consume.Consumer) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() { cancel(); err = <-errc })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// seen collects what handlers were given.
type seen struct {
	mu     sync.Mutex
	values []string
	calls  int
}

func (s *seen) handler(_ context.Context, b *consume.Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	for _, r := range b.Records {
		s.values = append(s.values, string(r.Value))
	}
	return nil
}

func (s *seen) has(vs ...string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range vs {
		if !slices.Contains(s.values, v) {
			return false
		}
	}
	return true
}

func (s *seen) count() (values, calls int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.values), s.calls
}

func group(name string) kafka.GroupConfig {
	return kafka.GroupConfig{Group: name, Topics: []string{topic},
		SessionTimeout: kafkatest.SessionTimeout(time.Second), HeartbeatInterval: 100 * time.Millisecond}
}

// partitionsLog records partition callbacks.
type partitionsLog struct {
	mu                      sync.Mutex
	assigned, revoked, lost map[int32]int
}

func newPartitionsLog() *partitionsLog {
	return &partitionsLog{assigned: map[int32]int{}, revoked: map[int32]int{}, lost: map[int32]int{}}
}

func (l *partitionsLog) options() []consume.Option {
	rec := func(into map[int32]int) consume.PartitionsFunc {
		return func(_ context.Context, _ *consume.Consumer, m map[string][]int32) {
			l.mu.Lock()
			defer l.mu.Unlock()
			for _, p := range m[topic] {
				into[p]++
			}
		}
	}
	return []consume.Option{consume.OnAssigned(rec(l.assigned)), consume.OnRevoked(rec(l.revoked)), consume.OnLost(rec(l.lost))}
}

func (l *partitionsLog) counts() (assigned, revoked, lost int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.assigned), len(l.revoked), len(l.lost)
}

// TestGroupAssignmentAndRevocation: a member alone gets every partition;
// a second member joining takes some, revoked from the first (whose meter
// forgets them); the records of every partition are then handled by one
// of them.
func TestGroupAssignmentAndRevocation(t *testing.T) {
	t.Parallel()
	kcfg := cluster(t, 4)
	var s1, s2 seen
	l1, l2 := newPartitionsLog(), newPartitionsLog()
	reg1 := prometheus.NewRegistry()
	opts1 := append(l1.options(), consume.Metered(sla.NewMeter(reg1, sla.Registry)), consume.WithRegisterer(reg1))
	c1, err := consume.New(kcfg, "first", consume.Group(group("g")), s1.handler, opts1...)
	if err != nil {
		t.Fatal(err)
	}
	run(t, c1)
	eventually(t, "the first member assigned all four partitions", func() bool { a, _, _ := l1.counts(); return a == 4 })
	for p := range int32(4) {
		produce(t, kcfg, p, "v"+strconv.Itoa(int(p)))
	}
	eventually(t, "the first member handled every partition", func() bool { return s1.has("v0", "v1", "v2", "v3") })
	if n := lagSeries(t, reg1); n != 4 {
		t.Fatalf("partitions metered by the first member alone: %d", n)
	}
	c2, err := consume.New(kcfg, "second", consume.Group(group("g")), s2.handler, l2.options()...)
	if err != nil {
		t.Fatal(err)
	}
	run(t, c2)
	eventually(t, "the second member assigned partitions revoked from the first", func() bool {
		a2, _, _ := l2.counts()
		_, r1, _ := l1.counts()
		return a2 > 0 && r1 == a2
	})
	_, r1, _ := l1.counts()
	if n := lagSeries(t, reg1); n != 4-r1 {
		t.Fatalf("partitions metered by the first member after %d were revoked: %d", r1, n)
	}
	for p := range int32(4) {
		produce(t, kcfg, p, "w"+strconv.Itoa(int(p)))
	}
	// Nothing was committed (a group member of the runtime commits
	// where its effect is): the second member reads its partitions from
	// the start, the v records again.
	eventually(t, "every partition's new record handled", func() bool {
		for p := range 4 {
			w := "w" + strconv.Itoa(p)
			if !s1.has(w) && !s2.has(w) {
				return false
			}
		}
		n2, _ := s2.count()
		return n2 > 0
	})
	if _, _, lost := l1.counts(); lost != 0 {
		t.Fatalf("partitions lost in a clean rebalance: %d", lost)
	}
}

// lagSeries counts the partitions a registry's meters report.
func lagSeries(t *testing.T, reg prometheus.Gatherer) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "mailplane_consumer_lag_records" {
			return len(mf.GetMetric())
		}
	}
	return 0
}

// TestShutdownLeavesTheGroup: Run stopped by its context runs BeforeLeave,
// leaves the group at once (the group is empty, no session to expire) and
// returns nil.
func TestShutdownLeavesTheGroup(t *testing.T) {
	t.Parallel()
	kcfg := cluster(t, 2)
	l := newPartitionsLog()
	var before sync.WaitGroup
	before.Add(1)
	opts := append(l.options(), consume.BeforeLeave(before.Done), consume.LeaveWithin(10*time.Second))
	var s seen
	c, err := consume.New(kcfg, "leaver", consume.Group(group("leave")), s.handler, opts...)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	eventually(t, "assignment", func() bool { a, _, _ := l.counts(); return a == 2 })
	adm, err := kafka.NewAdmin(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	members := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		gs, err := adm.DescribeGroups(ctx, "leave")
		if err != nil {
			return -1
		}
		return len(gs["leave"].Members)
	}
	if n := members(); n != 1 {
		t.Fatalf("members before the stop: %d", n)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run after its context ended: %v", err)
	}
	before.Wait()
	if _, r, _ := l.counts(); r != 2 {
		t.Fatalf("partitions revoked in the leave: %d", r)
	}
	// The session is far from expiring: an empty group means the member
	// left.
	if n := members(); n != 0 {
		t.Fatalf("members after the stop: %d", n)
	}
}

// TestPauseResume: a paused partition is not fetched while the others
// flow; resumed, its records arrive.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	kcfg := cluster(t, 2)
	var s seen
	c, err := consume.New(kcfg, "pauser", consume.Partitions(map[string]map[int32]kgo.Offset{
		topic: {0: kgo.NewOffset().AtStart(), 1: kgo.NewOffset().AtStart()},
	}), s.handler)
	if err != nil {
		t.Fatal(err)
	}
	c.Pause(map[string][]int32{topic: {0}})
	run(t, c)
	produce(t, kcfg, 0, "paused")
	produce(t, kcfg, 1, "flowing-1")
	eventually(t, "the unpaused partition's record", func() bool { return s.has("flowing-1") })
	produce(t, kcfg, 1, "flowing-2")
	eventually(t, "the unpaused partition's second record", func() bool { return s.has("flowing-2") })
	if s.has("paused") {
		t.Fatal("a paused partition was fetched")
	}
	c.Resume(map[string][]int32{topic: {0}})
	eventually(t, "the resumed partition's record", func() bool { return s.has("paused") })
}

// TestWake: a consumer whose poll waits without bound runs its handler
// when woken, with no records; a Wake between polls (here, from the
// handler) makes the next poll return at once.
func TestWake(t *testing.T) {
	t.Parallel()
	kcfg := cluster(t, 1)
	reg := prometheus.NewRegistry()
	calls := make(chan int, 16)
	n := 0
	c, err := consume.New(kcfg, "sleeper", consume.Topics(kgo.NewOffset().AtEnd(), topic), func(_ context.Context, b *consume.Batch) error {
		n++
		if len(b.Records) != 0 {
			return fmt.Errorf("records in an empty topic: %d", len(b.Records))
		}
		if n == 1 {
			b.Consumer().Wake()
		}
		calls <- n
		return nil
	}, consume.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	eventually(t, "the first poll", func() bool { return counter(t, reg, "mailplane_consume_polls_total") >= 1 })
	c.Wake()
	if got := <-calls; got != 1 {
		t.Fatalf("first call %d", got)
	}
	if got := <-calls; got != 2 {
		t.Fatalf("second call %d", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 0 {
		t.Fatalf("the handler ran again with nothing to wake it: %d calls", 2+len(calls))
	}
}

// counter returns the value of a counter of the runtime (every consumer
// of a test has its own registry).
func counter(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

// lag returns the records behind the meter reports for a partition, and
// whether it reports the partition at all.
func lag(t *testing.T, reg prometheus.Gatherer, partition int32) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "mailplane_consumer_lag_records" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" && l.GetValue() == strconv.Itoa(int(partition)) {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// TestMeteredLag: while a batch is handled its partition is held at the
// batch's first record (the whole batch behind); once handled, at the
// end (nothing behind); revoked partitions are forgotten, and every one
// when Run ends.
func TestMeteredLag(t *testing.T) {
	t.Parallel()
	kcfg := cluster(t, 1)
	produce(t, kcfg, 0, "a", "b", "c")
	reg := prometheus.NewRegistry()
	meter := sla.NewMeter(reg, sla.Registry)
	entered, release := make(chan struct{}), make(chan struct{})
	first := true
	c, err := consume.New(kcfg, string(sla.Registry), consume.Group(group("lag")), func(_ context.Context, b *consume.Batch) error {
		if first && len(b.Records) > 0 {
			first = false
			close(entered)
			<-release
		}
		return nil
	}, consume.Metered(meter), consume.WithRegisterer(reg), consume.WithMaxRecords(2))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	<-entered
	if v, ok := lag(t, reg, 0); !ok || v != 3 {
		t.Fatalf("lag while the first batch is handled: %v (reported %v), want 3", v, ok)
	}
	close(release)
	eventually(t, "the partition caught up", func() bool { v, ok := lag(t, reg, 0); return ok && v == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if v, ok := lag(t, reg, 0); ok {
		t.Fatalf("a partition still reported after Run ended: %v", v)
	}
}

// TestSkipRedriven: records redriven from the DLQ for another consumer
// never reach the handler; those redriven for this one do, as do plain
// records; the skipped are counted.
func TestSkipRedriven(t *testing.T) {
	t.Parallel()
	kcfg := cluster(t, 1)
	redriven := func(value, consumer string) *kgo.Record {
		orig := &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(value)}
		r := dlq.RedriveRecord(dlq.Parse(dlq.NewRecord("", orig, dlq.Failure{Consumer: consumer, Code: domain.CodeInvalid, Err: "x", Attempts: 3})), domain.NewEventID())
		r.Topic, r.Partition = topic, 0
		return r
	}
	produceRecords(t, kcfg, redriven("for-other", string(sla.Health)), redriven("for-me", string(sla.Registry)),
		&kgo.Record{Topic: topic, Partition: 0, Value: []byte("plain")})
	reg := prometheus.NewRegistry()
	var s seen
	c, err := consume.New(kcfg, "skipper", consume.Topics(kgo.NewOffset().AtStart(), topic), s.handler,
		consume.SkipRedriven(string(sla.Registry)), consume.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	eventually(t, "the plain record", func() bool { return s.has("plain", "for-me") })
	if s.has("for-other") {
		t.Fatal("a record redriven for another consumer was handled")
	}
	if n := counter(t, reg, "mailplane_consume_redriven_skipped_total"); n != 1 {
		t.Fatalf("skipped counted %v, want 1", n)
	}
}

// TestRetryThenFail: with Retry the handler is called again with the
// same batch until it succeeds; without it, a handler's error ends Run
// with that error (the client left).
func TestRetryThenFail(t *testing.T) {
	t.Parallel()
	kcfg := cluster(t, 1)
	produce(t, kcfg, 0, "x")
	var mu sync.Mutex
	attempts := 0
	flaky := func(_ context.Context, b *consume.Batch) error {
		if len(b.Records) == 0 {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		attempts++
		if attempts < 3 {
			return errors.New("transient")
		}
		return nil
	}
	src := consume.Topics(kgo.NewOffset().AtStart(), topic)
	c, err := consume.New(kcfg, "retrier", src, flaky, consume.Retry(backoff.Policy{Floor: time.Millisecond, Cap: 5 * time.Millisecond}, nil))
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	eventually(t, "three attempts", func() bool { mu.Lock(); defer mu.Unlock(); return attempts == 3 })

	boom := errors.New("boom")
	c2, err := consume.New(kcfg, "failer", src, func(_ context.Context, b *consume.Batch) error {
		if len(b.Records) > 0 {
			return boom
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.Run(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Run after a handler failed: %v", err)
	}
}
