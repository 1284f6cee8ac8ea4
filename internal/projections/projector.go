package projections

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/consume"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/sla"
)

// RetryPolicy bounds how a projector retries.
type RetryPolicy struct {
	// Attempts is how many times a single event whose apply fails
	// permanently is tried before it goes to the DLQ. Default 3.
	Attempts int
	// Backoff is the first wait between attempts; it doubles each time.
	// Default 100ms.
	Backoff time.Duration
	// MaxBackoff caps the wait, including between retries of transient
	// failures, which are retried until they succeed: it is how long a
	// projector may take to notice that Postgres is back. Default 2s.
	MaxBackoff time.Duration
}

// DefaultRetryPolicy is the policy used unless WithRetry says otherwise.
var DefaultRetryPolicy = RetryPolicy{Attempts: 3, Backoff: 100 * time.Millisecond, MaxBackoff: 2 * time.Second}

// DefaultBatchSize is the most records applied in one transaction, unless
// the projector is catching up (catchUpGrowth).
const DefaultBatchSize = 4000

// catchUpGrowth is how many times its batch size a projector's
// transactions may grow to while it catches up. Larger transactions cost
// Postgres less per record (fewer commits and statements, longer COPYs):
// 6–15% less Postgres CPU per event in the registry benchmark, a quarter
// or more for its statements alone (BENCHMARKS.md, "Where the bound is").
// They start at the batch size, so that the first transaction of a
// backlog is not held back by a large first fetch, and return to it once
// the projector has caught up, where a small backlog applies in small
// transactions anyway.
const catchUpGrowth = 4

// fetchMaxBytes sizes fetches to batches of batch records, taking a domain
// event to be about 128 bytes compressed.
func fetchMaxBytes(batch int) int32 {
	return int32(min(max(batch, 512)*128, 50<<20))
}

// Option configures a Projector.
type Option func(*config)

type config struct {
	logger      *slog.Logger
	reg         prometheus.Registerer
	batchSize   int
	retry       RetryPolicy
	now         func() time.Time
	group       kafka.GroupConfig
	revokeGrace time.Duration
	txTimeout   time.Duration
	pollWait    time.Duration
	commitEvery time.Duration
	kgoOpts     []kgo.Opt
	committed   func(events []domain.Event)
	syncCommit  bool
	concurrency int
	// serialWrites: WithSerialWrites.
	serialWrites bool
	// dedupeWindow: how long applied event ids are kept (dedupe.go).
	dedupeWindow time.Duration
}

// WithSynchronousCommit makes every transaction wait for its WAL flush. The
// default does not: a transaction's rows and offsets commit or vanish
// together, so a commit lost to a Postgres crash is simply projected again
// from the log, and nothing is lost or applied twice either way.
func WithSynchronousCommit() Option { return func(c *config) { c.syncCommit = true } }

// WithCommitted calls fn after each transaction commits, with the events it
// newly applied (duplicates excluded), partition by partition in log order.
// Calls never overlap, but they come from the goroutines of the
// transactions in flight (see WithConcurrency), and a partition's may
// interleave with another's. fn must be quick; benchmarks use it to time
// publish to projected.
func WithCommitted(fn func(events []domain.Event)) Option {
	return func(c *config) { c.committed = fn }
}

// DefaultConcurrency is how many batches a projector has in hand at once
// unless WithConcurrency says otherwise.
const DefaultConcurrency = 2

// WithConcurrency sets how many batches the projector has in hand at once,
// each on partitions no other holds (so at most one per partition,
// whatever n is), each in a transaction of its own on its own connection
// (but see WithSerialWrites). Default DefaultConcurrency; 1 applies one
// batch after another. Apply is then called from as many goroutines at
// once, on disjoint partitions.
func WithConcurrency(n int) Option { return func(c *config) { c.concurrency = n } }

// WithSerialWrites has a Registry projector write one transaction at a
// time while its other lanes fold and encode their next batches (see
// Registry.prepare). Transactions side by side insert at the same right
// edges of the same indexes (UUIDv7 keys, the applied ids, an org's
// mailboxes); one at a time they cost Postgres about a fifth less CPU per
// event, but a projection then uses at most one Postgres backend's worth of
// CPU, which on a shared machine lowered its throughput (BENCHMARKS.md,
// "One transaction at a time"). For a Postgres whose CPU is the scarce
// resource. Other projections ignore it.
func WithSerialWrites() Option { return func(c *config) { c.serialWrites = true } }

