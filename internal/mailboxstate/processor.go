package mailboxstate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/consume"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/promreg"
	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

// Defaults of the processor's identity. One processor runs per deployment:
// a second one started with the same transactional id fences the first
// (its next commit fails and its Run returns ErrFenced). To run several at
// once, give each its own WithTransactionalID and the same group.
const (
	DefaultGroup           = "mailplane-mailbox-state"
	DefaultTransactionalID = "mailplane-mailbox-state"
	// ConsumerName names the processor in dead letters.
	ConsumerName = "mailbox-state"
)

// ErrFenced is returned by Run when another processor took over the
// transactional id.
var ErrFenced = errors.New("mailboxstate: fenced by another processor with the same transactional id")

// Option configures a Processor.
type Option func(*config)

type config struct {
	logger   *slog.Logger
	reg      prometheus.Registerer
	group    kafka.GroupConfig
	txnID    string
	maxBatch int
	kgoOpts  []kgo.Opt
	backoff  time.Duration
	window   time.Duration
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithRegisterer registers the processor's metrics on reg.
func WithRegisterer(reg prometheus.Registerer) Option { return func(c *config) { c.reg = reg } }

// WithGroup tunes group membership (name, session, heartbeat). Topics are
// always the mailbox events.
func WithGroup(g kafka.GroupConfig) Option { return func(c *config) { c.group = g } }

// WithTransactionalID sets the transactional id (default
// DefaultTransactionalID). It must be stable across restarts of one
// processor instance: that is what fences a zombie predecessor.
func WithTransactionalID(id string) Option { return func(c *config) { c.txnID = id } }

// WithMaxBatch bounds the records folded in one transaction (default 2000).
func WithMaxBatch(n int) Option { return func(c *config) { c.maxBatch = n } }

// WithDedupeWindow sets how long, in log time, the processor remembers the
// id of an event it applied (default DefaultDedupeWindow, 7 days): a copy of
// an event produced within the window of the original is skipped, a later
// one is folded again. Memory grows with the mailbox.added, mailbox.removed
// and mailbox.disabled events of one window (see dedupe.go). The window must stay
// well under the retention of topics.MailboxStateDedupe (30 days).
func WithDedupeWindow(d time.Duration) Option { return func(c *config) { c.window = d } }

// WithKgoOptions adds franz-go options (tests use it for group timings).
// They must not replace the partitioner or the partition revoked/lost
// callbacks: the dedupe state depends on them.
func WithKgoOptions(opts ...kgo.Opt) Option {
	return func(c *config) { c.kgoOpts = append(c.kgoOpts, opts...) }
}

// Processor folds mailbox domain events into mailbox.state, exactly once
// per event id within its dedupe window: each transaction carries the
// mailbox.state records, the ids it applied (topics.MailboxStateDedupe) and
// the input offsets, and a record whose id was already applied is skipped.
type Processor struct {
	kcfg kafka.Config
	cfg  config
	// The topics, within kcfg's namespace.
	eventsTopic, stateTopic, dedupeTopic string
	log                                  *slog.Logger
	m                                    *metrics
	// meter measures the processor as the consumer of its tier.
	meter *sla.Meter
}

// New returns a processor reading and writing through the brokers in kcfg.
// It connects to nothing until Run.
func New(kcfg kafka.Config, opts ...Option) (*Processor, error) {
	cfg := config{maxBatch: 2000, txnID: DefaultTransactionalID, backoff: 500 * time.Millisecond, window: DefaultDedupeWindow}
	for _, o := range opts {
		o(&cfg)
	}
	if len(kcfg.Brokers) == 0 {
		return nil, errors.New("mailboxstate: no brokers")
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.reg == nil {
		cfg.reg = prometheus.NewRegistry()
	}
	if cfg.group.Group == "" {
		cfg.group.Group = DefaultGroup
	}
	if cfg.txnID == "" {
		cfg.txnID = DefaultTransactionalID
	}
	// The group and the transactional id as the broker names them.
	cfg.group.Group = kcfg.Group(cfg.group.Group)
	cfg.group.Topics = []string{kcfg.Topic(topics.MailboxEvents)}
	cfg.txnID = kcfg.TransactionalID(cfg.txnID)
	if cfg.maxBatch <= 0 {
		cfg.maxBatch = 2000
	}
	if cfg.window <= 0 {
		cfg.window = DefaultDedupeWindow
	}
	if kcfg.ClientID == "" {
		kcfg.ClientID = "mailplane-mailbox-state"
	}
	log := cfg.logger.With("role", "mailbox-state")
	return &Processor{kcfg: kcfg.WithLogger(log), cfg: cfg, log: log, m: newMetrics(cfg.reg), meter: sla.NewMeter(cfg.reg, sla.MailboxState),
		eventsTopic: kcfg.Topic(topics.MailboxEvents), stateTopic: kcfg.Topic(topics.MailboxState), dedupeTopic: kcfg.Topic(topics.MailboxStateDedupe)}, nil
}

// Run folds until ctx is done and returns nil then. A transaction that
// fails is aborted and its input read again; a session whose producer
// state is lost is rebuilt after a pause (internal/backoff; a session that
// committed starts the doubling over). Run returns an error only when it
// cannot start or when it was fenced (ErrFenced).
func (p *Processor) Run(ctx context.Context) error {
	bo := backoff.New(backoff.Policy{Floor: p.cfg.backoff, Cap: 30 * time.Second, Jitter: backoff.Half}, nil)
	for ctx.Err() == nil {
		progressed, err := p.session(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrFenced):
			return err
		case err != nil:
			if progressed {
				bo.Reset()
			}
			d := bo.Next()
			p.log.Warn("transaction session failed; starting a new one", "err", err, "in", d)
			if backoff.Sleep(ctx, d) != nil {
				return nil
			}
		}
	}
	return nil
}

// options are the session's client options on top of the kit's consumer
// options: a group consumer reading committed records only (the kit's
// default), and a transactional producer placing records by
// the murmur2 hash of their key (so mailbox.state partitions agree with any
// Kafka client and with sync.tier), except the dedupe changelog's, which go
// to the partition of the input they come from.
func (p *Processor) options() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.TransactionalID(p.cfg.txnID),
		kgo.TransactionTimeout(30 * time.Second),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(partitioner{keyed: kgo.StickyKeyPartitioner(nil), changelog: p.dedupeTopic}),
		kgo.ProducerLinger(0),
		kgo.ProduceRequestTimeout(10 * time.Second),
	}
	return append(opts, p.cfg.kgoOpts...)
}

