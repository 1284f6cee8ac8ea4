package health_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/health"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/topics"
)

const (
	sender = "0190a5b2-4c5e-7b1a-9c3d-0000000000c1"
	other  = "0190a5b2-4c5e-7b1a-9c3d-0000000000c2"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

type env struct {
	t       *testing.T
	pool    *pgxpool.Pool
	brokers []string
	kcfg    kafka.Config // the brokers, in the test's namespace
	prod    *kgo.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool := pgtest.Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	kcfg := kafkatest.Config(t, 4)
	brokers := kcfg.Brokers
	// Record timestamps are the test's clock, months from the wall clock:
	// no delivery timeout, which kgo reads from them.
	prod, err := kafka.NewProducer(kcfg, kgo.RecordDeliveryTimeout(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	return &env{t: t, pool: pool, brokers: brokers, kcfg: kcfg, prod: prod}
}

// run starts a goroutine until the test ends.
func run(t *testing.T, f func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func (e *env) startScorer(m *health.Metrics, opts ...health.ScorerOption) {
	e.t.Helper()
	opts = append([]health.ScorerOption{health.WithEmitted(func(ev domain.Event) { m.Committed([]domain.Event{ev}) })}, opts...)
	s, err := health.NewScorer(domain.DefaultHealthPolicy(), opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	p, err := projections.New(e.kcfg, e.pool, s,
		projections.WithGroup(kafka.GroupConfig{SessionTimeout: kafkatest.SessionTimeout(2 * time.Second), HeartbeatInterval: 200 * time.Millisecond}),
		projections.WithCommitted(m.Committed), projections.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		e.t.Fatal(err)
	}
	run(e.t, p.Run)
}

func (e *env) startRelay() {
	e.t.Helper()
	run(e.t, outbox.NewRelay(e.pool, e.kcfg, outbox.WithPollInterval(50*time.Millisecond)).Run)
}

func observation(mailbox string, i int, junk bool, at time.Time) domain.Event {
	p := domain.PlacedInbox
	if junk {
		p = domain.PlacedJunk
	}
	return domain.Event{ID: domain.NewEventID(), Type: domain.TypeWarmupObserved, Source: "test", Time: at, Subject: mailbox,
		Data: &domain.WarmupObserved{MailboxID: mailbox, WarmupID: fmt.Sprintf("w-%d", i), Placement: p, LandedAt: at,
			Source: domain.ObservedBySync, RecipientMailboxID: other}}
}

func (e *env) publish(evs ...domain.Event) {
	e.t.Helper()
	e.publishAt(time.Time{}, evs...)
}

// publishAt publishes evs with record timestamp at (the time mailplane
// received them), or each event's own time when at is zero.
func (e *env) publishAt(at time.Time, evs ...domain.Event) {
	e.t.Helper()
	recs := make([]*kgo.Record, len(evs))
	for i, ev := range evs {
		r, err := topics.Encode(ev)
		if err != nil {
			e.t.Fatal(err)
		}
		r.Timestamp = ev.Time // received when it happened: the scorer runs on the record's time
		if !at.IsZero() {
			r.Timestamp = at
		}
		recs[i] = r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.prod.ProduceSync(ctx, kafkatest.InNamespace(e.kcfg, recs...)...).FirstErr(); err != nil {
		e.t.Fatal(err)
	}
}

// scored consumes n health_scored events of mailbox from the mailbox topic.
func (e *env) scored(mailbox string, n int) []*domain.MailboxHealthScored {
	e.t.Helper()
	cl, err := kafka.NewClient(kafka.Config{Brokers: e.brokers}, kafka.KindReader, kgo.ConsumeTopics(e.kcfg.Topic(topics.MailboxEvents)),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []*domain.MailboxHealthScored
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			e.t.Fatalf("%d of %d health_scored events for %s", len(out), n, mailbox)
		}
		for _, r := range fs.Records() {
			ev, err := topics.Decode(r)
			if err != nil {
				e.t.Fatal(err)
			}
			if d, ok := ev.Data.(*domain.MailboxHealthScored); ok && ev.Subject == mailbox {
				if ev.Source != health.Source || !domain.IsUUIDv7(ev.ID) {
					e.t.Fatalf("event %s from %s", ev.ID, ev.Source)
				}
				out = append(out, d)
			}
		}
	}
	return out
}

func (e *env) state(mailbox string) (state string, n int64) {
	e.t.Helper()
	err := e.pool.QueryRow(context.Background(), `SELECT state, observations FROM mailbox_health WHERE mailbox_id = $1`, mailbox).Scan(&state, &n)
	if err != nil {
		return "", 0
	}
	return state, n
}

// lastEval is the scorer's clock for mailbox: the time of its last
// evaluation.
func (e *env) lastEval(mailbox string) time.Time {
	e.t.Helper()
	var at time.Time
	if err := e.pool.QueryRow(context.Background(), `SELECT last_eval FROM mailbox_health WHERE mailbox_id = $1`, mailbox).Scan(&at); err != nil {
		e.t.Fatal(err)
	}
	return at
}

func (e *env) waitObservations(mailbox string, n int64) string {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, got := e.state(mailbox)
		if got == n {
			return s
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: %d of %d observations applied", mailbox, got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Junk placements become a penalty; the event reaches the mailbox topic
// through the outbox, once, however often the observations are delivered.
func TestScorerEmitsOnStateChange(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := health.NewMetrics(prometheus.NewRegistry())
	e.startScorer(m)
	e.startRelay()

	var evs []domain.Event
	for i := range 30 {
		evs = append(evs, observation(sender, i, i%4 == 0, t0.Add(time.Duration(i)*time.Minute))) // 8 of 30 junk
	}
	for i := range 25 {
		evs = append(evs, observation(other, i, false, t0))
	}
	e.publish(evs...)
	e.publish(evs[:10]...) // delivered again: same ids, applied once
	if s := e.waitObservations(sender, 30); s != "quarantined" {
		t.Fatalf("sender is %s", s)
	}
	if s := e.waitObservations(other, 25); s != "healthy" {
		t.Fatalf("other is %s", s)
	}
	got := e.scored(sender, 1)
	// At 20 observations 5 were junk (25%): quarantined for 7 days.
	if got[0].State != domain.HealthQuarantined || got[0].Until == nil || got[0].Score != 75 {
		t.Fatalf("event %+v", got[0])
	}
	var pending int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM event_outbox`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for pending > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		_ = e.pool.QueryRow(context.Background(), `SELECT count(*) FROM event_outbox`).Scan(&pending)
	}
	if pending != 0 {
		t.Fatalf("%d outbox rows left", pending)
	}
	// Exactly one event for sender: no more in the topic.
	var all int
	cl, _ := kafka.NewClient(kafka.Config{Brokers: e.brokers}, kafka.KindReader, kgo.ConsumeTopics(e.kcfg.Topic(topics.MailboxEvents)), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		all += len(cl.PollFetches(ctx).Records())
	}
	if all != 1 {
		t.Fatalf("%d records on the mailbox topic, want 1", all)
	}
}

// TestScorerRunsOnReceivedTime: observations whose producer claims a time
// ten days ahead (event time and landed_at) but which mailplane received at
// t0 are scored at t0: the block they earn ends 30 days after t0, not 40,
// and the scorer's clock does not jump ahead.
func TestScorerRunsOnReceivedTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := health.NewMetrics(prometheus.NewRegistry())
	e.startScorer(m)
	e.startRelay()
	claimed := t0.Add(10 * 24 * time.Hour)
	var evs []domain.Event
	for i := range 20 {
		evs = append(evs, observation(sender, i, i%2 == 0, claimed)) // 50%: blocked 30 days
	}
	e.publishAt(t0, evs...)
	if s := e.waitObservations(sender, 20); s != "blocked" {
		t.Fatalf("state %s", s)
	}
	got := e.scored(sender, 1)[0]
	if want := t0.Add(30 * 24 * time.Hour); got.Until == nil || !got.Until.Equal(want) {
		t.Fatalf("blocked until %v, want %s (30 days after the received time)", got.Until, want)
	}
	// Its evidence ends at the received time too, never the producer's
	// claim, and counts what the block was decided on.
	if ev := got.Evidence; ev == nil || ev.WindowEnd == nil || !ev.WindowEnd.Equal(t0) || ev.Inbox != 10 || ev.Junk != 10 ||
		ev.Rule != domain.HealthRuleLevel || ev.Threshold == nil || ev.Threshold.Rate != 0.4 || ev.PenaltySeconds != 30*86400 {
		t.Fatalf("evidence %+v", got.Evidence)
	}
	lastEval := e.lastEval(sender)
	if !lastEval.Equal(t0) {
		t.Fatalf("the scorer's clock is at %s, want the received time %s", lastEval, t0)
	}
}

// The ticker ends penalties on the wall clock: a block becomes probation,
// probation becomes healthy.
func TestTickerEndsPenalties(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := health.NewMetrics(prometheus.NewRegistry())
	e.startScorer(m)
	e.startRelay()
	var evs []domain.Event
	for i := range 20 {
		evs = append(evs, observation(sender, i, i%2 == 0, t0)) // 50%: blocked 30 days
	}
	e.publish(evs...)
	if s := e.waitObservations(sender, 20); s != "blocked" {
		t.Fatalf("state %s", s)
	}
	clock := t0.Add(29 * 24 * time.Hour)
	tk := health.NewTicker(e.pool, domain.DefaultHealthPolicy(), health.WithClock(func() time.Time { return clock }), health.WithMetrics(m))
	ctx := context.Background()
	if n, err := tk.Tick(ctx); err != nil || n != 0 {
		t.Fatalf("tick before the end: %d rows, %v", n, err)
	}
	clock = t0.Add(30 * 24 * time.Hour)
	if n, err := tk.Tick(ctx); err != nil || n != 1 {
		t.Fatalf("tick at the end: %d rows, %v", n, err)
	}
	if s, _ := e.state(sender); s != "throttled" {
		t.Fatalf("state %s after the block", s)
	}
	clock = t0.Add(33 * 24 * time.Hour)
	if n, err := tk.Tick(ctx); err != nil || n != 1 {
		t.Fatalf("tick after probation: %d rows, %v", n, err)
	}
	if s, _ := e.state(sender); s != "healthy" {
		t.Fatalf("state %s after probation", s)
	}
	got := e.scored(sender, 3)
	want := []domain.HealthState{domain.HealthBlocked, domain.HealthThrottled, domain.HealthHealthy}
	for i, w := range want {
		if got[i].State != w {
			t.Fatalf("event %d is %s, want %s", i, got[i].State, w)
		}
	}
	// Nothing is due any more.
	clock = t0.Add(400 * 24 * time.Hour)
	if n, err := tk.Tick(ctx); err != nil || n != 0 {
		t.Fatalf("tick with nothing due: %d rows, %v", n, err)
	}
}

// TestScorerBoundsFutureStamps: observations written straight to the topic
// with record timestamps in 2099 are scored at the scorer's clock, so the
// block they earn ends 30 days after that reading, not in 2099.
func TestScorerBoundsFutureStamps(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := health.NewMetrics(prometheus.NewRegistry())
	clock := t0.Add(time.Hour)
	e.startScorer(m, health.WithScorerClock(func() time.Time { return clock }))
	e.startRelay()
	future := time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)
	var evs []domain.Event
	for i := range 20 {
		evs = append(evs, observation(sender, i, i%2 == 0, future)) // 50%: blocked 30 days
	}
	e.publishAt(future, evs...)
	if s := e.waitObservations(sender, 20); s != "blocked" {
		t.Fatalf("state %s", s)
	}
	got := e.scored(sender, 1)[0]
	if want := clock.Add(30 * 24 * time.Hour); got.Until == nil || !got.Until.Equal(want) {
		t.Fatalf("blocked until %v, want %s (30 days after the scorer's clock, not the record's 2099 stamp)", got.Until, want)
	}
	lastEval := e.lastEval(sender)
	if !lastEval.Equal(clock) {
		t.Fatalf("the scorer's clock is at %s, want %s", lastEval, clock)
	}
}