// WithLogger sets the logger. Default: discard.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithRegisterer registers the projector's metrics on reg. Projectors
// sharing a registerer share the series, labelled by projector.
func WithRegisterer(reg prometheus.Registerer) Option { return func(c *config) { c.reg = reg } }

// WithBatchSize sets the most records applied in one transaction, unless
// the projector is catching up: its transactions then grow to
// catchUpGrowth (4) times that. One poll takes up to a batch per
// transaction in flight (WithConcurrency) from the client.
func WithBatchSize(n int) Option { return func(c *config) { c.batchSize = n } }

// WithRetry sets the retry policy; zero fields keep their defaults.
func WithRetry(p RetryPolicy) Option { return func(c *config) { c.retry = p } }

// WithClock sets the clock stamped on projector_offsets.updated_at and
// applied_events.applied_at (the dedupe window's clock). Rows a
// projection writes take their times from events, never from this clock.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithGroup tunes group membership: session timeout, heartbeat interval,
// static instance id, and the group name (default
// GroupName(projection.Name()); a rebuild into a fresh schema uses its own),
// outside any namespace: the projector puts the group in its Kafka
// configuration's namespace. Topics are always the projection's.
func WithGroup(g kafka.GroupConfig) Option { return func(c *config) { c.group = g } }

// WithRevokeGrace sets how long a transaction in flight may run on once a
// rebalance waits for it or Run is stopped, before it is canceled (and its
// records applied later, by whoever owns them then). Default 5s.
func WithRevokeGrace(d time.Duration) Option { return func(c *config) { c.revokeGrace = d } }

// WithTxTimeout bounds one transaction, Apply included. A transaction that
// runs out is rolled back and retried. Default 60s.
func WithTxTimeout(d time.Duration) Option { return func(c *config) { c.txTimeout = d } }

// WithKgoOptions adds franz-go options to the consumer (tests use it for
// faster group timings).
func WithKgoOptions(opts ...kgo.Opt) Option {
	return func(c *config) { c.kgoOpts = append(c.kgoOpts, opts...) }
}

// Projector runs one projection: it consumes the projection's topics in a
// consumer group and applies them to Postgres. See the package doc.
type Projector struct {
	proj Projection
	name string
	pool *pgxpool.Pool
	kcfg kafka.Config
	cfg  config
	m    *metrics
	// meter measures the projection as the consumer of its tier.
	meter *sla.Meter
	log   *slog.Logger

	committedMu sync.Mutex // serializes cfg.committed
	// writers holds the token of the Registry transaction in flight
	// (WithSerialWrites).
	writers chan struct{}

	mu        sync.Mutex
	running   bool
	closed    bool
	cancelRun context.CancelFunc
	runDone   chan struct{}
}