// partitioner places changelog records on the partition they name and every
// other record by its key.
type partitioner struct {
	keyed     kgo.Partitioner
	changelog string
}

func (p partitioner) ForTopic(t string) kgo.TopicPartitioner {
	if t == p.changelog {
		return samePartition{}
	}
	return p.keyed.ForTopic(t)
}

type samePartition struct{}

func (samePartition) RequiresConsistency(*kgo.Record) bool { return true }
func (samePartition) Partition(r *kgo.Record, _ int) int   { return int(r.Partition) }

// sessionState is the dedupe state of one transactional session: the
// applied ids of the input partitions folded since they were assigned.
// parts belongs to the handler; the group callbacks only mark partitions
// stale, and the handler drops them before its next transaction.
type sessionState struct {
	events string // the input topic
	parts  map[int32]*applied
	// reported is what this session added to the dedupe ids gauge (shared
	// by the processors on one registry).
	reported int

	mu    sync.Mutex
	stale map[int32]bool
}

func newSessionState(events string) *sessionState {
	return &sessionState{events: events, parts: map[int32]*applied{}, stale: map[int32]bool{}}
}

// forget marks revoked or lost partitions: another member may fold them
// next, so what this session knows of them will be out of date.
func (s *sessionState) forget(m map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, part := range m[s.events] {
		s.stale[part] = true
	}
}

func (s *sessionState) dropStale() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for part := range s.stale {
		delete(s.parts, part)
	}
	clear(s.stale)
}

// report brings g up to date with the ids the session remembers.
func (s *sessionState) report(g prometheus.Gauge) {
	n := 0
	for _, a := range s.parts {
		n += len(a.ids)
	}
	g.Add(float64(n - s.reported))
	s.reported = n
}

