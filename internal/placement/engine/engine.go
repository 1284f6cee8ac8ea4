package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/consume"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

// Defaults. See the package documentation for how they bound failover.
const (
	DefaultTransactionalID    = "mailplane-placement-engine"
	DefaultGroup              = "mailplane-placement-engine"
	DefaultSource             = "mailplane/placement-engine"
	DefaultTickInterval       = 2 * time.Second
	DefaultSessionTimeout     = kafka.DefaultSessionTimeout
	DefaultHeartbeatInterval  = kafka.DefaultHeartbeatInterval
	DefaultRebalanceTimeout   = 30 * time.Second
	DefaultTransactionTimeout = 20 * time.Second
	DefaultMaxBatch           = 5000
	DefaultRestoreTimeout     = 10 * time.Minute
)

// DeadLetterConsumer names the engine in the DLQ's consumer header.
const DeadLetterConsumer = "placement-engine"

// Option configures an Engine.
type Option func(*config)

type config struct {
	logger         *slog.Logger
	reg            prometheus.Registerer
	now            func() time.Time
	tick           time.Duration
	session        time.Duration
	heartbeat      time.Duration
	rebalance      time.Duration
	txnID          string
	group          string
	placement      placement.Config
	snapshotter    Snapshotter
	maxBatch       int
	source         string
	txnTimeout     time.Duration
	restoreTimeout time.Duration
	committed      []func(Commit)
	kgoOpts        []kgo.Opt
	beforeEnd      func()          // tests: runs after the flush, before the commit
	ticked         func(time.Time) // tests: runs after each tick is decided, with its time
}

// WithLogger sets the logger. Default: discard.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithRegisterer registers the engine's metrics on reg. Default: a private
// registry.
func WithRegisterer(reg prometheus.Registerer) Option { return func(c *config) { c.reg = reg } }

// WithClock sets the clock ticks read their time from. Event inputs are
// decided at their record timestamp (the time mailplane's producer stamped
// at ingest, never the producer's ce_time), bounded by this clock: a record
// stamped ahead of it is decided at its reading (domain.TrustedTime). The
// decisions record the time they were made at, so replaying the log never
// reads a clock. Default: time.Now.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithTickInterval sets how often the active engine ticks (liveness expiry,
// retries of pending placements, drains, dedicated shortfalls). Default 2s.
func WithTickInterval(d time.Duration) Option { return func(c *config) { c.tick = d } }

// WithSessionTimeout sets the group session timeout: how long after the
// active engine's last heartbeat the group hands its inputs to a standby.
// It bounds failover after a crash. Default 6s (the usual broker minimum).
func WithSessionTimeout(d time.Duration) Option { return func(c *config) { c.session = d } }

// WithHeartbeatInterval sets the group heartbeat interval. Default 500ms.
func WithHeartbeatInterval(d time.Duration) Option { return func(c *config) { c.heartbeat = d } }

// WithRebalanceTimeout sets how long the group waits for members to rejoin
// during a rebalance. Default 30s.
func WithRebalanceTimeout(d time.Duration) Option { return func(c *config) { c.rebalance = d } }

// WithTransactionalID sets the transactional id. Every engine of one
// deployment must use the same one: a new active engine's InitProducerID
// fences the previous one. Default "mailplane-placement-engine".
func WithTransactionalID(id string) Option { return func(c *config) { c.txnID = id } }

// WithGroup sets the consumer group electing the active engine. Default
// "mailplane-placement-engine".
func WithGroup(g string) Option { return func(c *config) { c.group = g } }

// WithPlacementConfig sets the decider's configuration. Every engine of one
// deployment must use the same one, or decisions stop being a function of
// the log.
func WithPlacementConfig(pc placement.Config) Option {
	return func(c *config) { c.placement = pc }
}

// WithSnapshotter sets where a restore starts. Default LogSnapshotter.
func WithSnapshotter(s Snapshotter) Option { return func(c *config) { c.snapshotter = s } }

// WithMaxBatch bounds the input records decided in one transaction.
// Default 5000.
func WithMaxBatch(n int) Option { return func(c *config) { c.maxBatch = n } }