// New returns a projector of proj reading from the brokers in kcfg and
// writing through pool, in the schema the pool's search_path selects (which
// must hold the migrations' tables). It connects to nothing until Run.
func New(kcfg kafka.Config, pool *pgxpool.Pool, proj Projection, opts ...Option) (*Projector, error) {
	cfg := config{
		batchSize:   DefaultBatchSize,
		retry:       DefaultRetryPolicy,
		now:         time.Now,
		revokeGrace: 5 * time.Second,
		txTimeout:   60 * time.Second,
		pollWait:    time.Second,
		commitEvery: 5 * time.Second,
		concurrency: DefaultConcurrency,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if proj == nil || pool == nil {
		return nil, errors.New("projections: New needs a projection and a pool")
	}
	if proj.Name() == "" || len(proj.Topics()) == 0 {
		return nil, errors.New("projections: a projection needs a name and topics")
	}
	if len(kcfg.Brokers) == 0 {
		return nil, errors.New("projections: no brokers")
	}
	if _, err := sla.Lookup(sla.Name(proj.Name())); err != nil {
		return nil, fmt.Errorf("projections: %w: every consumer declares its tier in internal/sla", err)
	}
	if cfg.batchSize <= 0 {
		cfg.batchSize = DefaultBatchSize
	}
	if cfg.concurrency <= 0 {
		cfg.concurrency = DefaultConcurrency
	}
	if cfg.retry.Attempts <= 0 {
		cfg.retry.Attempts = DefaultRetryPolicy.Attempts
	}
	if cfg.retry.Backoff <= 0 {
		cfg.retry.Backoff = DefaultRetryPolicy.Backoff
	}
	if cfg.retry.MaxBackoff <= 0 {
		cfg.retry.MaxBackoff = DefaultRetryPolicy.MaxBackoff
	}
	if cfg.txTimeout <= 0 {
		cfg.txTimeout = 60 * time.Second
	}
	if cfg.revokeGrace <= 0 {
		cfg.revokeGrace = 5 * time.Second
	}
	if cfg.dedupeWindow <= 0 {
		cfg.dedupeWindow = DefaultDedupeWindow
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.reg == nil {
		cfg.reg = prometheus.NewRegistry()
	}
	if cfg.group.Group == "" {
		cfg.group.Group = GroupName(proj.Name())
	}
	// The group and topics as the broker names them.
	cfg.group.Group = kcfg.Group(cfg.group.Group)
	cfg.group.Topics = kcfg.Namespace.Topics(proj.Topics()...)
	if kcfg.ClientID == "" {
		kcfg.ClientID = "mailplane-projector-" + proj.Name()
	}
	log := cfg.logger.With("projector", proj.Name())
	return &Projector{
		proj:    proj,
		name:    proj.Name(),
		pool:    pool,
		kcfg:    kcfg.WithLogger(log),
		cfg:     cfg,
		m:       newMetrics(cfg.reg),
		meter:   sla.NewMeter(cfg.reg, sla.Name(proj.Name()), sla.WithClock(cfg.now)),
		log:     log,
		writers: make(chan struct{}, 1),
	}, nil
}

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("projections: projector closed")

// Run consumes and applies until ctx is done, then finishes the transaction
// in flight (within the revoke grace), leaves the group and returns nil. It
// returns an error only if it could not start. A projector runs once at a
// time.
func (p *Projector) Run(ctx context.Context) error {
	p.mu.Lock()
	switch {
	case p.closed:
		p.mu.Unlock()
		return ErrClosed
	case p.running:
		p.mu.Unlock()
		return errors.New("projections: projector already running")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.running, p.cancelRun, p.runDone = true, cancel, make(chan struct{})
	done := p.runDone
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.running, p.cancelRun = false, nil
		p.mu.Unlock()
		close(done)
	}()

	s := &session{
		p:         p,
		parts:     map[topicPartition]*partition{},
		committed: map[topicPartition]int64{},
		yieldC:    make(chan struct{}, 1),
		batch:     p.cfg.batchSize,
	}
	s.qcond = sync.NewCond(&s.qmu)
	p.m.batchLimit.WithLabelValues(p.name).Set(float64(s.batch))
	dlqCl, err := kafka.NewProducer(p.kcfg)
	if err != nil {
		return fmt.Errorf("projections: DLQ producer: %w", err)
	}
	defer dlqCl.Close()
	s.dlq = dlqCl

	cons, err := s.consumer()
	if err != nil {
		return err
	}
	s.cl, s.cons = cons.Client(), cons
	p.log.InfoContext(ctx, "projector starting", "group", p.cfg.group.Group, "topics", p.cfg.group.Topics)

	// The prune has its own connection and goroutine: its deletes never
	// wait for the poll loop, nor the poll loop for them.
	pruneCtx, stopPrune := context.WithCancel(ctx)
	var pruning sync.WaitGroup
	pruning.Go(func() { p.pruneLoop(pruneCtx) })

	// Rounds until ctx is done; then shutdown records the positions and
	// the group is left within leaveTimeout (the handler never fails).
	_ = cons.Run(ctx)

	stopPrune()
	pruning.Wait()
	p.log.Info("projector stopped")
	return nil
}

// consumer declares the projector's member of its group on the consumer
// runtime: Postgres says where each partition resumes, a round (see
// round) handles each poll, and the poll waits less, or not at all, while
// records wait to be applied.
func (s *session) consumer() (*consume.Consumer, error) {
	p := s.p
	opts := append([]kgo.Opt{
		// Polls and rebalance callbacks take turns (the runtime's group
		// blocks rebalances on poll): a round applies what it polled
		// before it allows a rebalance, so a revoke never finds a
		// transaction in flight, and SetOffsets is safe.
		kgo.OnPartitionsCallbackBlocked(s.callbackBlocked),
		// Postgres says where each partition resumes; the group's
		// committed offsets are only there for lag dashboards.
		kgo.AdjustFetchOffsetsFn(s.adjustOffsets),
		kgo.WithHooks(decodeHook{consumer: p.name}),
		// About a batch per lane per fetch, and half a batch per
		// partition, so that a backlog's fetch spans partitions enough
		// for every lane. The client fetches again only once a fetch is
		// drained, and decodeHook decodes a whole fetch before any of it
		// can be polled: a fetch the size of a round is decoded while the
		// transactions before it run, where a large one (the default is
		// 50 MiB) would leave Postgres idle while it is decoded.
		// (adaptBatch scales both with the batch limit.)
		kgo.FetchMaxBytes(fetchMaxBytes(p.cfg.batchSize * p.cfg.concurrency)),
		kgo.FetchMaxPartitionBytes(fetchMaxBytes(p.cfg.batchSize) / 2),
	}, p.cfg.kgoOpts...)
	c, err := consume.New(p.kcfg, p.name, consume.Group(p.cfg.group), s.round,
		consume.WithKgoOptions(opts...),
		consume.OnAssigned(func(ctx context.Context, c *consume.Consumer, m map[string][]int32) { s.assigned(ctx, c.Client(), m) }),
		consume.OnRevoked(func(ctx context.Context, c *consume.Consumer, m map[string][]int32) { s.revoked(ctx, c.Client(), m) }),
		consume.OnLost(func(ctx context.Context, c *consume.Consumer, m map[string][]int32) { s.lost(ctx, c.Client(), m) }),
		consume.WithWait(s.wait), consume.WithMaxRecordsFunc(s.pollSize),
		// The positions are Postgres's, not the fetch's.
		consume.MeteredByEffect(p.meter),
		// Everything applied is committed: leaving the group only hands
		// the partitions over sooner than the session's expiry would.
		consume.BeforeLeave(s.shutdown), consume.LeaveWithin(leaveTimeout),
		consume.WithLogger(p.log), consume.WithRegisterer(p.cfg.reg))
	if err != nil {
		return nil, fmt.Errorf("projections: consumer: %w", err)
	}
	return c, nil
}

// leaveTimeout bounds leaving the group at the end of Run: a process
// stopping must be gone well within its grace period (compose's, and the
// production-shape test's 10 s), and a leave can wait on the coordinator
// for a rebalance timeout (kafka.CloseWithin).
const leaveTimeout = 3 * time.Second

// Close stops a running Run and waits for it to return; later Runs fail
// with ErrClosed. It is safe to call more than once.
func (p *Projector) Close() {
	p.mu.Lock()
	p.closed = true
	cancel, done := p.cancelRun, p.runDone
	p.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	p.meter.Close()
}

// Name returns the projection's name.
func (p *Projector) Name() string { return p.name }

type topicPartition struct {
	topic     string
	partition int32
}

// session is one Run: the clients and the partitions currently owned.
type session struct {
	p    *Projector
	cl   *kgo.Client
	cons *consume.Consumer // polls (the lanes take what is buffered through it)
	dlq  *kgo.Client

	// mu guards the partitions. A round (the runtime's handler) holds it
	// from the end of a poll to just before the runtime's AllowRebalance
	// (the round's lanes work under it, sharing
	// qmu); the group callbacks and adjustOffsets take it too (see
	// yieldLock). BlockRebalanceOnPoll already keeps the
	// callbacks out of that stretch; the lock covers what it does not
	// (adjustOffsets, and a poll that returned nothing).
	mu      sync.Mutex
	parts   map[topicPartition]*partition
	order   []*partition // parts sorted by topic and partition: batch order
	closing bool

	// The group waits for the poll loop: a callback at the poll gate
	// (blocked), or a callback or adjustOffsets for mu (waiting counts
	// them). The loop then ends its round after the transaction in
	// flight; yieldC wakes the round's watcher, which cancels that
	// transaction if it outlasts the revoke grace.
	blocked atomic.Bool
	waiting atomic.Int32
	yieldC  chan struct{}

	lastCommit time.Time // poll loop only
	// batch is the most records a transaction takes now (adaptBatch):
	// set in accept, so under mu between rounds and under qmu in them.
	batch int

	// A round's lanes (see drain) share qmu: it guards the partitions'
	// busy flags and incoming lists, the queues of partitions no lane
	// holds, inflight, and the client's polls and seeks. qcond signals a
	// lane handing its partitions back.
	qmu      sync.Mutex
	qcond    *sync.Cond
	inflight int
	roundEnd time.Time
	// gateHeld says the round's poll returned fetches, so the client
	// blocks rebalances until AllowRebalance (BlockRebalanceOnPoll) and
	// lanes may poll too. After a poll that returned nothing a rebalance
	// may be under way, its callback waiting for mu, which the round
	// holds: a lane's poll would wait for that rebalance, and the round
	// for the lane.
	gateHeld bool

	commitMu  sync.Mutex
	committed map[topicPartition]int64 // last offsets committed to Kafka
}

// callbackBlocked is the OnPartitionsCallbackBlocked hook: a callback
// waits at the poll gate for a round that polled records.
func (s *session) callbackBlocked(context.Context, *kgo.Client) {
	s.blocked.Store(true)
	s.wakeWatcher()
}

// yieldLock takes mu for the group. A round that polled nothing holds mu
// but not the poll gate, so the group asks it to yield here too.
func (s *session) yieldLock() {
	s.waiting.Add(1)
	s.wakeWatcher()
	s.mu.Lock()
	s.waiting.Add(-1)
}

func (s *session) wakeWatcher() {
	select {
	case s.yieldC <- struct{}{}:
	default:
	}
}

// groupWaits reports whether the group waits for the poll loop.
func (s *session) groupWaits() bool { return s.blocked.Load() || s.waiting.Load() > 0 }

// round is the projector's handler of a poll: apply what came in (with
// what earlier rounds left, and what the lanes poll meanwhile: see
// drain); the runtime then allows a rebalance. The records of a poll,
// across partitions, share a transaction per lane.
func (s *session) round(ctx context.Context, b *consume.Batch) error {
	s.mu.Lock()
	s.gateHeld = len(b.Fetches) > 0
	s.accept(b.Fetches)
	rctx, cancel := s.roundContext(ctx)
	s.drain(ctx, rctx)
	cancel()
	s.housekeeping()
	var commit map[topicPartition]int64
	if time.Since(s.lastCommit) >= s.p.cfg.commitEvery {
		s.lastCommit = time.Now()
		commit = s.positions(s.order)
	}
	s.mu.Unlock()

	if commit != nil {
		s.commitKafka(ctx, s.cl, commit)
	}
	// A callback blocked at the poll gate runs once the runtime allows
	// the rebalance (and one still blocked will say so again); one
	// waiting for mu may still wait.
	s.blocked.Store(false)
	select {
	case <-s.yieldC:
	default:
	}
	if s.waiting.Load() > 0 {
		s.wakeWatcher()
	}
	return nil
}

// logFetchErrors logs the fetch errors of the lanes' polls (the runtime
// logs those of its own).
func (s *session) logFetchErrors(fs kgo.Fetches) {
	fs.EachError(func(topic string, partition int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return
		}
		s.p.log.Warn("fetch error", "topic", topic, "partition", partition, "err", err)
	})
}

// pollSize is the most records one poll takes: a batch per lane.
func (s *session) pollSize() int { return s.batch * s.p.cfg.concurrency }

// adaptBatch sets the batch limit of the next rounds from how far behind
// the owned partitions are: the records queued (for a partition in
// flight, as many as when its lane took it: the lane moves its queue), and
// those past the last fetched up to the high watermark the fetches told.
// While that backlog is more than two rounds at the current limit, the
// limit doubles, up to catchUpGrowth times the batch size; once it fits
// one round at the batch size, the limit is back to the batch size.
// Fetches are resized with it. Called by accept, whose callers keep the
// lanes from reading the limit meanwhile.
func (s *session) adaptBatch() {
	base, lanes := s.p.cfg.batchSize, s.p.cfg.concurrency
	var backlog int64
	for _, pt := range s.order {
		backlog += int64(len(pt.incoming))
		if pt.busy {
			backlog += int64(pt.held)
		} else {
			backlog += int64(len(pt.queue))
		}
		if pt.fetched > 0 && pt.hwm > pt.fetched {
			backlog += pt.hwm - pt.fetched
		}
	}
	next := s.batch
	switch {
	case backlog > int64(2*s.batch*lanes):
		next = min(2*s.batch, catchUpGrowth*base)
	case backlog <= int64(base*lanes):
		next = base
	}
	if next == s.batch {
		return
	}
	s.batch = next
	s.cl.UpdateFetchMaxBytes(fetchMaxBytes(next*lanes), fetchMaxBytes(next)/2)
	s.p.m.batchLimit.WithLabelValues(s.p.name).Set(float64(next))
}

// wait is how long a poll, of at most a batch per lane, waits for
// records: the poll wait, less when a failing partition's retry falls due
// sooner, and not at all when records are already waiting to be applied.
func (s *session) wait() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pollWait(time.Now())
}

