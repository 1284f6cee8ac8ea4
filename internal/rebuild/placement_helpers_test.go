package rebuild

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

func workerID(i int) string  { return fmt.Sprintf("00000001-0000-4000-8000-%012x", i) }
func mailboxID(i int) string { return fmt.Sprintf("00000002-0000-4000-8000-%012x", i) }
func orgID(i int) string     { return fmt.Sprintf("00000003-0000-4000-8000-%012x", i) }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// placementConfig is every engine's decider configuration in these tests:
// short liveness and dwell, so workers die and bands recover within a
// scenario's clock; a retention short enough that a scenario's day jumps
// forget dead workers.
var placementConfig = placement.Config{HeartbeatInterval: 20 * time.Second, BandDwell: 2 * time.Minute, WorkerRetention: 36 * time.Hour}

// clock is the engine's settable clock: ticks carry its time.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	if t.After(c.now) {
		c.now = t
	}
	c.mu.Unlock()
}

// env is one test's broker, schema, publisher and clock.
type env struct {
	t      testing.TB
	kcfg   kafka.Config
	db     *pgtest.DB
	pub    *producer.Client
	clock  *clock
	cfg    placement.Config // the engines' and the verifier's decider configuration
	mu     sync.Mutex
	events map[string]domain.Event
	// transcript: what the env's engines committed, which verifyLog
	// feeds the decider.
	transcript engine.Transcript
	last       *engine.Engine // the engine started last

	pubMu sync.Mutex // one publish at a time: each sets the producer's clock
	pubAt time.Time  // the producer's clock during a publish (zero: the wall clock)
}

// pubNow is the producer's clock: the record timestamps the engine decides at.
func (e *env) pubNow() time.Time {
	if e.pubAt.IsZero() {
		return time.Now()
	}
	return e.pubAt
}