// WithSource sets ce_source on decisions. Default "mailplane/placement-engine".
func WithSource(s string) Option { return func(c *config) { c.source = s } }

// WithTransactionTimeout sets the Kafka transaction timeout: how long an
// abandoned transaction (an engine dying with no standby to fence it) holds
// back read_committed readers of the decision log. A commit that takes
// longer ends the session. Default 20s.
func WithTransactionTimeout(d time.Duration) Option { return func(c *config) { c.txnTimeout = d } }

// WithRestoreTimeout bounds one restore. Default 10m.
func WithRestoreTimeout(d time.Duration) Option { return func(c *config) { c.restoreTimeout = d } }

// WithCommitted calls fn after each committed transaction, on the engine's
// goroutine; fn must be quick. Tests and benchmarks use it. Given more
// than once, every fn is called, in order.
func WithCommitted(fn func(Commit)) Option {
	return func(c *config) { c.committed = append(c.committed, fn) }
}

// WithKgoOptions adds franz-go options to the engine's group client.
func WithKgoOptions(opts ...kgo.Opt) Option {
	return func(c *config) { c.kgoOpts = append(c.kgoOpts, opts...) }
}

// Commit describes one committed transaction.
type Commit struct {
	// At is the wall-clock time the commit returned.
	At time.Time
	// Inputs are the event inputs decided in the transaction, in order.
	Inputs []Input
	// Tick is set when the transaction holds a tick's decisions.
	Tick bool
	// TickAt is the tick's time (the engine's clock), when Tick is set.
	TickAt time.Time
	// Granted is the liveness grace the deciding state held: the engine's
	// clock when it restored (placement.State.GrantLiveness).
	Granted time.Time
	// Decisions is the number of decisions written.
	Decisions int
	// DeadLetters is the number of inputs sent to the DLQ.
	DeadLetters int
}

// Input is one event input of a committed transaction.
type Input struct {
	Topic     string
	Partition int32
	Offset    int64
	EventID   string
	// Produced is the input record's timestamp.
	Produced time.Time
	// At is the time it was decided at: Produced, bounded by the clock.
	At        time.Time
	Decisions int
}

// Engine is the placement engine. See the package documentation.
type Engine struct {
	kcfg kafka.Config
	cfg  config
	m    *metrics
	// meter measures the engine as the consumer of its tier: lag per
	// input partition, and input append to decisions committed.
	meter *sla.Meter
	log   *slog.Logger

	mu      sync.Mutex
	running bool
	active  atomic.Bool
}

// New returns an engine reading from and writing to the brokers in kcfg. It
// connects to nothing until Run.
func New(kcfg kafka.Config, opts ...Option) (*Engine, error) {
	cfg := config{
		now:            time.Now,
		tick:           DefaultTickInterval,
		session:        DefaultSessionTimeout,
		heartbeat:      DefaultHeartbeatInterval,
		rebalance:      DefaultRebalanceTimeout,
		txnID:          DefaultTransactionalID,
		group:          DefaultGroup,
		snapshotter:    LogSnapshotter{},
		maxBatch:       DefaultMaxBatch,
		source:         DefaultSource,
		txnTimeout:     DefaultTransactionTimeout,
		restoreTimeout: DefaultRestoreTimeout,
	}
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case len(kcfg.Brokers) == 0:
		return nil, errors.New("placement: no brokers")
	case cfg.txnID == "" || cfg.group == "":
		return nil, errors.New("placement: the transactional id and the group must be set")
	case cfg.tick <= 0 || cfg.session <= 0 || cfg.heartbeat <= 0 || cfg.rebalance <= 0 || cfg.txnTimeout <= 0 || cfg.restoreTimeout <= 0:
		return nil, errors.New("placement: intervals and timeouts must be positive")
	case cfg.heartbeat >= cfg.session:
		return nil, errors.New("placement: the heartbeat interval must be shorter than the session timeout")
	case cfg.maxBatch <= 0:
		return nil, errors.New("placement: the batch size must be positive")
	case cfg.snapshotter == nil || cfg.now == nil:
		return nil, errors.New("placement: nil snapshotter or clock")
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.reg == nil {
		cfg.reg = prometheus.NewRegistry()
	}
	if kcfg.ClientID == "" {
		kcfg.ClientID = "mailplane-placement-engine"
	}
	cfg.placement = placement.NewState(cfg.placement).Config()
	// The group and the transactional id as the broker names them.
	cfg.group, cfg.txnID = kcfg.Group(cfg.group), kcfg.TransactionalID(cfg.txnID)
	return &Engine{kcfg: kcfg.WithLogger(cfg.logger.With("component", "placement-engine")), cfg: cfg, m: newMetrics(cfg.reg), meter: sla.NewMeter(cfg.reg, sla.PlacementEngine), log: cfg.logger.With("component", "placement-engine")}, nil
}

