package postgres

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
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/applyonce"
	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/consume"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

// Projector runs the placement projection: it reads the decision
// log (one partition, read_committed, transaction markers included so its
// position reaches the log's end) from placement_checkpoint on, and applies
// each poll's decisions in one transaction that also moves
// placement_checkpoint and its projector_offsets row (projector
// "placement", the position projection.Store hands out as change token).
//
// Exactly once: the transaction first locks the checkpoint row and goes
// ahead only if it still holds the offset the projector read from; if not
// (another projector of the same schema moved it, or mailplane rebuild
// swapped a rebuilt projection in), it rolls back and re-reads its
// position. Leadership: projectors of one schema take turns on a Postgres
// advisory lock, so one applies and the others stand by; the checkpoint
// check keeps it exact even when two believe they lead.
//
// Unlike domain-event projections, a decision that cannot be decoded or
// applied is not skipped to the DLQ: the decision log is the engine's
// changelog, and a projection missing one decision would restore an engine
// that differs from the log. The projector logs the error, counts it
// (mailplane_projector_retries_total{kind="permanent"}) and retries the
// batch with backoff; rebuilding into a fresh schema after a fix, or a new
// engine build that knows the record, moves it on.
//
// So that no record can hold it there for good, whatever the engine
// decides is storable by construction: it decides only on inputs that
// validate (clean text, domain.TextPattern, which refuses NUL and the other
// characters Postgres text or a viewer cannot take), its decisions are
// validated again before they are written (topics.EncodeDecision), and text
// written before that rule is read cleaned by every reader of the log alike
// (domain.DecodePlacementDecision), so the projection and a restored engine
// still agree. What is left for this retry loop is an engine bug or a
// foreign writer on the decision log, which an operator must look at.
type Projector struct {
	pool *pgxpool.Pool
	kcfg kafka.Config
	cfg  placementConfig
	proj *Projection
	m    *projections.RunnerMetrics
	// meter measures the projection as the consumer of its tier.
	meter *sla.Meter
	log   *slog.Logger

	mu      sync.Mutex
	running bool
}

type placementConfig struct {
	logger    *slog.Logger
	reg       prometheus.Registerer
	name      string
	batchSize int
	retry     projections.RetryPolicy
	standby   time.Duration
	txTimeout time.Duration
	committed func(Commit)
	kgoOpts   []kgo.Opt
}

// Option configures a Projector.
type Option func(*placementConfig)

// Commit describes one committed batch.
type Commit struct {
	// At is the wall-clock time the commit returned.
	At time.Time
	// NextOffset is the checkpoint after the batch.
	NextOffset int64
	// Decisions is the number of decisions applied.
	Decisions int
	// Records are the decisions applied, in log order (the callback must
	// neither keep nor change them).
	Records []Record
}

// WithLogger sets the logger. Default: discard.
func WithLogger(l *slog.Logger) Option {
	return func(c *placementConfig) { c.logger = l }
}

// WithRegisterer registers the projector's metrics (the
// projectors' series, labelled projector="placement").
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(c *placementConfig) { c.reg = reg }
}

// WithBatchSize bounds the decisions read per poll, and so
// (inputs are never split) about the decisions applied in one
// transaction. Default 20,000: a backlog goes about 1.4 times as fast as
// with 5,000; at a steady rate, batches are what arrived since the last.
func WithBatchSize(n int) Option {
	return func(c *placementConfig) { c.batchSize = n }
}

// WithRetry sets the backoff between failed sessions.
func WithRetry(p projections.RetryPolicy) Option {
	return func(c *placementConfig) { c.retry = p }
}

// WithStandbyPoll sets how often a standby projector tries to
// take the lead. Default 1s.
func WithStandbyPoll(d time.Duration) Option {
	return func(c *placementConfig) { c.standby = d }
}

// WithCommitted calls fn after each committed batch, on the
// projector's goroutine; fn must be quick.
func WithCommitted(fn func(Commit)) Option {
	return func(c *placementConfig) { c.committed = fn }
}

// WithKgoOptions adds franz-go options to the decision-log reader.
func WithKgoOptions(opts ...kgo.Opt) Option {
	return func(c *placementConfig) { c.kgoOpts = append(c.kgoOpts, opts...) }
}

