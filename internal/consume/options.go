package consume

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/sla"
)

// Option configures a Consumer. Options are applied once, in order, by New.
type Option func(*config)

// PartitionsFunc is a partition callback: the partitions assigned, revoked
// or lost, by topic, and the consumer (its Client, Session and Wake are
// ready: a callback never runs before New returned).
type PartitionsFunc func(ctx context.Context, c *Consumer, partitions map[string][]int32)

// DefaultLeaveWithin bounds leaving the group at shutdown unless
// LeaveWithin says otherwise (kafka.CloseWithin).
const DefaultLeaveWithin = 5 * time.Second

type config struct {
	logger      *slog.Logger
	reg         prometheus.Registerer
	now         func() time.Time
	wait        func() time.Duration
	maxRecords  func() int
	kgoOpts     []kgo.Opt
	assigned    []PartitionsFunc
	revoked     []PartitionsFunc
	lost        []PartitionsFunc
	beforeLeave []func()
	leaveWithin time.Duration
	fetchErr    func(topic string, partition int32, err error) error
	meter       *sla.Meter
	byEffect    bool // the meter takes the positions the handler reports
	skipFor     string
	retry       *retryPolicy
	mws         []Middleware
}

type retryPolicy struct {
	p       backoff.Policy
	onRetry func(failures int, wait time.Duration, err error)
}

// WithLogger sets the logger (fetch errors, slow leaves). Default: discard.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithRegisterer registers the runtime's metrics on reg (internal/promreg:
// consumers of one process share the series, labelled by consumer).
// Default: a registry of its own.
func WithRegisterer(reg prometheus.Registerer) Option { return func(c *config) { c.reg = reg } }

// WithClock sets the clock a Batch's poll time is read from. Default
// time.Now.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithPollWait bounds each poll's wait for records to d: the handler is
// then called at least every d (plus its own time). Default: a poll waits
// until records arrive, Wake is called or the context is done.
func WithPollWait(d time.Duration) Option {
	return func(c *config) { c.wait = func() time.Duration { return d } }
}

// WithWait asks fn before each poll how long it may wait for records; zero
// or less takes what the client has buffered and returns at once (records
// already wait to be applied, a tick is due).
func WithWait(fn func() time.Duration) Option { return func(c *config) { c.wait = fn } }

// WithMaxRecords bounds the records one poll returns. Default: whatever
// the client has buffered.
func WithMaxRecords(n int) Option { return func(c *config) { c.maxRecords = func() int { return n } } }

// WithMaxRecordsFunc asks fn before each poll for the most records it
// returns (a batch size that adapts to the backlog).
func WithMaxRecordsFunc(fn func() int) Option { return func(c *config) { c.maxRecords = fn } }

// WithKgoOptions adds franz-go options to the client, after the kit's and
// the source's (kgo.AdjustFetchOffsetsFn, hooks, fetch sizes, group
// timings in tests). The partition callbacks are the runtime's: use
// OnAssigned, OnRevoked and OnLost.
func WithKgoOptions(opts ...kgo.Opt) Option {
	return func(c *config) { c.kgoOpts = append(c.kgoOpts, opts...) }
}

// OnAssigned calls fn when the group assigns partitions, before their
// offsets are fetched (group sources only).
func OnAssigned(fn PartitionsFunc) Option {
	return func(c *config) { c.assigned = append(c.assigned, fn) }
}

// OnRevoked calls fn when partitions are revoked, after the batch in hand
// was handled (group sources only); the meter has forgotten them already.
func OnRevoked(fn PartitionsFunc) Option {
	return func(c *config) { c.revoked = append(c.revoked, fn) }
}

// OnLost calls fn when partitions are lost (the session expired, the
// member was fenced): another member may own them already.
func OnLost(fn PartitionsFunc) Option { return func(c *config) { c.lost = append(c.lost, fn) } }

// BeforeLeave calls fn when Run ends, before the client leaves the group
// (stop what works on the partitions, so the next owner finds its writes
// done).
func BeforeLeave(fn func()) Option {
	return func(c *config) { c.beforeLeave = append(c.beforeLeave, fn) }
}

// LeaveWithin bounds leaving the group (closing the client) when Run ends:
// a stopping process must be gone within its grace period, and a leave can
// wait on the coordinator for a rebalance timeout. Past d the coordinator
// expires the member on its own. Default DefaultLeaveWithin.
func LeaveWithin(d time.Duration) Option { return func(c *config) { c.leaveWithin = d } }

// OnFetchError is told of each fetch error (those of a poll's own context
// ending excepted); a non-nil return ends Run with it. Default: the error
// is logged at warning level and counted, and polling goes on (franz-go
// retries the fetch).
func OnFetchError(fn func(topic string, partition int32, err error) error) Option {
	return func(c *config) { c.fetchErr = fn }
}

// Metered reports the consumer's lag on m (its row of internal/sla's
// table): a partition polled is held at its first record (with that
// record's append time) while the handler runs, and at the offset after
// its last once the handler returned nil (unless a Batch.Transact of the
// batch aborted: the records are polled again); revoked and lost partitions are
// forgotten, and every partition when Run ends. The effect observes
// latency itself (m.Applied), where it knows the effect happened.
func Metered(m *sla.Meter) Option { return func(c *config) { c.meter, c.byEffect = m, false } }

// MeteredByEffect reports the consumer's lag on m (its row of internal/sla's
// table) at the positions its effect made durable rather than at the
// fetch's: a consumer whose effect keeps its own position (a Postgres
// offset row, a checkpoint, a live set loaded from a partition's start)
// tells the runtime where it stands with Consumer.Position, from its
// handler or a partition callback, whenever that moves. The runtime owns
// the rest, as with Metered: it ignores positions of partitions the
// consumer does not own (a group's revoked or lost partitions, anything
// after Run ended), forgets revoked and lost partitions, and forgets every
// partition when Run ends. The effect observes latency itself (m.Applied).
// Use Metered or MeteredByEffect, not both: the last given wins.
func MeteredByEffect(m *sla.Meter) Option {
	return func(c *config) { c.meter, c.byEffect = m, true }
}

// SkipRedriven drops records redriven from the dead-letter topic for
// another consumer (dlq.ForOtherConsumer) before the handler sees them:
// consumer is this consumer's name in the redrive header (its sla.Name).
// Positions still move past them (the meter and the offsets count the
// fetches, not the records handled).
func SkipRedriven(consumer string) Option { return func(c *config) { c.skipFor = consumer } }

// Retry calls the handler again with the same batch, waiting by p, while it
// fails, until it returns nil, an error wrapped by backoff.Permanent, or
// the context is done; onRetry (may be nil) is told of each failure. Not
// for TransactGroup: an aborted transaction is retried by polling again.
func Retry(p backoff.Policy, onRetry func(failures int, wait time.Duration, err error)) Option {
	return func(c *config) { c.retry = &retryPolicy{p, onRetry} }
}

// Use adds middleware of the consumer's own around the handler, inside the
// runtime's policies (the first given is the outermost of them).
func Use(mw ...Middleware) Option { return func(c *config) { c.mws = append(c.mws, mw...) } }