// leaveTimeout bounds leaving the group when a session ends: a stopping
// process must be gone within its grace period, and a leave can wait on
// the coordinator for a rebalance timeout (kafka.CloseWithin).
const leaveTimeout = 3 * time.Second

// Active reports whether this engine is the active one (restored and
// deciding).
func (e *Engine) Active() bool { return e.active.Load() }

// The waits between sessions (a session that lasted a minute starts the
// doubling over) and between restore attempts.
var (
	sessionBackoff = backoff.Policy{Floor: 250 * time.Millisecond, Cap: 5 * time.Second, Jitter: backoff.Half}
	restoreBackoff = backoff.Policy{Floor: 250 * time.Millisecond, Cap: 5 * time.Second, Jitter: backoff.Half}
)

// Run joins the engine group and, whenever this engine is elected, restores
// the state and decides until it loses the election. It blocks until ctx
// is done, then finishes the transaction in flight, leaves the group and
// returns nil. A failed session (broker unreachable, fenced, restore
// failed) is logged and retried with backoff. An engine runs once at a
// time.
func (e *Engine) Run(ctx context.Context) error {
	e.mu.Lock()
	if e.running {
		e.mu.Unlock()
		return errors.New("placement: engine already running")
	}
	e.running = true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.running = false
		e.mu.Unlock()
	}()

	bo := backoff.New(sessionBackoff, nil)
	for ctx.Err() == nil {
		start := time.Now()
		err := e.runSession(ctx)
		if ctx.Err() != nil {
			break
		}
		if time.Since(start) > time.Minute {
			bo.Reset()
		}
		wait := bo.Next()
		if err != nil {
			e.log.Warn("placement engine session ended; rejoining", "err", err, "backoff", wait)
		} else {
			e.log.Info("placement engine session ended; rejoining as a standby")
		}
		_ = backoff.Sleep(ctx, wait)
	}
	e.log.Info("placement engine stopped")
	return nil
}

// errLeadership ends a session whose inputs were revoked or lost.
var errLeadership = errors.New("placement: leadership lost")

// session is one group membership: one consumer (internal/consume) of a
// transactional session, one transactional producer epoch (once active),
// and the state while active.
type session struct {
	e   *Engine
	c   *consume.Consumer
	log *slog.Logger
	// lead is done when the inputs are revoked or lost or the fence
	// failed: a restore waiting to retry stops waiting.
	lead     context.Context
	stepDown context.CancelFunc

	mu       sync.Mutex
	fenced   bool  // assigned, and InitProducerID done (the previous owner is fenced)
	fenceErr error // the fence failed
	ended    bool  // inputs revoked or lost

	// Owned by the handler (the consumer's goroutine).
	st          *placement.State // nil until restored, and after an abort
	lastID      string           // ce_id of the last decision in the log (or about to be)
	granted     time.Time        // the liveness grace st was granted at its restore
	carried     []Input          // inputs decided since the last commit that wrote nothing
	workers     *workerGauge
	nextTick    time.Time       // wall clock: ticks are scheduled in real time, timed by the clock option
	lag         map[tpKey]lagAt // per input partition: how far behind its last fetch left it
	lastCommit  time.Time
	lastPending time.Time
	restores    int
}