// NewProjector returns a projector of the placement projection
// reading the decision log from the brokers in kcfg and writing through
// pool, in the schema the pool's search_path selects (migrated). It
// connects to nothing until Run.
func NewProjector(kcfg kafka.Config, pool *pgxpool.Pool, opts ...Option) (*Projector, error) {
	cfg := placementConfig{
		name:      Name,
		batchSize: 20000,
		retry:     projections.DefaultRetryPolicy,
		standby:   time.Second,
		txTimeout: 60 * time.Second,
	}
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case pool == nil:
		return nil, errors.New("projections: NewProjector needs a pool")
	case len(kcfg.Brokers) == 0:
		return nil, errors.New("projections: no brokers")
	}
	if cfg.batchSize <= 0 {
		cfg.batchSize = 20000
	}
	if cfg.retry.Backoff <= 0 {
		cfg.retry.Backoff = projections.DefaultRetryPolicy.Backoff
	}
	if cfg.retry.MaxBackoff <= 0 {
		cfg.retry.MaxBackoff = projections.DefaultRetryPolicy.MaxBackoff
	}
	if cfg.standby <= 0 {
		cfg.standby = time.Second
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.reg == nil {
		cfg.reg = prometheus.NewRegistry()
	}
	if kcfg.ClientID == "" {
		kcfg.ClientID = "mailplane-projector-" + cfg.name
	}
	return &Projector{
		pool: pool, kcfg: kcfg, cfg: cfg, proj: New(kcfg.Namespace), m: projections.NewRunnerMetrics(cfg.reg),
		meter: sla.NewMeter(cfg.reg, sla.PlacementProjection),
		log:   cfg.logger.With("projector", cfg.name),
	}, nil
}

// errPlacementFenced: the checkpoint moved under the projector.
var errPlacementFenced = errors.New("placement checkpoint moved under this projector")

// Run projects until ctx is done, then returns nil. Failures (broker or
// database down, a decision that cannot be applied) are logged and
// retried with backoff; it returns an error only if it is already running.
func (p *Projector) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return errors.New("projections: placement projector already running")
	}
	p.running = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.running = false
		p.mu.Unlock()
	}()
	bo := backoff.New(p.retryPolicy(), nil)
	for ctx.Err() == nil {
		err := p.session(ctx)
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, errPlacementFenced):
			p.m.Retries.WithLabelValues(p.cfg.name, "fenced").Inc()
			p.log.Info("placement checkpoint moved (another projector, or a swapped-in rebuild); re-reading the position")
			continue
		case err != nil:
			wait := bo.Next()
			p.retrying(bo.Failures(), wait, err)
			_ = backoff.Sleep(ctx, wait)
			continue
		}
		bo.Reset()
	}
	return nil
}

// retryPolicy paces the projector's retries: RetryPolicy's Backoff
// doubling up to MaxBackoff, half of each wait random (the projectors of
// one schema, standbys included, should not retry in step).
func (p *Projector) retryPolicy() backoff.Policy {
	return backoff.Policy{Floor: p.cfg.retry.Backoff, Cap: p.cfg.retry.MaxBackoff, Jitter: backoff.Half}
}

// retrying counts and logs a failure (of a leadership, or of a batch
// within one) before the wait after it.
func (p *Projector) retrying(_ int, wait time.Duration, err error) {
	kind := "transient"
	if _, ok := applyonce.IsPermanent(err); ok {
		kind = "permanent"
	}
	p.m.Retries.WithLabelValues(p.cfg.name, kind).Inc()
	p.log.Error("placement projector failed; retrying", "kind", kind, "backoff", wait, "err", err)
}

// leaderKeepaliveSQL makes the server notice a dead leader in about 25 s:
// probes after 10 s idle, every 5 s, 3 unanswered; unacknowledged data
// for 30 s also ends it.
const leaderKeepaliveSQL = `SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3; SET tcp_user_timeout = 30000`

// placementLockClass is the first key of the projector's advisory lock
// ("mplp"); the second hashes the schema and the projector's name.
const placementLockClass int32 = 0x6d706c70

// lead waits until this projector holds the advisory lock of its schema,
// on a connection it keeps until release.
func (p *Projector) lead(ctx context.Context) (release func(), err error) {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", err)
	}
	// The lock lives as long as this session. A leader whose host dies
	// without closing it would hold the lock until the server's TCP
	// keepalive gives up (hours by default): probe it every few seconds,
	// so a standby leads within about half a minute. (Ignored on a Unix
	// socket, where a dead peer closes at once.)
	if _, err := conn.Exec(ctx, leaderKeepaliveSQL); err != nil {
		conn.Release()
		return nil, fmt.Errorf("lock connection keepalive: %w", err)
	}
	logged := false
	for {
		var ok bool
		err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1::int4, hashtext(current_schema() || '/' || $2::text))`,
			placementLockClass, p.cfg.name).Scan(&ok)
		if err != nil {
			conn.Release()
			return nil, fmt.Errorf("advisory lock: %w", err)
		}
		if ok {
			break
		}
		if !logged {
			// The leader reports the log's lag, not a standby (the
			// runtime forgot this one's when its last leadership ended).
			p.log.Info("another placement projector leads this schema; standing by")
			logged = true
		}
		select {
		case <-ctx.Done():
			conn.Release()
			return nil, ctx.Err()
		case <-time.After(p.cfg.standby):
		}
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1::int4, hashtext(current_schema() || '/' || $2::text))`,
			placementLockClass, p.cfg.name); err != nil {
			// Closing the session releases the lock too.
			_ = conn.Conn().Close(uctx)
		}
		conn.Release()
	}, nil
}