func (s *session) pollWait(now time.Time) time.Duration {
	wait := s.p.cfg.pollWait
	for _, pt := range s.order {
		if len(pt.queue) == 0 {
			continue
		}
		if !pt.failing() {
			return 0
		}
		wait = min(wait, pt.retryAt.Sub(now))
	}
	return wait
}

// roundContext returns the context of a round's transactions. It is not
// canceled with ctx, so that the transaction in flight when Run is stopped
// or a rebalance waits can commit; but it is canceled the revoke grace
// after either, so that a stuck database holds neither up for long.
func (s *session) roundContext(ctx context.Context) (context.Context, context.CancelFunc) {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		select {
		case <-ctx.Done():
		case <-s.yieldC:
		case <-rctx.Done():
			return
		}
		t := time.NewTimer(s.p.cfg.revokeGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-rctx.Done():
		}
	}()
	return rctx, cancel
}

// housekeeping runs in the poll loop after a round: it pauses fetching of
// partitions whose records pile up (they are failing: a healthy partition's
// queue is emptied every round), resumes them once they drained, and
// updates the lag gauges.
func (s *session) housekeeping() {
	// A batch queued is all a partition needs to resume at full speed
	// once it recovers. The batch size, not the catch-up limit: when
	// Postgres is down every partition fails while the backlog grows,
	// and each may hold this much in memory.
	pauseAt, resumeBelow := s.p.cfg.batchSize, max(s.p.cfg.batchSize/2, 1)
	var pause, resume map[string][]int32
	add := func(m *map[string][]int32, pt *partition) {
		if *m == nil {
			*m = map[string][]int32{}
		}
		(*m)[pt.topic] = append((*m)[pt.topic], pt.id)
	}
	for _, pt := range s.order {
		switch {
		case !pt.paused && len(pt.queue) >= pauseAt:
			pt.paused = true
			add(&pause, pt)
		case pt.paused && len(pt.queue) < resumeBelow:
			pt.paused = false
			add(&resume, pt)
		}
	}
	if pause != nil {
		// Backpressure: a partition that cannot be applied (say its rows
		// are locked, or the database is down) stops being fetched
		// instead of growing without bound; the others flow on.
		s.cl.PauseFetchPartitions(pause)
		s.p.log.Debug("paused fetching of partitions that are behind", "paused", pause)
	}
	if resume != nil {
		s.cl.ResumeFetchPartitions(resume)
		s.p.log.Debug("resumed fetching", "resumed", resume)
	}
	s.updateLag()
}