// runSession is one session on the consumer runtime: a transactional
// group consumer whose handler restores, decides and ticks; the runtime
// meters the lag and skips records redriven for other consumers.
func (e *Engine) runSession(ctx context.Context) error {
	s := &session{e: e, log: e.log, workers: newWorkerGauge(e.m.workers), lag: map[tpKey]lagAt{}}
	s.lead, s.stepDown = context.WithCancel(ctx)
	defer s.stepDown()
	opts := []kgo.Opt{
		kgo.Balancers(SingleOwnerBalancer{}),
		kgo.RebalanceTimeout(e.cfg.rebalance),
		kgo.TransactionalID(e.cfg.txnID),
		kgo.TransactionTimeout(e.cfg.txnTimeout),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.ProduceRequestTimeout(10 * time.Second),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
	}
	c, err := consume.New(e.kcfg, string(sla.PlacementEngine), consume.TransactGroup(kafka.GroupConfig{
		Group:             e.cfg.group,
		Topics:            e.kcfg.Namespace.Topics(topics.DomainTopics()...),
		SessionTimeout:    e.cfg.session,
		HeartbeatInterval: e.cfg.heartbeat,
	}), s.handle,
		consume.WithKgoOptions(append(opts, e.cfg.kgoOpts...)...),
		consume.OnAssigned(s.assigned), consume.OnRevoked(s.revoked), consume.OnLost(s.lost),
		consume.WithWait(s.wait), consume.WithMaxRecords(e.cfg.maxBatch),
		consume.Metered(e.meter), consume.SkipRedriven(DeadLetterConsumer),
		// The transaction in flight is finished or aborted by then; the
		// leave only hands over sooner than the session's expiry would.
		consume.BeforeLeave(func() { e.active.Store(false); e.m.setActive(false, nil) }),
		consume.LeaveWithin(leaveTimeout), consume.WithLogger(e.log), consume.WithRegisterer(e.cfg.reg))
	if err != nil {
		return fmt.Errorf("placement: group client: %w", err)
	}
	s.c = c
	e.log.Info("placement engine joining", "group", e.cfg.group, "transactional_id", e.cfg.txnID)
	return c.Run(ctx)
}

// assigned runs when the group gives this member partitions, before their
// offsets are fetched. The first assignment of a session makes this engine
// the active one: it fences the previous owner's transactional producer
// (InitProducerID aborts its open transaction and bumps the epoch) before
// anything is read, so the committed input offsets and the end of the
// decision log read afterwards agree, and no zombie can commit after them.
func (s *session) assigned(ctx context.Context, c *consume.Consumer, assigned map[string][]int32) {
	if len(assigned) == 0 {
		return
	}
	s.mu.Lock()
	done := s.fenced || s.fenceErr != nil
	s.mu.Unlock()
	if done {
		return
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	_, epoch, err := c.Session().Client().ProducerID(fctx)
	s.mu.Lock()
	if err != nil {
		s.fenceErr = fmt.Errorf("placement: fencing the previous engine (InitProducerID): %w", err)
	} else {
		s.fenced = true
	}
	s.mu.Unlock()
	if err != nil {
		s.stepDown()
	} else {
		s.log.Info("placement engine elected; previous engine fenced", "producer_epoch", epoch, "took", time.Since(start))
	}
	c.Wake()
}

func (s *session) revoked(_ context.Context, c *consume.Consumer, revoked map[string][]int32) {
	if len(revoked) == 0 {
		return
	}
	s.endLeadership(c, "revoked")
}

func (s *session) lost(_ context.Context, c *consume.Consumer, _ map[string][]int32) {
	s.endLeadership(c, "lost")
}

func (s *session) endLeadership(c *consume.Consumer, how string) {
	s.mu.Lock()
	first := !s.ended
	s.ended = true
	s.mu.Unlock()
	s.stepDown()
	s.e.active.Store(false)
	s.e.m.setActive(false, nil)
	if first {
		s.log.Info("placement engine inputs " + how + "; standing down")
	}
	c.Wake()
}

func (s *session) status() (fenced, ended bool, fenceErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fenced, s.ended, s.fenceErr
}

// wait is how long the next poll may wait for inputs: until the next tick
// once active, a second before.
func (s *session) wait() time.Duration {
	if s.st == nil {
		return time.Second
	}
	return min(time.Second, max(time.Millisecond, time.Until(s.nextTick)))
}

// handle is the session's handler, called after every poll (also one that
// brought nothing: ticks run there). Elected, it restores before deciding;
// active, it decides the poll's inputs, and a tick when one is due, in
// one transaction with their offsets.
func (s *session) handle(ctx context.Context, b *consume.Batch) error {
	fenced, ended, fenceErr := s.status()
	switch {
	case ended:
		return errLeadership // the transaction session would abort anyway
	case fenceErr != nil:
		return fenceErr
	case b.Fetches.NumRecords() > 0 && !fenced:
		// Records only arrive for assigned partitions, and their
		// offsets are fetched only after the fence: unreachable.
		return errors.New("placement: records polled before the fence")
	}
	recs := orderBatch(b.Records)
	s.measure(b.Fetches)
	if fenced && s.st == nil {
		// Elected (or the last transaction aborted): restore before
		// deciding.
		if err := s.restoreRetrying(ctx); err != nil {
			return err
		}
	}
	if s.st == nil {
		return nil
	}
	tick := !time.Now().Before(s.nextTick) && !s.behind()
	if len(recs) == 0 && !tick {
		return nil
	}
	return s.transact(ctx, b, recs, tick)
}

// measure notes how far behind each fetched partition's last fetch left
// it: ticks wait while inputs are known to wait (behind).
func (s *session) measure(fs kgo.Fetches) {
	polled := time.Now()
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		end := kafka.FetchEnd(p)
		if n := len(p.Records); n > 0 && end >= 0 {
			s.lag[tpKey{p.Topic, p.Partition}] = lagAt{end - (p.Records[n-1].Offset + 1), polled}
		}
	})
}

