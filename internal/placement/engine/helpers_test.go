package engine

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// Test ids are canonical UUIDs whose first group names the kind.
func workerID(i int) string  { return fmt.Sprintf("00000001-0000-4000-8000-%012x", i) }
func mailboxID(i int) string { return fmt.Sprintf("00000002-0000-4000-8000-%012x", i) }
func orgID(i int) string     { return fmt.Sprintf("00000003-0000-4000-8000-%012x", i) }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// testBroker is a broker for one test: an in-process kfake cluster whose
// group sessions may be short, or the real broker named by
// MAILPLANE_TEST_BROKERS (sessions then use the broker's 6 s minimum).
type testBroker struct {
	brokers []string
	ns      topics.Namespace // the test's (kafkatest.Config)
	session time.Duration
	hb      time.Duration
	cluster *kfake.Cluster // nil on a real broker
	tr      *Transcript    // what every engine of the test committed (verifyLog)
}

func newTestBroker(t testing.TB) testBroker {
	t.Helper()
	if kafkatest.Real() {
		kcfg := kafkatest.Config(t, 4)
		return testBroker{brokers: kcfg.Brokers, ns: kcfg.Namespace, session: 6 * time.Second, hb: 500 * time.Millisecond, tr: &Transcript{}}
	}
	c := kafkatest.Fake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	brokers := c.ListenAddrs()
	kc, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := kafkatest.Namespace(t)
	if _, err := topics.Apply(ctx, kc, topics.Catalog(topics.Config{StatePartitions: 4, Namespace: ns})); err != nil {
		t.Fatal(err)
	}
	tb := testBroker{brokers: brokers, ns: ns, session: time.Second, hb: 100 * time.Millisecond, cluster: c, tr: &Transcript{}}
	// Measuring failover with other group timings (e.g. the defaults, 6s
	// and 500ms): MAILPLANE_PLACEMENT_TEST_SESSION and _HEARTBEAT.
	if d, err := time.ParseDuration(os.Getenv("MAILPLANE_PLACEMENT_TEST_SESSION")); err == nil {
		tb.session = d
	}
	if d, err := time.ParseDuration(os.Getenv("MAILPLANE_PLACEMENT_TEST_HEARTBEAT")); err == nil {
		tb.hb = d
	}
	return tb
}

