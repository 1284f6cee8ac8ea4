package projections

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/kafka"
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
	// failures, which are retried until they succeed. Default 10s.
	MaxBackoff time.Duration
}

// DefaultRetryPolicy is the policy used unless WithRetry says otherwise.
var DefaultRetryPolicy = RetryPolicy{Attempts: 3, Backoff: 100 * time.Millisecond, MaxBackoff: 10 * time.Second}

// DefaultBatchSize is the most records applied in one transaction.
const DefaultBatchSize = 1000

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
	committed   func(topic string, partition int32, events []domain.Event)
	syncCommit  bool
}

// WithSynchronousCommit makes every batch wait for its WAL flush. The
// default does not: a batch's rows and offsets commit or vanish together,
// so a commit lost to a Postgres crash is simply projected again from the
// log, and nothing is lost or applied twice either way.
func WithSynchronousCommit() Option { return func(c *config) { c.syncCommit = true } }

// WithCommitted calls fn after each batch's transaction commits, on the
// partition's goroutine, with the events newly applied (duplicates
// excluded). fn must be quick; benchmarks use it to time publish to
// projected.
func WithCommitted(fn func(topic string, partition int32, events []domain.Event)) Option {
	return func(c *config) { c.committed = fn }
}

// WithLogger sets the logger. Default: discard.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithRegisterer registers the projector's metrics on reg. Projectors
// sharing a registerer share the series, labelled by projector.
func WithRegisterer(reg prometheus.Registerer) Option { return func(c *config) { c.reg = reg } }

// WithBatchSize sets the most records applied in one transaction.
func WithBatchSize(n int) Option { return func(c *config) { c.batchSize = n } }

// WithRetry sets the retry policy; zero fields keep their defaults.
func WithRetry(p RetryPolicy) Option { return func(c *config) { c.retry = p } }

// WithClock sets the clock stamped on projector_offsets.updated_at. Rows a
// projection writes take their times from events, never from this clock.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithGroup tunes group membership: session timeout, heartbeat interval,
// static instance id, and the group name (default
// GroupName(projection.Name()); a replay into a fresh schema uses its own).
// Topics are always the projection's.
func WithGroup(g kafka.GroupConfig) Option { return func(c *config) { c.group = g } }

// WithRevokeGrace sets how long a revoked partition's in-flight transaction
// may run on before it is canceled. Default 5s.
func WithRevokeGrace(d time.Duration) Option { return func(c *config) { c.revokeGrace = d } }

// WithTxTimeout bounds one batch's transaction, Apply included. A
// transaction that runs out is rolled back and retried. Default 60s.
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
	log  *slog.Logger

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
	if cfg.batchSize <= 0 {
		cfg.batchSize = DefaultBatchSize
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
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.reg == nil {
		cfg.reg = prometheus.NewRegistry()
	}
	if cfg.group.Group == "" {
		cfg.group.Group = GroupName(proj.Name())
	}
	cfg.group.Topics = proj.Topics()
	if kcfg.ClientID == "" {
		kcfg.ClientID = "mailplane-projector-" + proj.Name()
	}
	return &Projector{
		proj: proj,
		name: proj.Name(),
		pool: pool,
		kcfg: kcfg,
		cfg:  cfg,
		m:    newMetrics(cfg.reg),
		log:  cfg.logger.With("projector", proj.Name()),
	}, nil
}

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("projections: projector closed")

// Run consumes and applies until ctx is done, then stops its partitions,
// leaves the group and returns nil. It returns an error only if it could not
// start. A projector runs once at a time.
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

	s := &session{p: p, ctx: ctx, parts: map[topicPartition]*partition{}}
	dlqCl, err := kafka.NewProducer(p.kcfg)
	if err != nil {
		return fmt.Errorf("projections: DLQ producer: %w", err)
	}
	defer dlqCl.Close()
	s.dlq = dlqCl

	opts := kafka.ConsumerOptions(p.kcfg, p.cfg.group,
		// Polls and rebalance callbacks take turns, so the poll loop hands
		// records only to partitions it owns and may call SetOffsets
		// safely (the franz-go goroutine-per-partition pattern).
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(s.assigned),
		kgo.OnPartitionsRevoked(s.revoked),
		kgo.OnPartitionsLost(s.lost),
		// Postgres says where each partition resumes; the group's
		// committed offsets are only there for lag dashboards.
		kgo.AdjustFetchOffsetsFn(s.adjustOffsets),
		kgo.WithLogger(kgoLogger{p.log}),
	)
	opts = append(opts, p.cfg.kgoOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("projections: consumer: %w", err)
	}
	s.cl = cl
	p.log.InfoContext(ctx, "projector starting", "group", p.cfg.group.Group, "topics", p.cfg.group.Topics)

	s.poll(ctx)

	s.shutdown()
	cl.CloseAllowingRebalance()
	s.wg.Wait()
	for _, t := range p.cfg.group.Topics {
		p.m.lag.DeleteLabelValues(p.name, t)
	}
	p.log.Info("projector stopped")
	return nil
}

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
}