// session runs one transactional group consumer (internal/consume) until
// ctx is done or it fails. The runtime meters the lag and skips records
// redriven for other consumers; the handler folds each batch in one
// transaction. progressed reports whether any transaction committed.
func (p *Processor) session(ctx context.Context) (progressed bool, err error) {
	// A new session starts knowing nothing: it restores each partition's
	// dedupe state from the changelog when it first folds that partition.
	st := newSessionState(p.eventsTopic)
	defer func() {
		clear(st.parts)
		st.report(p.m.dedupeIDs)
	}()
	handle := func(ctx context.Context, b *consume.Batch) error {
		if b.Fetches.NumRecords() == 0 {
			return nil
		}
		// A batch of records all redriven for other consumers still
		// commits, to move the offsets past them.
		committed, err := p.transact(ctx, b, st)
		if err != nil {
			if isFenced(err) {
				return fmt.Errorf("%w: %v", ErrFenced, err)
			}
			return err
		}
		if committed {
			progressed = true
			p.applied(b.Records)
		}
		return nil
	}
	// Revoked and lost partitions lose their dedupe state in st.
	forget := func(_ context.Context, _ *consume.Consumer, m map[string][]int32) { st.forget(m) }
	c, err := consume.New(p.kcfg, string(sla.MailboxState), consume.TransactGroup(p.cfg.group), handle,
		consume.WithKgoOptions(p.options()...), consume.OnRevoked(forget), consume.OnLost(forget),
		consume.WithMaxRecords(p.cfg.maxBatch), consume.Metered(p.meter), consume.SkipRedriven(ConsumerName),
		// Leaving the group can wait on the coordinator; never for ever.
		consume.LeaveWithin(15*time.Second), consume.WithLogger(p.log), consume.WithRegisterer(p.cfg.reg))
	if err != nil {
		return false, fmt.Errorf("mailboxstate: client: %w", err)
	}
	p.log.Info("mailbox state processor started", "group", p.cfg.group.Group, "transactional_id", p.cfg.txnID)
	err = c.Run(ctx)
	return progressed, err
}

// applied observes a committed batch's latency: each record's append to
// its state record (the runtime moves the lag past the batch).
func (p *Processor) applied(recs []*kgo.Record) {
	now := time.Now()
	for _, r := range recs {
		p.meter.Applied(now, r.Timestamp)
	}
}

// finishWithin bounds a transaction once begun, a stop included.
const finishWithin = 15 * time.Second

func isFenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed)
}

// transact folds recs and produces the result in one transaction with the
// input offsets and the ids it applied. On any failure the transaction is
// aborted and the session rewinds to the last committed offsets, so the
// batch is folded again; the dedupe state of the batch's partitions, which
// the fold changed, is dropped and restored from the changelog.
func (p *Processor) transact(ctx context.Context, b *consume.Batch, st *sessionState) (committed bool, err error) {
	recs := b.Records
	st.dropStale()
	// Where each partition of the batch resumes: its first record.
	first := map[int32]int64{}
	last := map[int32]int64{}
	for _, r := range recs {
		if _, ok := first[r.Partition]; !ok {
			first[r.Partition] = r.Offset
		}
		last[r.Partition] = r.Offset
	}
	need := map[int32]int64{}
	for part, off := range first {
		if _, ok := st.parts[part]; !ok {
			need[part] = off
		}
	}
	if len(need) > 0 {
		restored, err := p.restore(ctx, need)
		if err != nil {
			if ctx.Err() != nil {
				return false, nil
			}
			return false, fmt.Errorf("restore dedupe state: %w", err)
		}
		p.m.restores.Add(float64(len(restored)))
		for part, a := range restored {
			st.parts[part] = a
		}
	}
	// The current records of the mailboxes the batch disables (current.go),
	// read before the transaction begins so that it stays short.
	var batch *batchState
	if keys := disabledKeys(recs); keys != nil {
		read, err := p.readState(ctx, keys)
		if err != nil {
			if ctx.Err() != nil {
				return false, nil
			}
			return false, fmt.Errorf("read mailbox.state for mailbox.disabled: %w", err)
		}
		batch = &batchState{keys: keys, read: read}
	}
	defer func() {
		if !committed {
			for part := range first {
				delete(st.parts, part)
			}
		}
		st.report(p.m.dedupeIDs)
	}()

	var counts outcomeCounts
	// Records redriven for other consumers, skipped by the runtime: their
	// offsets commit with the batch.
	counts[outcomeOtherConsumer] = b.Fetches.NumRecords() - len(recs)
	// A stop finishes the transaction in flight (within a bound): one
	// left open after its offsets were sent would hold the next member's
	// offset fetch, and readers of its output, until the transaction
	// timeout.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishWithin)
	defer cancel()
	committed, err = b.TransactTry(tctx, func(ctx context.Context) kgo.TransactionEndTry {
		return p.foldBatch(ctx, b.Consumer().Client(), st, batch, recs, first, last, &counts)
	})
	if err != nil {
		p.m.transactions.WithLabelValues("failed").Inc()
		if ctx.Err() != nil {
			return false, nil
		}
		return false, fmt.Errorf("transaction: %w", err)
	}
	if !committed {
		p.m.transactions.WithLabelValues("aborted").Inc()
		p.log.Info("transaction aborted (rebalance or produce failure); the batch will be folded again", "records", len(recs))
		return false, nil
	}
	p.m.transactions.WithLabelValues("committed").Inc()
	for k, n := range counts {
		if n > 0 {
			p.m.records.WithLabelValues(outcome(k).String()).Add(float64(n))
		}
	}
	return true, nil
}