func (b testBroker) kcfg(id string) kafka.Config {
	return kafka.Config{Brokers: b.brokers, ClientID: id, Namespace: b.ns}
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock(t time.Time) *fakeClock { return &fakeClock{now: t} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// startEngine runs an engine until the test ends (or stop is called).
func startEngine(t testing.TB, b testBroker, opts ...Option) (e *Engine, stop func()) {
	t.Helper()
	base := []Option{
		WithSessionTimeout(b.session), WithHeartbeatInterval(b.hb),
		WithLogger(mailplanetest.Logger(t)), WithTranscript(b.tr),
	}
	e, err := New(b.kcfg("engine-"+t.Name()), append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
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
				t.Errorf("Run did not return within 30s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return e, stop
}

// publisher publishes domain events with chosen times and remembers them.
// The time is the producer's clock at the publish, so it is both the
// events' time and their record timestamp, which the engine decides on.
type publisher struct {
	t   testing.TB
	c   *producer.Client
	mu  sync.Mutex
	at  time.Time // the producer's clock during a publish; under pubMu
	all map[string]domain.Event

	pubMu sync.Mutex // one publish at a time: each sets the clock
}

func newPublisher(t testing.TB, b testBroker) *publisher {
	t.Helper()
	// The producer's clock is the test's (record timestamps months behind
	// the wall clock): no delivery timeout, which kgo reads from them.
	kc, err := kafka.NewProducer(b.kcfg("publisher"), kgo.RecordDeliveryTimeout(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	p := &publisher{t: t, all: map[string]domain.Event{}}
	p.c = producer.New(kc, producer.WithSource("test"), producer.WithClock(func() time.Time { return p.at }), producer.WithNamespace(b.ns))
	return p
}

func (p *publisher) event(at time.Time, d domain.Data) domain.Event {
	return domain.Event{ID: domain.NewEventID(), Type: d.EventType(), Source: "test", Time: at, Subject: d.AggregateID(), Data: d}
}

// publish publishes events (all at time at) and fails the test on error.
func (p *publisher) publish(at time.Time, ds ...domain.Data) []domain.Event {
	p.t.Helper()
	evs := make([]domain.Event, len(ds))
	for i, d := range ds {
		evs[i] = p.event(at, d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.publishAt(ctx, at, evs...); err != nil {
		p.t.Fatalf("publish: %v", err)
	}
	p.mu.Lock()
	for _, ev := range evs {
		p.all[ev.ID] = ev
	}
	p.mu.Unlock()
	return evs
}

// publishAt publishes evs with the producer's clock at at.
func (p *publisher) publishAt(ctx context.Context, at time.Time, evs ...domain.Event) error {
	p.pubMu.Lock()
	defer p.pubMu.Unlock()
	p.at = at
	_, err := p.c.Publish(ctx, evs...)
	return err
}

func (p *publisher) events() map[string]domain.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]domain.Event, len(p.all))
	for k, v := range p.all {
		out[k] = v
	}
	return out
}

func heartbeat(i int, tier domain.Tier, egress domain.Egress) *domain.WorkerHeartbeat {
	return &domain.WorkerHeartbeat{WorkerID: workerID(i), Tier: tier, Egress: egress, Address: fmt.Sprintf("10.0.0.%d:25", i)}
}

func plan(org int, p domain.Plan, dedicated int) *domain.OrgPlanChanged {
	return &domain.OrgPlanChanged{OrgID: orgID(org), Plan: p, DedicatedWorkers: dedicated, Paid: p != domain.PlanFree, Source: "evt_test"}
}

func mailboxAdded(mb, org int, p domain.Provider) *domain.MailboxAdded {
	return &domain.MailboxAdded{
		MailboxID: mailboxID(mb), OrgID: orgID(org), UserID: orgID(org),
		Address: fmt.Sprintf("box%d@example.com", mb), Provider: p,
		IMAP:              domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit, Username: fmt.Sprintf("box%d", mb)},
		SealedCredentials: &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAAAAAAAAAAAAAA", Ciphertext: "c2VhbGVk"},
	}
}

// logEntry is one decision read back from the log.
type logEntry struct {
	offset int64
	d      topics.Decision
}

func readLog(t testing.TB, b testBroker) []logEntry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []logEntry
	if _, err := ReadDecisions(ctx, b.kcfg("log-reader"), 0, func(off int64, d topics.Decision) error {
		out = append(out, logEntry{off, d})
		return nil
	}); err != nil {
		t.Fatalf("reading the decision log: %v", err)
	}
	return out
}

// waitLog polls the decision log until cond holds.
func waitLog(t testing.TB, b testBroker, timeout time.Duration, what string, cond func([]logEntry) bool) []logEntry {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		l := readLog(t, b)
		if cond(l) {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (log has %d decisions)", timeout, what, len(l))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// causeOf returns, for each mailbox.added event id in the log, whether it
// was decided.
func decidedCauses(l []logEntry) map[string]bool {
	out := map[string]bool{}
	for _, e := range l {
		out[e.d.Cause.ID] = true
	}
	return out
}

func hasAll(l []logEntry, evs []domain.Event) bool {
	got := decidedCauses(l)
	for _, ev := range evs {
		if !got[ev.ID] {
			return false
		}
	}
	return true
}

func count[T domain.PlacementDecision](l []logEntry) int {
	n := 0
	for _, e := range l {
		if _, ok := e.d.Data.(T); ok {
			n++
		}
	}
	return n
}

// checkLog checks what the decision log alone shows (CheckLog): engines
// in other processes leave no transcript.
func checkLog(t testing.TB, l []logEntry, events map[string]domain.Event, cfg placement.Config) *placement.State {
	t.Helper()
	st, err := CheckLog(cfg, events, loggedDecisions(l))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func loggedDecisions(l []logEntry) []LoggedDecision {
	out := make([]LoggedDecision, len(l))
	for i, en := range l {
		out[i] = LoggedDecision{Offset: en.offset, Decision: en.d}
	}
	return out
}

// verifyLog checks the decision log against the pure decider fed what the
// test's engines committed (Transcript.Verify: the decisions, their
// groups, causes and derived ids, nothing decided twice, the fold equal to
// the decider's state). It returns the decider's state.
func verifyLog(t testing.TB, b testBroker, l []logEntry, events map[string]domain.Event, cfg placement.Config) *placement.State {
	t.Helper()
	// The commit hook runs after the commit returns.
	for deadline := time.Now().Add(10 * time.Second); b.tr.Decisions() < len(l) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	st, err := b.tr.Verify(cfg, events, loggedDecisions(l))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func decisionsJSON(t testing.TB, ds []domain.PlacementDecision) string {
	var s string
	for _, d := range ds {
		s += "\n  " + domain.ShortType(d.EventType()) + " " + string(mailplanetest.MustJSON(t, d))
	}
	return s
}

func groupJSON(t testing.TB, l []logEntry) string {
	ds := make([]domain.PlacementDecision, len(l))
	for i, e := range l {
		ds[i] = e.d.Data
	}
	return decisionsJSON(t, ds)
}