// orderBatch returns the polled records in the order they are decided: a
// merge of the partitions (each kept in offset order, so per-key order
// holds) by record timestamp, ties by topic, partition and offset. The
// order depends only on the records, not on how the fetches happened to
// arrive, so an engine re-deciding an aborted batch after a failover
// (from the same committed state, with the same records and possibly
// later ones) decides the same inputs in the same order and writes
// byte-identical records. It also decides inputs produced close together
// on different topics (a plan change and a mailbox added) in the order
// they were produced. recs are a poll's records in fetch order (each
// partition's in offset order).
func orderBatch(recs []*kgo.Record) []*kgo.Record {
	var parts [][]*kgo.Record
	index := map[tpKey]int{}
	for _, r := range recs {
		k := tpKey{r.Topic, r.Partition}
		i, ok := index[k]
		if !ok {
			i = len(parts)
			index[k] = i
			parts = append(parts, nil)
		}
		parts[i] = append(parts[i], r)
	}
	if len(parts) <= 1 {
		return recs
	}
	before := func(a, b *kgo.Record) bool {
		if !a.Timestamp.Equal(b.Timestamp) {
			return a.Timestamp.Before(b.Timestamp)
		}
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		if a.Partition != b.Partition {
			return a.Partition < b.Partition
		}
		return a.Offset < b.Offset
	}
	out := make([]*kgo.Record, 0, len(recs))
	for len(out) < len(recs) {
		best := -1
		for i, p := range parts {
			if len(p) > 0 && (best < 0 || before(p[0], parts[best][0])) {
				best = i
			}
		}
		out = append(out, parts[best][0])
		parts[best] = parts[best][1:]
	}
	return out
}

type tpKey struct {
	topic     string
	partition int32
}

type lagAt struct {
	behind int64 // records after the last one fetched, to the end as fetched
	at     time.Time
}

// lagFresh bounds how long a partition's measured backlog holds back ticks:
// a partition with a backlog is fetched again within it, and a measure
// that cannot be refreshed (a trailing control record, say) must not hold
// ticks back for ever.
const lagFresh = 2 * time.Second

// behind reports whether the inputs are known to have a backlog. Ticks wait
// while they do: a tick at the clock's time ahead of heartbeats still
// waiting to be read would declare live workers dead.
func (s *session) behind() bool {
	for _, l := range s.lag {
		if l.behind > 0 && time.Since(l.at) < lagFresh {
			return true
		}
	}
	return false
}