// Name returns the projection's name.
func (p *Projector) Name() string { return p.name }

type topicPartition struct {
	topic     string
	partition int32
}

// session is one Run: the clients and the partitions currently owned.
type session struct {
	p   *Projector
	ctx context.Context
	cl  *kgo.Client
	dlq *kgo.Client
	wg  sync.WaitGroup

	mu         sync.Mutex
	parts      map[topicPartition]*partition
	closing    bool
	pollCancel context.CancelFunc
	lastCommit time.Time // poll loop only

	commitMu  sync.Mutex
	committed map[topicPartition]int64 // last offsets committed to Kafka
}

func (s *session) lookup(tp topicPartition) *partition {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.parts[tp]
}

// wake ends the current poll early, so housekeeping (resume, reseek) runs
// without waiting for records or the poll timeout.
func (s *session) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pollCancel != nil {
		s.pollCancel()
	}
}

func (s *session) poll(ctx context.Context) {
	maxPoll := s.p.cfg.batchSize * 4
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, s.p.cfg.pollWait)
		s.mu.Lock()
		s.pollCancel = cancel
		s.mu.Unlock()
		fs := s.cl.PollRecords(pctx, maxPoll)
		s.mu.Lock()
		s.pollCancel = nil
		s.mu.Unlock()
		cancel()
		if fs.IsClientClosed() {
			s.cl.AllowRebalance()
			return
		}
		fs.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			s.p.log.Warn("fetch error", "topic", topic, "partition", partition, "err", err)
		})
		var pause map[string][]int32
		touched := map[string]bool{}
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			if len(fp.Records) == 0 {
				return
			}
			pt := s.lookup(topicPartition{fp.Topic, fp.Partition})
			if pt == nil {
				// Not ours (any more): BlockRebalanceOnPoll makes this
				// unexpected, and the records will be read by the owner.
				return
			}
			touched[fp.Topic] = true
			if pt.enqueue(fp.Records, fp.HighWatermark, maxPoll) {
				if pause == nil {
					pause = map[string][]int32{}
				}
				pause[fp.Topic] = append(pause[fp.Topic], fp.Partition)
			}
		})
		for t := range touched {
			s.updateLag(t)
		}
		if pause != nil {
			// Backpressure: a partition whose applier is behind (say the
			// database is down) stops being fetched, instead of blocking
			// this loop and with it every other partition and rebalances.
			s.cl.PauseFetchPartitions(pause)
			s.p.log.Debug("paused fetching of partitions whose applier is behind", "paused", pause)
		}
		s.housekeeping(ctx)
		s.cl.AllowRebalance()
	}
}

// housekeeping runs in the poll loop between a poll and AllowRebalance, the
// one place where no rebalance callback can run concurrently.
func (s *session) housekeeping(ctx context.Context) {
	s.mu.Lock()
	parts := make([]*partition, 0, len(s.parts))
	for _, pt := range s.parts {
		parts = append(parts, pt)
	}
	s.mu.Unlock()

	var resume map[string][]int32
	for _, pt := range parts {
		if off, ok := pt.pendingReseek(); ok {
			s.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{pt.topic: {pt.id: {Epoch: -1, Offset: off}}})
			pt.reseeked(off)
			s.p.log.Warn("partition reseeked to its Postgres offset", "topic", pt.topic, "partition", pt.id, "offset", off)
		}
		if pt.shouldResume(s.p.cfg.batchSize * 2) {
			if resume == nil {
				resume = map[string][]int32{}
			}
			resume[pt.topic] = append(resume[pt.topic], pt.id)
		}
	}
	if resume != nil {
		s.cl.ResumeFetchPartitions(resume)
		s.p.log.Debug("resumed fetching", "resumed", resume)
	}
	if time.Since(s.lastCommit) >= s.p.cfg.commitEvery {
		s.lastCommit = time.Now()
		s.commitKafka(ctx, s.cl, parts)
	}
}