// foldBatch folds recs within the transaction, sweeps the dedupe ids out
// of their window (tombstones in the changelog) and produces the result;
// it asks to abort when a produce failed.
func (p *Processor) foldBatch(ctx context.Context, cl *kgo.Client, st *sessionState, batch *batchState, recs []*kgo.Record, first, last map[int32]int64, counts *outcomeCounts) kgo.TransactionEndTry {
	out := make([]*kgo.Record, 0, 2*len(recs))
	for _, r := range recs {
		var kind outcome
		out, kind = p.fold(r, st.parts[r.Partition], batch, out)
		counts[kind]++
	}
	window, every := p.cfg.window.Milliseconds(), max(p.cfg.window.Milliseconds()/16, 1)
	for _, part := range keys(first) {
		for _, id := range st.parts[part].sweep(window, every) {
			out = append(out, changelogTombstone(p.dedupeTopic, p.cfg.group.Group, part, id, last[part]))
		}
	}
	if len(out) > 0 {
		if err := cl.ProduceSync(ctx, out...).FirstErr(); err != nil {
			if ctx.Err() == nil {
				p.log.Warn("producing the folded batch failed; aborting the transaction", "err", err)
			}
			return kgo.TryAbort
		}
	}
	return kgo.TryCommit
}

type outcome int

const (
	outcomeUpserted outcome = iota
	outcomeTombstoned
	outcomeIgnored
	outcomeDeadLettered
	outcomeDuplicate
	outcomeOtherConsumer
	numOutcomes
)

type outcomeCounts [numOutcomes]int

func (o outcome) String() string {
	return [...]string{"upserted", "tombstoned", "ignored", "dead_lettered", "duplicate", "other_consumer"}[o]
}

// fold maps one mailbox event record to its mailbox.state record, appended
// to out: the mailbox's state for mailbox.added, a tombstone for
// mailbox.removed, the mailbox's current state with Enabled false for
// mailbox.disabled (nothing when the mailbox has no live record: never
// added, or removed; batch holds the current records, see current.go), and
// nothing for the other types (sync needs none of them). Events are applied
// in log order, as the registry projection applies them, and at most once
// per event id within the dedupe window: a mailbox.added, mailbox.removed or
// mailbox.disabled whose id a applied already is skipped, and one applied is
// remembered in a and in the changelog record appended with it. A record
// that does not decode goes to the DLQ, in the same transaction.
func (p *Processor) fold(r *kgo.Record, a *applied, batch *batchState, out []*kgo.Record) ([]*kgo.Record, outcome) {
	deadLetter := func(code domain.Code, msg string) ([]*kgo.Record, outcome) {
		return append(out, dlq.NewRecord(p.kcfg.Namespace, r, dlq.Failure{Consumer: ConsumerName, Code: code, Err: msg, Attempts: 1})), outcomeDeadLettered
	}
	e, err := topics.Decode(r)
	if err != nil {
		p.log.Warn("mailbox event sent to the DLQ", "partition", r.Partition, "offset", r.Offset, "code", domain.ErrorCode(err), "err", err)
		return deadLetter(domain.ErrorCode(err), err.Error())
	}
	// state is the record to write (nil: none) and next what it makes of
	// the mailbox, both applied only if the event is not a duplicate.
	var state *kgo.Record
	var next current
	var kind outcome
	switch d := e.Data.(type) {
	case *domain.MailboxAdded:
		m := FromAdded(e, d)
		state, err = Record(p.stateTopic, m, e.Time)
		if err != nil {
			return deadLetter(domain.CodeInternal, err.Error())
		}
		next, kind = current{m: m, live: true}, outcomeUpserted
	case *domain.MailboxRemoved:
		state, kind = Tombstone(p.stateTopic, d.MailboxID, e.Key(), e.Time), outcomeTombstoned
		next = current{m: domain.MailboxStateRecord{MailboxID: d.MailboxID}}
	case *domain.MailboxDisabled:
		var dl *dlq.Failure
		state, next, kind, dl = p.foldIntoCurrent(r, batch, d.MailboxID, e, func(m domain.MailboxStateRecord) (domain.MailboxStateRecord, bool) { return Disabled(m, e), true })
		if dl != nil {
			return deadLetter(dl.Code, dl.Err)
		}
	case *domain.CredentialsRotated:
		var dl *dlq.Failure
		state, next, kind, dl = p.foldIntoCurrent(r, batch, d.MailboxID, e, func(m domain.MailboxStateRecord) (domain.MailboxStateRecord, bool) { return Rotated(m, e, d) })
		if dl != nil {
			return deadLetter(dl.Code, dl.Err)
		}
	default:
		return out, outcomeIgnored
	}
	id, err := uuid.Parse(e.Key()) // always a UUID (domain.EventKey)
	if err != nil {
		return deadLetter(domain.CodeInternal, fmt.Sprintf("event key %q: %v", e.Key(), err))
	}
	ts := r.Timestamp.UnixMilli()
	if a.seen(id, ts, p.cfg.window.Milliseconds()) {
		p.log.Debug("duplicate mailbox event skipped", "partition", r.Partition, "offset", r.Offset, "id", e.ID, "type", e.Type, "mailbox_id", e.Subject)
		return out, outcomeDuplicate
	}
	a.add(id, ts)
	batch.set(e.Subject, next)
	if state != nil {
		out = append(out, state)
	}
	return append(out, changelogRecord(p.dedupeTopic, p.cfg.group.Group, id, e, r)), kind
}