// restoreRetrying restores, and when that fails (the snapshotter's
// Postgres or the broker down) tries again with backoff for as long as
// this engine keeps its inputs. Ending the session instead would hand the
// inputs to a standby that fails the same way: leadership would bounce
// between engines for the whole outage, each election a rebalance.
func (s *session) restoreRetrying(ctx context.Context) error {
	bo := backoff.New(restoreBackoff, nil)
	for {
		err := s.restore(ctx)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		s.e.m.restoreFailures.Inc()
		wait := bo.Next()
		s.log.Warn("restore failed; retrying while this engine holds the inputs", "err", err, "in", wait)
		if backoff.Sleep(s.lead, wait) != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err // the inputs were revoked or lost, or the fence failed
		}
	}
}

// restore rebuilds the state: checkpoint, then the decision log to its end.
// The input offsets were committed in the transactions that wrote the
// log, so the group resumes exactly after the last input the log holds.
func (s *session) restore(ctx context.Context) error {
	e := s.e
	e.active.Store(false)
	e.m.setActive(false, nil)
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, e.cfg.restoreTimeout)
	defer cancel()
	r, err := restore(rctx, e.kcfg, e.cfg.placement, e.cfg.snapshotter)
	if err != nil {
		return err
	}
	if err := s.checkOffsets(rctx, r); err != nil {
		return err
	}
	s.st, s.lastID = r.state, r.lastID
	// The log holds no heartbeat that changed nothing: every restored
	// worker gets a whole liveness window on this engine's clock to be
	// heard again before a tick may declare it dead.
	s.granted, s.carried = e.cfg.now(), nil
	s.st.GrantLiveness(s.granted)
	s.workers.reset()
	for _, id := range r.workers {
		s.workers.update(s.st, id)
	}
	s.updatePending(true)
	s.nextTick = time.Now().Add(e.cfg.tick)
	s.restores++
	took := time.Since(start)
	e.m.restore.Observe(took.Seconds())
	e.m.restoreLen.Set(float64(r.decisions))
	workers, mailboxes, refused := s.st.Counts()
	s.log.Info("placement engine active", "restored_from", r.checkpoint, "log_end", r.end, "decisions_folded", r.decisions,
		"workers", workers, "mailboxes", mailboxes, "refused", refused, "took", took, "restores", s.restores,
		"checkpoint_load", r.loadTook, "state_build", r.stateTook, "log_fold", r.logTook)
	if lv := s.st.Liveness(); lv.Holding {
		s.log.Warn("placement liveness is held (restored): no worker dies for silence until heartbeats flow again",
			"held_since", lv.HeldSince, "silent_workers", lv.Silent, "live_workers", lv.Live)
	}
	e.active.Store(true)
	e.m.setActive(true, s.st)
	return nil
}

// checkOffsets refuses to decide when the decision log holds committed
// decisions but the group has no committed input offsets (the group was
// deleted or renamed): the inputs would be decided a second time on top of
// a state that already holds them.
func (s *session) checkOffsets(ctx context.Context, r *restored) error {
	if !r.nonEmpty {
		return nil
	}
	offs, err := kadm.NewClient(s.c.Client()).FetchOffsets(ctx, s.e.cfg.group)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		return fmt.Errorf("placement: fetching the group's committed offsets: %w", err)
	}
	for _, t := range s.e.kcfg.Namespace.Topics(topics.DomainTopics()...) {
		found := false
		offs.Each(func(o kadm.OffsetResponse) {
			if o.Topic == t && o.At >= 0 {
				found = true
			}
		})
		if found {
			return nil
		}
	}
	return fmt.Errorf("placement: the decision log holds %d decisions but group %q has no committed input offsets; refusing to decide the inputs twice (restore the group's offsets or rebuild the log)", r.decisions, s.e.cfg.group)
}

// idleCommitEvery: inputs that decide nothing (user.active, heartbeats
// that change nothing) need no transaction of their own; their offsets
// ride with the next transaction, or are committed alone after this long
// (by the next poll or tick), so a quiet fleet's position still moves.
const idleCommitEvery = time.Second