// session is one leadership: read the position, then tail the log on the
// consumer runtime (partition 0 assigned from the checkpoint, no group).
// A batch that fails is retried within the leadership, with backoff, so
// the meter holds the projection where it is stuck; the leadership ends
// when the checkpoint moved under it (re-read at once) or on a fetch
// error (Run retries after a backoff).
func (p *Projector) session(ctx context.Context) error {
	release, err := p.lead(ctx)
	if err != nil {
		return err
	}
	defer release()
	ck, err := ReadCheckpoint(ctx, p.pool)
	if err != nil {
		return err
	}
	next := ck.NextOffset
	b := &inputBatcher{safeEnd: next, seen: next, end: -1}
	var offsets *offsetCommitter
	topic := p.kcfg.Topic(topics.PlacementDecisions)
	// handle is called again with the same batch after a failure
	// (consume.Retry): add takes only records not seen yet, and what
	// failed to commit stays pending.
	handle := func(ctx context.Context, batch *consume.Batch) error {
		b.end = max(b.end, batch.End(topic, 0))
		derr := b.add(batch.Fetches)
		if b.safeEnd > next {
			if err := p.commit(ctx, next, b.safeEnd, b.ready()); err != nil {
				batch.Consumer().Position(topic, 0, b.position(next))
				if errors.Is(err, errPlacementFenced) {
					return backoff.Permanent(err)
				}
				return err
			}
			next = b.taken()
		}
		batch.Consumer().Position(topic, 0, b.position(next))
		offsets.commit(ctx, next)
		return derr
	}
	c, err := consume.New(p.kcfg, string(sla.PlacementProjection),
		consume.Partitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().At(next)}}), handle,
		// The position is the checkpoint's, not the fetch's.
		consume.MeteredByEffect(p.meter), consume.Retry(p.retryPolicy(), p.retrying),
		consume.WithMaxRecords(p.cfg.batchSize), consume.WithKgoOptions(p.readerOptions()...),
		// A fetch error ends the leadership: the session starts over
		// from the checkpoint, after a backoff.
		consume.OnFetchError(func(_ string, _ int32, err error) error {
			return fmt.Errorf("reading the decision log at %d: %w", b.seen, err)
		}),
		consume.WithLogger(p.log), consume.WithRegisterer(p.cfg.reg))
	if err != nil {
		return fmt.Errorf("decision-log reader: %w", err)
	}
	offsets = p.offsetCommitter(c.Client())
	p.log.Info("placement projector leading", "from", next)
	return c.Run(ctx)
}

// kafkaCommitEvery is how often the leader records its position in its
// Kafka group: for Console, rpk and other lag tools only; nothing reads
// it back (the position is placement_checkpoint).
const kafkaCommitEvery = 5 * time.Second

// offsetCommitter records the projection's position as the committed
// offset of group mailplane-projector-placement, which has no members:
// the projection reads the single-partition log without a group.
type offsetCommitter struct {
	adm   *kadm.Client
	group string
	topic string
	log   *slog.Logger
	last  int64
	at    time.Time
}

func (p *Projector) offsetCommitter(cl *kgo.Client) *offsetCommitter {
	return &offsetCommitter{adm: kadm.NewClient(cl), group: p.kcfg.Group(projections.GroupName(p.cfg.name)),
		topic: p.kcfg.Topic(topics.PlacementDecisions), log: p.log, last: -1}
}

// commit records next, at most every kafkaCommitEvery; a failure is
// only logged (the next one retries).
func (o *offsetCommitter) commit(ctx context.Context, next int64) {
	if next == o.last || time.Since(o.at) < kafkaCommitEvery {
		return
	}
	o.at = time.Now()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var offs kadm.Offsets
	offs.AddOffset(o.topic, 0, next, -1)
	resp, err := o.adm.CommitOffsets(cctx, o.group, offs)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		o.log.Debug("committing the position to Kafka for lag tools failed", "err", err)
		return
	}
	o.last = next
}

// readerOptions are the options of the decision-log reader, beside the
// runtime's partition source (read_committed, partition 0 from the
// checkpoint).
func (p *Projector) readerOptions() []kgo.Opt {
	return append([]kgo.Opt{
		// Markers count: the position reaches the log's end, so a change
		// token of a caught-up projection is the end of the log.
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.FetchMaxBytes(int32(min(max(p.cfg.batchSize, 512)*1024, 50<<20))),
		// A checkpoint outside the log (records deleted, another
		// cluster's database) is an error, never a silent skip.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		// Decode as fetches are buffered, in the client's goroutine, so
		// decoding the next batch overlaps the transaction of this one.
		kgo.WithHooks(decodeHook{}),
	}, p.cfg.kgoOpts...)
}

