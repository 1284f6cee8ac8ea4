package ownership

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/promreg"
)

// DefaultTimeout bounds each of the guard's trips to Postgres.
const DefaultTimeout = 5 * time.Second

// Guard is ownership at ingest: Check before an event is produced (the
// api's admission), Landed once the log acknowledged it.
type Guard struct {
	store   *Store
	log     *slog.Logger
	timeout time.Duration
	// backfilled: the claims were backfilled once (it never goes back).
	backfilled atomic.Bool

	refused        *prometheus.CounterVec
	settleFailures prometheus.Counter
}

// Option configures a Guard.
type Option func(*Guard)

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(g *Guard) { g.log = l } }

// WithRegisterer registers the guard's metrics on reg.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(g *Guard) {
		g.refused = promreg.MustRegister(reg, g.refused)
		g.settleFailures = promreg.MustRegister(reg, g.settleFailures)
	}
}

// WithTimeout bounds each trip to Postgres (default DefaultTimeout).
func WithTimeout(d time.Duration) Option { return func(g *Guard) { g.timeout = d } }

// NewGuard returns the guard of store.
func NewGuard(store *Store, opts ...Option) *Guard {
	g := &Guard{store: store, log: slog.New(slog.DiscardHandler), timeout: DefaultTimeout,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_ownership_refused_events_total",
			Help: "Events refused not_owner at ingest (they act on a mailbox or org another tenant owns), by caller.",
		}, []string{"caller"}),
		settleFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mailplane_ownership_settle_failures_total",
			Help: "Requests whose events the log acknowledged but whose claims could not be settled after (Postgres failed): a removed mailbox stays its owner's until the owner adds or removes it again.",
		}),
	}
	for _, o := range opts {
		o(g)
	}
	return g
}

// Check decides whether caller may publish events as far as ownership
// goes and records their claims; nil means produce them. A refusal is a
// *domain.Error not_owner naming each refused event (its index in the
// request and the field naming what another tenant owns, never who);
// Postgres failing is unavailable. Either way nothing was recorded.
func (g *Guard) Check(ctx context.Context, caller *domain.Caller, events []domain.Event) error {
	if !hasEffects(events) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	if !g.backfilled.Load() {
		ok, err := g.store.Backfilled(ctx)
		if err != nil {
			return g.unavailable(len(events), err)
		}
		if !ok {
			return domain.Errorf(domain.CodeUnavailable,
				"ownership claims are not backfilled from the log yet (the api role does it at start; mailplane ownership backfill by hand); nothing was produced; retry shortly")
		}
		g.backfilled.Store(true)
	}
	refused, err := g.store.Decide(ctx, caller, events)
	if err != nil {
		return g.unavailable(len(events), err)
	}
	if len(refused) == 0 {
		return nil
	}
	name := "unknown"
	if caller != nil {
		name = caller.Name
	}
	g.refused.WithLabelValues(name).Add(float64(len(refused)))
	g.log.Info("ownership: events refused", "caller", name, "events", len(events), "refused", len(refused))
	var ps domain.Problems
	idx := make([]int, 0, len(refused))
	for _, r := range refused {
		idx = append(idx, r.Index)
		ps.Add("data."+string(r.Key.Kind)+"_id", domain.CodeNotOwner,
			"the %s belongs to another tenant; an operator can transfer it (mailplane ownership transfer)", r.Key.Kind)
	}
	n := "1 event acts"
	if len(refused) > 1 {
		n = fmt.Sprintf("%d events act", len(refused))
	}
	return &RefusedError{Indexes: idx, Err: &domain.Error{Code: domain.CodeNotOwner, Problems: ps,
		Message: fmt.Sprintf("%s on a mailbox or org another tenant owns; nothing was produced", n)}}
}

func (g *Guard) unavailable(events int, err error) error {
	g.log.Warn("ownership: claims could not be checked", "events", events, "err", err)
	return domain.Errorf(domain.CodeUnavailable, "ownership could not be checked; nothing was produced; retry shortly")
}

// RefusedError is Check's refusal: a not_owner *domain.Error whose
// Problems are about the events at Indexes (in the request), one each.
type RefusedError struct {
	Err     *domain.Error
	Indexes []int
}

func (e *RefusedError) Error() string { return e.Err.Error() }

// Unwrap returns the *domain.Error (domain.ErrorCode reads its code).
func (e *RefusedError) Unwrap() error { return e.Err }

// EventIndexes returns the index in the request of each problem's event.
func (e *RefusedError) EventIndexes() []int { return e.Indexes }

// Landed records that the log acknowledged events (of a request Check
// let through for caller): adds make sure of their claims, removals drop
// them (Store.Settle). A failure leaves a claim to its owner (logged and
// counted), never to anyone else.
func (g *Guard) Landed(ctx context.Context, caller *domain.Caller, events []domain.Event) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.timeout)
	defer cancel()
	if err := g.store.Settle(ctx, caller, events); err != nil {
		g.settleFailures.Inc()
		g.log.Warn("ownership: removed mailboxes stay claimed by their owner", "err", err)
	}
}