type metrics struct {
	records      *prometheus.CounterVec
	transactions *prometheus.CounterVec
	dedupeIDs    prometheus.Gauge
	restores     prometheus.Counter
}

// foldIntoCurrent folds an event that changes a registered mailbox's
// current record (mailbox.disabled, credentials_rotated) with change. An
// event about a mailbox that is not registered (never added, or removed),
// or that change declines (false), changes nothing, but its id is
// remembered all the same, so that a copy of it after a later
// mailbox.added does not apply to that mailbox. dl is set when the event
// goes to the DLQ instead.
func (p *Processor) foldIntoCurrent(r *kgo.Record, batch *batchState, id string, e domain.Event, change func(domain.MailboxStateRecord) (domain.MailboxStateRecord, bool)) (state *kgo.Record, next current, kind outcome, dl *dlq.Failure) {
	cur, ok := batch.get(id)
	switch {
	case cur.err != nil:
		p.log.Warn(e.Type+" sent to the DLQ: the mailbox's mailbox.state record does not decode", "partition", r.Partition, "offset", r.Offset, "mailbox_id", id, "err", cur.err)
		return nil, current{}, 0, &dlq.Failure{Code: domain.ErrorCode(cur.err), Err: "the mailbox's current mailbox.state record does not decode: " + cur.err.Error()}
	case !ok || !cur.live:
		if !ok {
			cur = current{m: domain.MailboxStateRecord{MailboxID: id}}
		}
		return nil, cur, outcomeIgnored, nil
	}
	m, ok := change(cur.m)
	if !ok {
		return nil, cur, outcomeIgnored, nil
	}
	state, err := Record(p.stateTopic, m, e.Time)
	if err != nil {
		return nil, current{}, 0, &dlq.Failure{Code: domain.CodeInternal, Err: err.Error()}
	}
	return state, current{m: m, live: true}, outcomeUpserted, nil
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_mailbox_state_records_total",
			Help: "Mailbox events folded into mailbox.state, by outcome (upserted, tombstoned, ignored, dead_lettered, duplicate: an event id already applied, other_consumer: redriven from the DLQ for another consumer); committed transactions only.",
		}, []string{"outcome"}),
		transactions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_mailbox_state_transactions_total",
			Help: "Transactions of the mailbox.state processor, by outcome (committed, aborted, failed).",
		}, []string{"outcome"}),
		dedupeIDs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mailplane_mailbox_state_dedupe_ids",
			Help: "Event ids the mailbox.state processor remembers to recognise duplicates (its dedupe window).",
		}),
		restores: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mailplane_mailbox_state_dedupe_restores_total",
			Help: "Input partitions whose dedupe state was restored from the changelog (assignment, restart, aborted transaction).",
		}),
	}
	m.records = promreg.MustRegister(reg, m.records)
	m.transactions = promreg.MustRegister(reg, m.transactions)
	m.dedupeIDs = promreg.MustRegister(reg, m.dedupeIDs)
	m.restores = promreg.MustRegister(reg, m.restores)
	return m
}