// positions returns the Postgres offsets of parts.
func (s *session) positions(parts []*partition) map[topicPartition]int64 {
	out := make(map[topicPartition]int64, len(parts))
	for _, pt := range parts {
		if pt.next >= 0 {
			out[topicPartition{pt.topic, pt.id}] = pt.next
		}
	}
	return out
}

// commitKafka commits Postgres offsets to the group, for lag visibility in
// Kafka tools only: nothing reads them back.
func (s *session) commitKafka(ctx context.Context, cl *kgo.Client, positions map[topicPartition]int64) {
	// The poll loop, a revoke callback and shutdown may all commit.
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	offs := map[string]map[int32]kgo.EpochOffset{}
	for tp, next := range positions {
		if s.committed[tp] == next {
			continue
		}
		if offs[tp.topic] == nil {
			offs[tp.topic] = map[int32]kgo.EpochOffset{}
		}
		offs[tp.topic][tp.partition] = kgo.EpochOffset{Epoch: -1, Offset: next}
		s.committed[tp] = next
	}
	if len(offs) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var cerr error
	cl.CommitOffsetsSync(cctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) {
		cerr = err
	})
	if cerr != nil {
		s.p.log.Debug("committing offsets to Kafka for lag visibility failed", "err", cerr)
	}
}