// transact decides recs (and a tick) and writes the decisions with the
// input offsets in one transaction. The state is folded as the decisions
// are made; when the transaction does not commit, the state is dropped
// and the next handler call restores it from the log.
func (s *session) transact(ctx context.Context, cb *consume.Batch, recs []*kgo.Record, tick bool) error {
	e := s.e
	b, err := s.decide(recs, tick)
	if err != nil {
		// The state holds decisions that will never be written, and the
		// same inputs would fail again: stop deciding (the session ends,
		// nothing is committed, and a later session retries from the log).
		s.st = nil
		e.m.aborts.WithLabelValues("decider").Inc()
		return err
	}
	idle := len(recs) == 0 && len(s.carried) == 0
	if len(b.out) == 0 && (idle || time.Since(s.lastCommit) < idleCommitEvery) {
		// Nothing to write; offsets, if any, ride with the next
		// transaction, and so do the inputs in its Commit.
		s.carried = append(s.carried, b.c.Inputs...)
		return nil
	}
	b.c.Inputs = append(s.carried, b.c.Inputs...)
	s.carried = nil
	committed, err := s.write(ctx, cb, b.out)
	if err != nil || !committed {
		s.st = nil
		return err
	}
	s.committed(b)
	return nil
}

// batch is what one transaction decided.
type batch struct {
	c       Commit
	out     []*kgo.Record
	decided []domain.PlacementDecision
	dead    []string
}

// decide folds a poll's inputs (and a tick) into the state and encodes the
// decisions and dead letters to write. A panic of the decider is an error.
func (s *session) decide(recs []*kgo.Record, tick bool) (b batch, err error) {
	e := s.e
	b.c.Tick = tick
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("placement: the decider failed: %v", p)
		}
	}()
	// One clock reading for the batch: inputs stamped ahead of it are
	// decided at it (domain.TrustedTime).
	now := e.cfg.now()
	for _, r := range recs {
		ev, derr := topics.Decode(r)
		if derr != nil {
			code := domain.ErrorCode(derr)
			b.out = append(b.out, dlq.NewRecord(s.e.kcfg.Namespace, r, dlq.Failure{Consumer: DeadLetterConsumer, Code: code, Err: derr.Error(), Attempts: 1}))
			b.dead = append(b.dead, string(code))
			s.log.Warn("input sent to the DLQ", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "code", code)
			continue
		}
		in := placement.EventInput(ev, r.Timestamp, now)
		ds := s.st.Apply(in)
		// The decision log names its cause by key (a UUID: the event's id,
		// or one derived from a producer's other id; domain.EventKey).
		cause := topics.Cause{ID: ev.Key(), Type: ev.Type, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}
		if b.out, err = s.encode(b.out, ds, cause, in.At); err != nil {
			return b, err
		}
		b.decided = append(b.decided, ds...)
		b.c.Inputs = append(b.c.Inputs, Input{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, EventID: ev.Key(), Produced: r.Timestamp, At: in.At, Decisions: len(ds)})
	}
	b.c.Granted = s.granted
	if tick {
		b.c.TickAt = now
		ds := s.st.Apply(placement.Tick(now))
		if b.out, err = s.encode(b.out, ds, topics.Cause{ID: topics.CauseTick, Type: topics.CauseTick}, now); err != nil {
			return b, err
		}
		b.decided = append(b.decided, ds...)
		s.nextTick = time.Now().Add(e.cfg.tick)
		if e.cfg.ticked != nil {
			e.cfg.ticked(now)
		}
	}
	b.c.Decisions, b.c.DeadLetters = len(b.decided), len(b.dead)
	return b, nil
}

// write produces out in one Kafka transaction with the inputs' offsets
// (the batch's: records redriven for other consumers, which the runtime
// skipped, included). Not committed without an error: the transaction was
// aborted (a produce failed, the group rebalanced); the caller restores
// from the log.
func (s *session) write(ctx context.Context, cb *consume.Batch, out []*kgo.Record) (committed bool, err error) {
	e := s.e
	// The transaction in flight finishes even when ctx ends.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.txnTimeout)
	defer cancel()
	var perr error
	committed, err = cb.TransactTry(wctx, func(ctx context.Context) kgo.TransactionEndTry {
		perr = produce(ctx, cb.Consumer().Client(), out)
		if e.cfg.beforeEnd != nil {
			e.cfg.beforeEnd()
		}
		// Commit only if every record was written.
		return kgo.TransactionEndTry(perr == nil)
	})
	switch {
	case err != nil:
		e.m.aborts.WithLabelValues("end_error").Inc()
		return false, fmt.Errorf("placement: transaction: %w", err)
	case !committed && perr != nil:
		s.log.Warn("transaction aborted after a produce error; restoring", "err", perr)
		e.m.aborts.WithLabelValues("produce_error").Inc()
	case !committed:
		s.log.Info("transaction aborted (group rebalanced, membership lost or offset commit refused); restoring")
		e.m.aborts.WithLabelValues("not_committed").Inc()
	}
	return committed, nil
}