func newEnv(t testing.TB) *env {
	t.Helper()
	kcfg := kafkatest.Config(t, 4)
	kcfg.ClientID = "replay-test"
	e := &env{t: t, kcfg: kcfg, db: pgtest.New(t),
		clock: &clock{now: t0}, cfg: placementConfig, events: map[string]domain.Event{}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := migrations.Apply(ctx, e.db.Pool); err != nil {
		t.Fatal(err)
	}
	// The producer's clock is the test's (record timestamps months behind
	// the wall clock): no delivery timeout, which kgo reads from them.
	kc, err := kafka.NewProducer(e.kcfg, kgo.RecordDeliveryTimeout(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	e.pub = producer.New(kc, producer.WithSource("test"), producer.WithClock(e.pubNow), producer.WithNamespace(e.kcfg.Namespace))
	return e
}

// runUntil runs fn until the returned stop (also a cleanup).
func runUntil(t testing.TB, what string, fn func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: %v", what, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("%s did not stop within 30s", what)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// engine starts a placement engine on the test's clock.
func (e *env) engine(opts ...engine.Option) (stop func()) {
	e.t.Helper()
	base := []engine.Option{
		engine.WithSessionTimeout(kafkatest.SessionTimeout(time.Second)), engine.WithHeartbeatInterval(100 * time.Millisecond),
		engine.WithClock(e.clock.Now), engine.WithTickInterval(20 * time.Millisecond),
		engine.WithPlacementConfig(e.cfg), engine.WithLogger(mailplanetest.Logger(e.t)),
		engine.WithTranscript(&e.transcript),
	}
	eng, err := engine.New(e.kcfg, append(base, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.mu.Lock()
	e.last = eng
	e.mu.Unlock()
	return runUntil(e.t, "engine", eng.Run)
}

// projector starts the live placement projector.
func (e *env) projector(pool *pgxpool.Pool) (stop func()) {
	e.t.Helper()
	p, err := postgres.NewProjector(e.kcfg, pool, postgres.WithLogger(mailplanetest.Logger(e.t)),
		postgres.WithStandbyPoll(50*time.Millisecond),
		postgres.WithRetry(projections.RetryPolicy{Backoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}))
	if err != nil {
		e.t.Fatal(err)
	}
	return runUntil(e.t, "placement projector", p.Run)
}

// publish publishes ds at time at and returns the events.
func (e *env) publish(at time.Time, ds ...domain.Data) []domain.Event {
	e.t.Helper()
	evs := make([]domain.Event, len(ds))
	for i, d := range ds {
		evs[i] = domain.Event{ID: domain.NewEventID(), Type: d.EventType(), Source: "test", Time: at, Subject: d.AggregateID(), Data: d}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.pubMu.Lock()
	e.pubAt = at
	_, err := e.pub.Publish(ctx, evs...)
	e.pubAt = time.Time{}
	e.pubMu.Unlock()
	if err != nil {
		e.t.Fatalf("publish: %v", err)
	}
	e.mu.Lock()
	for _, ev := range evs {
		e.events[ev.ID] = ev
	}
	e.mu.Unlock()
	return evs
}

// waitDecided waits until an engine committed the decision (or the lack
// of one: a heartbeat that changes nothing) of every event of evs.
func (e *env) waitDecided(evs []domain.Event) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !e.transcript.Decided(evs) {
		if time.Now().After(deadline) {
			e.t.Fatalf("the engine did not commit the %d inputs in 60 s", len(evs))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logEnd is the decision log's last stable offset.
func (e *env) logEnd() int64 {
	e.t.Helper()
	cl, err := kafka.NewClient(kafka.Config{Brokers: e.kcfg.Brokers}, kafka.KindAdmin)
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListCommittedOffsets(ctx, e.kcfg.Topic(topics.PlacementDecisions))
	if err != nil || ends.Error() != nil {
		e.t.Fatalf("log end: %v %v", err, ends.Error())
	}
	o, _ := ends.Lookup(e.kcfg.Topic(topics.PlacementDecisions), 0)
	return o.Offset
}

// engineCaughtUp reports whether the engine group committed every input.
func (e *env) engineCaughtUp() bool {
	return e.engineBehind() == ""
}

// engineBehind describes the input partitions whose records the engine
// group has not committed ("" when none).
func (e *env) engineBehind() string {
	cl, err := kafka.NewClient(kafka.Config{Brokers: e.kcfg.Brokers}, kafka.KindAdmin)
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, e.kcfg.Namespace.Topics(topics.DomainTopics()...)...)
	if err != nil {
		return err.Error()
	}
	committed, err := adm.FetchOffsets(ctx, e.kcfg.Group(engine.DefaultGroup))
	if err != nil {
		return err.Error()
	}
	var behind string
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset == 0 {
			return
		}
		c, found := committed.Lookup(o.Topic, o.Partition)
		if !found || c.At < o.Offset {
			behind += fmt.Sprintf(" %s/%d: end %d, committed %d (%v)", o.Topic, o.Partition, o.Offset, c.At, found)
		}
	})
	return behind
}

// settle waits until the engine has decided every input published and its
// ticks have nothing more to decide (the log stands still: the engine
// committed every input, or nothing changed for 2 s), and, when
// pool is set, the projection there stands at the log's end. It returns
// the log's end.
func (e *env) settle(pool *pgxpool.Pool) int64 {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last int64 = -1
	stableSince := time.Now()
	for {
		end := e.logEnd()
		if end != last {
			last, stableSince = end, time.Now()
		}
		// The engine commits the offsets of inputs that decide nothing
		// only with a later transaction, so a round whose last inputs
		// decided nothing leaves them uncommitted for good; a log that
		// stood still for 2 s (ticks run every 20 ms) is settled too.
		stable := time.Since(stableSince)
		ok := stable > 2*time.Second || (stable > 300*time.Millisecond && e.engineCaughtUp())
		if ok && pool != nil {
			ck, err := postgres.ReadCheckpoint(context.Background(), pool)
			if err != nil {
				e.t.Fatal(err)
			}
			ok = ck.NextOffset == end
		}
		if ok {
			return end
		}
		if time.Now().After(deadline) {
			var ck postgres.Checkpoint
			if pool != nil {
				ck, _ = postgres.ReadCheckpoint(context.Background(), pool)
			}
			e.t.Fatalf("not settled after 60s (log end %d, stable for %s, projection at %d); engine behind:%s",
				end, time.Since(stableSince), ck.NextOffset, e.engineBehind())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// scenario publishes random but plausible inputs over a small universe (8
// workers, 5 orgs, 40 mailboxes) in rounds, moving the engine's clock
// along so that ticks expire silent workers and retry pending placements.
type scenario struct {
	e      *env
	r      *rand.Rand
	now    time.Time
	tier   map[int]domain.Tier
	egress map[int]domain.Egress
	stop   map[int]bool
	silent map[int]bool
}

func newScenario(e *env, seed uint64) *scenario {
	return &scenario{e: e, r: rand.New(rand.NewPCG(seed, seed^0x51ed)), now: t0,
		tier: map[int]domain.Tier{}, egress: map[int]domain.Egress{}, stop: map[int]bool{}, silent: map[int]bool{}}
}

func (s *scenario) pick(n int) int { return 1 + s.r.IntN(n) }

// round publishes n inputs (one at a time, at increasing times) and then
// moves the clock to the last one's time.
func (s *scenario) round(n int) {
	s.e.t.Helper()
	for range n {
		r := s.r
		switch x := r.IntN(100); {
		case x < 3:
			s.now = s.now.Add(time.Duration(1+r.IntN(2)) * 24 * time.Hour)
		case x < 10:
			s.now = s.now.Add(time.Duration(1+r.IntN(5)) * time.Minute)
		default:
			s.now = s.now.Add(time.Duration(r.IntN(4000))*time.Millisecond + time.Duration(r.IntN(1000)))
		}
		if d := s.next(); d != nil {
			// The engine decides an input at its record timestamp, never
			// later than its own clock: the clock reads the publish time.
			s.e.clock.Set(s.now)
			s.e.publish(s.now, d)
		}
	}
	s.e.clock.Set(s.now)
}

func (s *scenario) next() domain.Data {
	r := s.r
	switch x := r.IntN(100); {
	case x < 35:
		w := s.pick(8)
		if r.IntN(100) < 4 {
			s.silent[w] = !s.silent[w]
		}
		if s.silent[w] {
			return nil
		}
		if _, ok := s.tier[w]; !ok || r.IntN(100) < 4 {
			s.tier[w] = []domain.Tier{domain.TierSharedFree, domain.TierSharedPremium, domain.TierSharedPremium}[r.IntN(3)]
		}
		if _, ok := s.egress[w]; !ok || r.IntN(100) < 3 {
			s.egress[w] = []domain.Egress{domain.EgressColdSMTP, domain.EgressColdSMTP, domain.EgressWarmupOnly, domain.EgressOAuthAPI}[r.IntN(4)]
		}
		if r.IntN(100) < 5 {
			s.stop[w] = !s.stop[w]
		}
		return &domain.WorkerHeartbeat{WorkerID: workerID(w), Tier: s.tier[w], Egress: s.egress[w], Address: fmt.Sprintf("10.0.0.%d:25", w), Stopping: s.stop[w]}
	case x < 60:
		mb, org := s.pick(40), s.pick(5)
		return mailboxAdded(mb, org, []domain.Provider{domain.ProviderSMTPIMAP, domain.ProviderSMTPIMAP, domain.ProviderGmail, domain.ProviderOutlook}[r.IntN(4)], r.IntN(3) == 0)
	case x < 67:
		return &domain.MailboxRemoved{MailboxID: mailboxID(s.pick(40)), Reason: "gone"}
	case x < 82:
		st := []domain.HealthState{domain.HealthHealthy, domain.HealthHealthy, domain.HealthHealthy, domain.HealthWatch,
			domain.HealthThrottled, domain.HealthQuarantined, domain.HealthBlocked}[r.IntN(7)]
		return scoredWithEvidence(&domain.MailboxHealthScored{MailboxID: mailboxID(s.pick(40)), State: st, Score: float64(r.IntN(101)), Reason: "sweep"})
	case x < 90:
		p := []domain.Plan{domain.PlanFree, domain.PlanPremium, domain.PlanPremium, domain.PlanDedicated, domain.PlanDedicated}[r.IntN(5)]
		n := 0
		if p == domain.PlanDedicated || r.IntN(5) == 0 {
			n = r.IntN(4)
		}
		return &domain.OrgPlanChanged{OrgID: orgID(s.pick(5)), Plan: p, DedicatedWorkers: n, Paid: r.IntN(8) != 0, Source: "evt"}
	case x < 97:
		sends := []int64{0, 50, 1000, 10000}[r.IntN(4)]
		return &domain.WorkerHealthSampled{WorkerID: workerID(s.pick(8)), WindowSeconds: 3600, Sends: sends,
			HardBounces: sends * int64(r.IntN(12)) / 100, Complaints: sends * int64(r.IntN(12)) / 1000}
	default:
		return &domain.UserActive{UserID: orgID(1), Source: domain.ActivityLogin}
	}
}

func mailboxAdded(mb, org int, p domain.Provider, warmup bool) *domain.MailboxAdded {
	return &domain.MailboxAdded{
		MailboxID: mailboxID(mb), OrgID: orgID(org), UserID: orgID(org),
		Address: fmt.Sprintf("box%d@example.com", mb), Provider: p, WarmupEnabled: warmup,
		IMAP:              domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit, Username: fmt.Sprintf("box%d", mb)},
		SealedCredentials: &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAAAAAAAAAAAAAA", Ciphertext: "c2VhbGVk"},
	}
}

type logEntry struct {
	offset int64
	d      topics.Decision
}

func (e *env) readLog() []logEntry {
	l, _ := e.readLogEnd()
	return l
}

// readLogEnd reads the decision log and returns it with its end offset.
func (e *env) readLogEnd() ([]logEntry, int64) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []logEntry
	end, err := engine.ReadDecisions(ctx, e.kcfg, 0, func(off int64, d topics.Decision) error {
		out = append(out, logEntry{off, d})
		return nil
	})
	if err != nil {
		e.t.Fatalf("reading the decision log: %v", err)
	}
	return out, end
}

// settledLog settles and reads the log, again while the log grew after
// settling: settle takes a log that stood still for 2 s as settled, and an
// engine held up longer (a busy machine) then decides more, which a
// comparison with the projection must not see.
func (e *env) settledLog(pool *pgxpool.Pool) []logEntry {
	e.t.Helper()
	for range 10 {
		end := e.settle(pool)
		l, logEnd := e.readLogEnd()
		if logEnd == end {
			return l
		}
	}
	e.t.Fatal("the decision log kept growing after settling")
	return nil
}

// verifyLog checks the whole decision log against the pure decider fed
// what the env's engines committed (engine.Transcript.Verify). It returns
// the decider's state.
func (e *env) verifyLog(l []logEntry) *placement.State {
	e.t.Helper()
	// The commit hook runs after the commit returns.
	for deadline := time.Now().Add(10 * time.Second); e.transcript.Decisions() < len(l) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	logged := make([]engine.LoggedDecision, len(l))
	for i, en := range l {
		logged[i] = engine.LoggedDecision{Offset: en.offset, Decision: en.d}
	}
	e.mu.Lock()
	events := maps.Clone(e.events)
	e.mu.Unlock()
	st, err := e.transcript.Verify(e.cfg, events, logged)
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

// scoredWithEvidence gives every other score (by its value, so the
// scenario's random sequence is unchanged) evidence, which the decisions it
// causes copy: a rebuild must reproduce those too.
func scoredWithEvidence(d *domain.MailboxHealthScored) *domain.MailboxHealthScored {
	if int(d.Score)%2 != 0 {
		return d
	}
	end := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	junk := int64(100 - d.Score)
	d.Evidence = &domain.HealthEvidence{WindowSeconds: 7 * 86400, WindowEnd: &end, Inbox: 100 - junk, Junk: junk, MinObservations: 20,
		Rate: float64(junk) / 100, Rule: domain.HealthRuleLevel, Threshold: &domain.HealthThreshold{Rate: 0.1, State: domain.HealthWatch}}
	return d
}