// assigned adds the newly assigned partitions. Their offsets arrive in
// adjustOffsets, which franz-go calls next, before it fetches them.
func (s *session) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	s.yieldLock()
	defer s.mu.Unlock()
	if s.closing {
		return
	}
	n := 0
	for topic, ids := range assigned {
		for _, id := range ids {
			tp := topicPartition{topic, id}
			if _, ok := s.parts[tp]; ok {
				continue
			}
			s.parts[tp] = newPartition(topic, id, s.p.cfg.retry.Backoff)
			n++
		}
	}
	s.reorder()
	s.p.log.Info("partitions assigned", "count", n, "assigned", assigned)
}

// reorder rebuilds the batch order after the partitions changed.
func (s *session) reorder() {
	s.order = s.order[:0]
	for _, pt := range s.parts {
		s.order = append(s.order, pt)
	}
	slices.SortFunc(s.order, func(a, b *partition) int {
		if a.topic != b.topic {
			if a.topic < b.topic {
				return -1
			}
			return 1
		}
		return int(a.id) - int(b.id)
	})
}

const selectOffsetsSQL = `SELECT topic, partition, next_offset FROM projector_offsets WHERE projector = $1 AND topic = ANY($2)`

// adjustOffsets replaces the group's committed offsets with the ones in
// Postgres, written in the same transactions as the rows. A partition with
// no row starts at the beginning of the log.
func (s *session) adjustOffsets(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	topics := make([]string, 0, len(offsets))
	for t := range offsets {
		topics = append(topics, t)
	}
	rows, err := s.p.pool.Query(ctx, selectOffsetsSQL, s.p.name, topics)
	if err != nil {
		s.p.log.Error("reading projector offsets; the group will retry", "err", err)
		return nil, fmt.Errorf("read projector offsets: %w", err)
	}
	pg := map[topicPartition]int64{}
	var (
		topic string
		part  int32
		next  int64
	)
	_, err = pgx.ForEachRow(rows, []any{&topic, &part, &next}, func() error {
		pg[topicPartition{topic, part}] = next
		return nil
	})
	if err != nil {
		s.p.log.Error("reading projector offsets; the group will retry", "err", err)
		return nil, fmt.Errorf("read projector offsets: %w", err)
	}
	s.yieldLock()
	defer s.mu.Unlock()
	for t, parts := range offsets {
		for id := range parts {
			tp := topicPartition{t, id}
			next := pg[tp] // no row: 0, the start of the log
			parts[id] = kgo.NewOffset().At(next)
			if pt := s.parts[tp]; pt != nil {
				pt.restart(next, s.p.cfg.retry.Backoff)
			}
		}
	}
	return offsets, nil
}