// produce writes out and returns the first produce error; Flush waits for
// every promise, so the error is final once it returns.
func produce(ctx context.Context, cl *kgo.Client, out []*kgo.Record) error {
	var (
		mu   sync.Mutex
		perr error
	)
	for _, r := range out {
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			mu.Lock()
			if perr == nil {
				perr = err
			}
			mu.Unlock()
		})
	}
	if err := cl.Flush(ctx); err != nil {
		mu.Lock()
		if perr == nil {
			perr = err
		}
		mu.Unlock()
	}
	mu.Lock()
	defer mu.Unlock()
	return perr
}

// committed records a committed batch: metrics, the worker view, the
// pending gauge and the commit hook.
func (s *session) committed(b batch) {
	e := s.e
	now := time.Now()
	s.lastCommit = now
	b.c.At = now
	e.m.commits.Inc()
	for _, d := range b.decided {
		m := d.Meta()
		e.m.decisions.WithLabelValues(decisionKind(d.EventType()), string(m.Reason)).Inc()
		switch d := d.(type) {
		case *domain.PlacementWorkerPromoted:
			e.m.promotions.Inc()
		case *domain.PlacementMigrated:
			e.m.migrations.Inc()
		case *domain.PlacementLivenessHeld:
			e.m.holds.Inc()
			s.log.Warn("placement liveness held: too many workers silent at once, no worker dies for silence until heartbeats flow again",
				"silent_workers", d.Silent, "live_workers", d.Live, "share_permille", d.SharePermille, "threshold_permille", d.ThresholdPermille)
		case *domain.PlacementLivenessResumed:
			s.log.Warn("placement liveness resumed", "reason", d.Reason, "held_since", d.HeldSince,
				"silent_workers", d.Silent, "live_workers", d.Live)
		}
		if id, ok := workerOf(d); ok {
			s.workers.update(s.st, id)
		}
	}
	e.m.setActive(true, s.st)
	for _, code := range b.dead {
		e.m.deadLetter.WithLabelValues(code).Inc()
	}
	// The runtime moves the lag past the batch (consume.Metered); the
	// latency is observed here, where the decisions committed.
	for _, in := range b.c.Inputs {
		if !in.Produced.IsZero() {
			e.meter.Applied(now, in.Produced)
		}
	}
	s.updatePending(len(b.decided) > 0 && now.Sub(s.lastPending) >= time.Second)
	for _, fn := range e.cfg.committed {
		fn(b.c)
	}
}

// encode appends the records of one input's decisions to out.
func (s *session) encode(out []*kgo.Record, ds []domain.PlacementDecision, cause topics.Cause, at time.Time) ([]*kgo.Record, error) {
	if len(ds) == 0 {
		return out, nil
	}
	cause.Count = len(ds)
	key := CauseKey(cause, at.Round(0).UTC(), s.lastID)
	for i, d := range ds {
		cause.Index = i
		id := DecisionID(d.Meta().At, key, i)
		r, err := topics.EncodeDecision(topics.Decision{ID: id, Source: s.e.cfg.source, Data: d, Cause: cause})
		if err != nil {
			return out, fmt.Errorf("placement: encoding %s: %w", d.EventType(), err)
		}
		r.Topic = s.e.kcfg.Topic(topics.PlacementDecisions)
		out = append(out, r)
		s.lastID = id
	}
	return out, nil
}

func (s *session) updatePending(now bool) {
	if !now || s.st == nil {
		return
	}
	s.lastPending = time.Now()
	s.e.m.pending.Set(float64(len(s.st.Pending())))
}