// inputBatcher gathers decisions read into batches that end where inputs
// end: the engine writes each input's decisions in one transaction, and a
// poll may stop inside one; the rest waits for the next poll. Readers of
// the tables (the worker API, placement show, a restoring engine) so only
// ever see the state between inputs, where invariants 3 and 4 hold.
type inputBatcher struct {
	pending []Record // read, not committed
	safe    int      // pending[:safe] ends with an input's last decision
	safeEnd int64    // the checkpoint after pending[:safe] and the markers after it
	seen    int64    // the offset after the last record read
	end     int64    // the log's last stable offset as last fetched (-1: none yet)
}

// position is where the projection stands for its meter: at next, the
// oldest record not applied the first one pending, if read.
func (b *inputBatcher) position(next int64) sla.Position {
	pos := sla.Position{Next: next, End: max(b.end, next)}
	if len(b.pending) > 0 {
		pos.Oldest = b.pending[0].Appended
	}
	return pos
}

// add takes a poll's records. A record that does not decode stops it:
// what comes before it is applied; it is not skipped.
func (b *inputBatcher) add(fs kgo.Fetches) error {
	var derr error
	fs.EachRecord(func(r *kgo.Record) {
		if derr != nil || r.Offset < b.seen {
			return
		}
		if r.Attrs.IsControl() {
			b.seen = r.Offset + 1
			if b.safe == len(b.pending) {
				b.safeEnd = b.seen
			}
			return
		}
		d, err := decodedDecision(r)
		if err != nil {
			derr = applyonce.Permanent(domain.ErrorCode(err), fmt.Errorf("decision at offset %d: %w", r.Offset, err))
			return
		}
		b.seen = r.Offset + 1
		b.pending = append(b.pending, Record{Offset: r.Offset, Decision: d, Appended: r.Timestamp})
		if d.Cause.Index+1 >= d.Cause.Count {
			b.safe, b.safeEnd = len(b.pending), b.seen
		}
	})
	return derr
}

// ready returns the decisions up to the last input boundary, to commit;
// they stay pending until taken.
func (b *inputBatcher) ready() []Record { return b.pending[:b.safe] }

// taken drops the decisions ready returned, once committed, and returns
// the checkpoint after them.
func (b *inputBatcher) taken() int64 {
	b.pending = append([]Record(nil), b.pending[b.safe:]...)
	b.safe = 0
	return b.safeEnd
}

const (
	txSettingsSQL = `SET LOCAL lock_timeout = 10000; SET LOCAL synchronous_commit = off`
)

// commit applies one batch: checkpoint check, rows, checkpoint and
// projector_offsets, in one transaction. Asynchronous commit is safe here
// for the reason it is in the projector runtime: rows and position commit
// or vanish together, and a lost commit is read from the log again.
func (p *Projector) commit(ctx context.Context, from, next int64, recs []Record) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.txTimeout)
	defer cancel()
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, txSettingsSQL); err != nil {
			return err
		}
		cur, err := LockCheckpoint(ctx, tx)
		if err != nil {
			return err
		}
		if cur != from {
			return errPlacementFenced
		}
		return p.proj.ApplyDecisions(ctx, tx, recs, next)
	})
	if err != nil {
		if applyonce.IsUniqueViolation(err) {
			// Two first batches raced for the checkpoint row.
			return errPlacementFenced
		}
		return err
	}
	p.m.BatchSeconds.WithLabelValues(p.cfg.name).Observe(time.Since(start).Seconds())
	p.m.Applied.WithLabelValues(p.cfg.name).Add(float64(len(recs)))
	now := time.Now()
	for _, r := range recs {
		p.meter.Applied(now, r.Appended)
	}
	if p.cfg.committed != nil {
		p.cfg.committed(Commit{At: time.Now(), NextOffset: next, Decisions: len(recs), Records: recs})
	}
	return nil
}

// decodeHook decodes each decision record as the client buffers it and
// hands the result on in the record's Context (as the projector runtime's
// decodeHook does for domain events).
type decodeHook struct{}

func (decodeHook) OnFetchRecordBuffered(r *kgo.Record) {
	if r.Attrs.IsControl() {
		return
	}
	parent := r.Context
	if parent == nil {
		parent = context.Background()
	}
	d, err := topics.DecodeDecision(r)
	r.Context = &decoded{Context: parent, d: d, err: err}
}

type decoded struct {
	context.Context
	d   topics.Decision
	err error
}

// decodedDecision returns what decodeHook decoded, or decodes r.
func decodedDecision(r *kgo.Record) (topics.Decision, error) {
	if d, ok := r.Context.(*decoded); ok {
		return d.d, d.err
	}
	return topics.DecodeDecision(r)
}