// commitKafka commits the Postgres offsets of parts to the group, for lag
// visibility in Kafka tools only: nothing reads them back.
func (s *session) commitKafka(ctx context.Context, cl *kgo.Client, parts []*partition) {
	// The poll loop, a revoke callback and shutdown may all commit.
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	offs := map[string]map[int32]kgo.EpochOffset{}
	if s.committed == nil {
		s.committed = map[topicPartition]int64{}
	}
	for _, pt := range parts {
		next := pt.position.Load()
		tp := topicPartition{pt.topic, pt.id}
		if next < 0 || s.committed[tp] == next {
			continue
		}
		if offs[pt.topic] == nil {
			offs[pt.topic] = map[int32]kgo.EpochOffset{}
		}
		offs[pt.topic][pt.id] = kgo.EpochOffset{Epoch: -1, Offset: next}
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

// assigned starts a goroutine per newly assigned partition. Their start
// offsets arrive in adjustOffsets, which franz-go calls next.
func (s *session) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	s.mu.Lock()
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
			pt := newPartition(s, topic, id)
			s.parts[tp] = pt
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				pt.run()
			}()
			n++
		}
	}
	s.p.log.Info("partitions assigned", "count", n, "assigned", assigned)
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
	for t, parts := range offsets {
		for id := range parts {
			tp := topicPartition{t, id}
			next, ok := pg[tp]
			if ok {
				parts[id] = kgo.NewOffset().At(next)
			} else {
				parts[id] = kgo.NewOffset().AtStart()
			}
			if pt := s.lookup(tp); pt != nil {
				pt.setStart(next)
			}
		}
	}
	return offsets, nil
}

func (s *session) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	parts := s.drop(cl, revoked)
	if len(parts) == 0 {
		return
	}
	s.p.log.Info("partitions revoked", "revoked", revoked)
	// The group still knows us: record where Postgres got to, for lag
	// dashboards.
	s.commitKafka(ctx, cl, parts)
}

func (s *session) lost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	if parts := s.drop(cl, lost); len(parts) > 0 {
		s.p.log.Warn("partitions lost", "lost", lost)
	}
}

// drop stops the partitions in m and waits for their goroutines. It uses
// the callback's client: a callback may run before Run has stored its own.
func (s *session) drop(cl *kgo.Client, m map[string][]int32) []*partition {
	s.mu.Lock()
	var parts []*partition
	topics := map[string]bool{}
	for topic, ids := range m {
		for _, id := range ids {
			tp := topicPartition{topic, id}
			if pt, ok := s.parts[tp]; ok {
				parts = append(parts, pt)
				delete(s.parts, tp)
				topics[topic] = true
			}
		}
	}
	s.mu.Unlock()
	s.stopAll(parts)
	// Paused partitions stay paused until resumed, even across
	// reassignment: resume them so that, if this member gets them back,
	// they are fetched.
	cl.ResumeFetchPartitions(m)
	for t := range topics {
		s.updateLag(t)
	}
	return parts
}

// stopAll asks parts to stop, lets an in-flight transaction finish within
// the revoke grace, then cancels what is left and waits.
func (s *session) stopAll(parts []*partition) {
	for _, pt := range parts {
		close(pt.stop)
	}
	grace := time.NewTimer(s.p.cfg.revokeGrace)
	defer grace.Stop()
	for _, pt := range parts {
		select {
		case <-pt.done:
		case <-grace.C:
			for _, q := range parts {
				q.cancel()
			}
			<-pt.done
		}
	}
	for _, pt := range parts {
		pt.cancel()
	}
}

// shutdown stops every partition at the end of Run; the group is left
// afterwards by closing the client.
func (s *session) shutdown() {
	s.mu.Lock()
	s.closing = true
	parts := make([]*partition, 0, len(s.parts))
	for _, pt := range s.parts {
		parts = append(parts, pt)
	}
	s.parts = map[topicPartition]*partition{}
	s.mu.Unlock()
	s.stopAll(parts)
	s.commitKafka(s.ctx, s.cl, parts)
}

// updateLag sets the topic's lag gauge to the sum of its owned partitions'.
func (s *session) updateLag(topic string) {
	s.mu.Lock()
	var sum int64
	for tp, pt := range s.parts {
		if tp.topic == topic {
			sum += pt.lag.Load()
		}
	}
	s.mu.Unlock()
	s.p.m.lag.WithLabelValues(s.p.name, topic).Set(float64(sum))
}