func (s *session) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	positions := s.drop(cl, revoked)
	if len(positions) == 0 {
		return
	}
	s.p.log.Info("partitions revoked", "revoked", revoked)
	// The group still knows us: record where Postgres got to, for lag
	// dashboards.
	s.commitKafka(ctx, cl, positions)
}

func (s *session) lost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	if positions := s.drop(cl, lost); len(positions) > 0 {
		s.p.log.Warn("partitions lost", "lost", lost)
	}
}

// drop forgets the partitions in m, with the records queued for them, and
// returns their positions. Nothing of theirs is in flight: the poll loop
// applies only while it blocks rebalances. It uses the callback's client: a
// callback may run before Run has stored its own.
func (s *session) drop(cl *kgo.Client, m map[string][]int32) map[topicPartition]int64 {
	s.yieldLock()
	var parts []*partition
	for topic, ids := range m {
		for _, id := range ids {
			tp := topicPartition{topic, id}
			if pt, ok := s.parts[tp]; ok {
				parts = append(parts, pt)
				delete(s.parts, tp)
			}
		}
	}
	positions := s.positions(parts)
	if len(parts) > 0 {
		s.reorder()
	}
	s.mu.Unlock()
	// Paused partitions stay paused until resumed, even across
	// reassignment: resume them so that, if this member gets them back,
	// they are fetched.
	cl.ResumeFetchPartitions(m)
	return positions
}

// shutdown forgets every partition at the end of Run, after recording
// their positions in Kafka; the group is left afterwards by closing the
// client.
func (s *session) shutdown() {
	s.mu.Lock()
	s.closing = true
	positions := s.positions(s.order)
	s.parts, s.order = map[topicPartition]*partition{}, nil
	s.mu.Unlock()
	s.commitKafka(context.Background(), s.cl, positions)
}

// updateLag reports every owned partition's position, as Postgres holds
// it, to the runtime's meter (consume.MeteredByEffect: the runtime forgets
// revoked and lost partitions, and all when Run ends). Called with mu
// held, between rounds.
func (s *session) updateLag() {
	for _, pt := range s.order {
		s.cons.Position(pt.topic, pt.id, pt.position())
	}
}
