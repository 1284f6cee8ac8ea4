package outbox

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

	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/promreg"
	"github.com/mailplane/mailplane/topics"
)

// lockSQL takes the advisory lock that elects the publishing relay. Advisory
// locks are database-wide, so the key names the schema: the outbox of each
// schema (a replay's, a test's) has its own relay.
const lockSQL = `SELECT pg_try_advisory_lock(hashtext('mailplane_outbox:' || current_schema())::bigint),
       current_database() || '.' || current_schema()`

// Relay publishes the outbox. Run it in every process that writes to the
// outbox; one publishes, the others wait to take over.
//
// The publisher holds a session advisory lock on a connection whose
// idle_session_timeout is the lease: a publisher that stops (SIGSTOP, a
// hung process) loses its connection, and so the lock, after the lease,
// and a standby takes over. It produces each batch in a Kafka transaction
// under one transactional id per outbox (database and schema), so a
// publisher that resumes after it was replaced is fenced by the broker: a
// batch it produces late is aborted, never seen by read_committed
// consumers, and per-key order holds.
type Relay struct {
	pool  *pgxpool.Pool
	kcfg  kafka.Config
	log   *slog.Logger
	batch int
	poll  time.Duration
	op    time.Duration
	lease time.Duration
	m     *metrics

	// beforeProduce, when set, runs between reading a batch and producing
	// it (tests pause a publisher there).
	beforeProduce func()
}

// Option configures a Relay.
type Option func(*Relay)

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(r *Relay) { r.log = l } }

// WithRegisterer registers the relay's metrics on reg; relays registered
// on one registerer share their series (promreg).
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(r *Relay) { r.m = newMetrics(reg) }
}

// WithBatch sets how many records are produced and deleted per round
// (default 1000).
func WithBatch(n int) Option { return func(r *Relay) { r.batch = max(1, n) } }

// WithPollInterval sets how often the outbox is checked without a
// notification, and how often a standby relay tries to take over
// (default 1 s).
func WithPollInterval(d time.Duration) Option {
	return func(r *Relay) { r.poll = max(time.Millisecond, d) }
}

// WithOperationTimeout bounds each database round trip and each Kafka
// transaction (default 10 s).
func WithOperationTimeout(d time.Duration) Option { return func(r *Relay) { r.op = d } }

// WithLease sets how long a publisher that stopped keeps the lock (its
// connection's idle_session_timeout; default 15 s). It must exceed the
// poll interval and the operation timeout.
func WithLease(d time.Duration) Option { return func(r *Relay) { r.lease = d } }

// NewRelay returns a relay that reads pool's outbox and produces to the
// brokers of kcfg.
func NewRelay(pool *pgxpool.Pool, kcfg kafka.Config, opts ...Option) *Relay {
	r := &Relay{pool: pool, kcfg: kcfg, batch: 1000, poll: time.Second, op: 10 * time.Second, lease: 15 * time.Second}
	for _, o := range opts {
		o(r)
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.kcfg = r.kcfg.WithLogger(r.log)
	if r.m == nil {
		r.m = newMetrics(nil)
	}
	r.lease = max(r.lease, 2*r.poll, r.op+r.poll)
	return r
}

// closeWait bounds closing the lock connection at the end of a session.
const closeWait = time.Second

// maxRelayBackoff caps the wait between failed relay sessions: short
// enough that what waits in the outbox moves within seconds of Postgres or
// the broker coming back.
const maxRelayBackoff = 5 * time.Second

// Run publishes until ctx is done. Failures (the database or the broker
// gone) are logged and retried; Run returns only ctx's error.
func (r *Relay) Run(ctx context.Context) error {
	// From the poll interval to maxRelayBackoff after failures; a standby
	// tries again after the poll interval. Half jittered: the relays of
	// every process retry against the same database and broker.
	p := backoff.Policy{Floor: r.poll, Cap: maxRelayBackoff, Jitter: backoff.Half}
	b := backoff.New(p, nil)
	for {
		err := r.session(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var wait time.Duration
		if err != nil {
			wait = b.Next()
			r.log.Warn("outbox relay failed; retrying", "err", err, "retry_in", wait)
			r.m.failures.Inc()
		} else {
			b.Reset()
			wait = p.Wait(1, nil) // standby: try again soon
		}
		if err := backoff.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// session takes the lock on one connection and publishes on it until an
// error. It returns nil when another relay holds the lock.
func (r *Relay) session(ctx context.Context) error {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	var (
		got  bool
		name string
	)
	if err := r.round(ctx, func(ctx context.Context) error {
		return conn.QueryRow(ctx, lockSQL).Scan(&got, &name)
	}); err != nil {
		conn.Release()
		return fmt.Errorf("lock: %w", err)
	}
	if !got {
		// A standby: the connection holds nothing, so it goes back to the
		// pool (no new connection per attempt).
		conn.Release()
		return nil
	}
	// The session lock lives as long as the connection: never give it back
	// to the pool holding the lock.
	pc := conn.Hijack()
	defer func() {
		// Bounded like every round trip: Close writes a Terminate, which
		// without a deadline waits as long as the socket does when the
		// server side is gone.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeWait)
		defer cancel()
		_ = pc.Close(cctx)
	}()
	if err := r.round(ctx, func(ctx context.Context) error {
		// The lease: a publisher that stops sending anything loses its
		// session, and the lock with it.
		_, err := pc.Exec(ctx, fmt.Sprintf("SET idle_session_timeout = %d", r.lease.Milliseconds()))
		return err
	}); err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	r.m.active.Inc()
	defer r.m.active.Dec()
	// One transactional id per outbox: the id of a new publisher fences
	// the transactions of the one it replaced.
	txnID := r.kcfg.TransactionalID(topics.TxnOutboxPrefix + name)
	cl, err := kafka.NewProducer(r.kcfg, kgo.TransactionalID(txnID),
		kgo.TransactionTimeout(r.op+r.lease))
	if err != nil {
		return err
	}
	defer cl.Close()
	// Take the producer epoch now, before reading anything: from here on a
	// publisher that took over later fences this one, whatever it read.
	if err := r.round(ctx, func(ctx context.Context) error {
		_, _, err := cl.ProducerID(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("init producer id: %w", err)
	}
	r.log.Info("outbox relay publishing", "transactional_id", txnID)
	if err := r.round(ctx, func(ctx context.Context) error {
		_, err := pc.Exec(ctx, `LISTEN `+Channel)
		return err
	}); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	for {
		n, err := r.publish(ctx, pc, cl)
		if err != nil {
			return err
		}
		if n == r.batch {
			continue // more waiting
		}
		// Wait for a commit's notification, or poll: a notification can
		// be missed only across a reconnect, which starts with a publish.
		wctx, cancel := context.WithTimeout(ctx, r.poll)
		_, err = pc.WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("wait: %w", err)
		}
	}
}

func (r *Relay) round(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.op)
	defer cancel()
	return f(ctx)
}

const readSQL = `SELECT seq, topic, key, value, headers, created_at FROM event_outbox ORDER BY seq LIMIT $1`

// publish produces one batch in a transaction and deletes it; it returns
// the batch size.
func (r *Relay) publish(ctx context.Context, pc *pgx.Conn, cl *kgo.Client) (int, error) {
	var (
		seqs   []int64
		recs   []*kgo.Record
		oldest time.Time
	)
	err := r.round(ctx, func(ctx context.Context) error {
		rows, err := pc.Query(ctx, readSQL, r.batch)
		if err != nil {
			return err
		}
		var (
			seq        int64
			topic      string
			key, value []byte
			hdr        []byte
			at         time.Time
		)
		_, err = pgx.ForEachRow(rows, []any{&seq, &topic, &key, &value, &hdr, &at}, func() error {
			hs, err := decodeHeaders(hdr)
			if err != nil {
				return fmt.Errorf("outbox row %d: %w", seq, err)
			}
			if len(seqs) == 0 {
				oldest = at
			}
			seqs = append(seqs, seq)
			recs = append(recs, &kgo.Record{Topic: r.kcfg.Topic(topic), Key: clone(key), Value: clone(value), Headers: hs})
			return nil
		})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("read: %w", err)
	}
	if len(recs) == 0 {
		r.m.lag.Set(0)
		return 0, nil
	}
	r.m.lag.Set(time.Since(oldest).Seconds())
	if r.beforeProduce != nil {
		r.beforeProduce()
	}
	if err := r.round(ctx, func(ctx context.Context) error {
		if err := cl.BeginTransaction(); err != nil {
			return err
		}
		perr := produce(ctx, cl, recs)
		commit := kgo.TryCommit
		if perr != nil {
			commit = kgo.TryAbort
		}
		if err := cl.EndTransaction(ctx, commit); err != nil {
			return err
		}
		return perr
	}); err != nil {
		return 0, fmt.Errorf("produce: %w", err)
	}
	if err := r.round(ctx, func(ctx context.Context) error {
		_, err := pc.Exec(ctx, `DELETE FROM event_outbox WHERE seq = ANY($1)`, seqs)
		return err
	}); err != nil {
		return 0, fmt.Errorf("delete: %w", err)
	}
	r.m.published.Add(float64(len(recs)))
	return len(recs), nil
}

// produce produces recs and waits for them, or for ctx: ProduceSync
// would wait out the records' delivery timeout (30 s) while the broker is
// away, holding up a relay told to stop. Records still in flight when ctx
// ends belong to a transaction that is never committed: read_committed
// readers never see them, and the rows stay in the outbox.
func produce(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) error {
	var (
		mu      sync.Mutex
		first   error
		pending = len(recs)
		done    = make(chan struct{})
	)
	for _, rec := range recs {
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
			if pending--; pending == 0 {
				close(done)
			}
		})
	}
	select {
	case <-done:
		mu.Lock()
		defer mu.Unlock()
		return first
	case <-ctx.Done():
		return ctx.Err()
	}
}

// clone copies a scanned buffer, keeping nil (a tombstone) nil.
func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}

type metrics struct {
	published prometheus.Counter
	failures  prometheus.Counter
	lag       prometheus.Gauge
	active    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "mailplane_outbox_published_total",
			Help: "Outbox records produced to Kafka."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "mailplane_outbox_failures_total",
			Help: "Relay sessions ended by an error (database or broker)."}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mailplane_outbox_lag_seconds",
			Help: "Age of the oldest record waiting in the outbox at the last read (0: empty)."}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mailplane_outbox_relay_active",
			Help: "Relays of this process holding the publishing lock: 1 in the process that publishes, else 0."}),
	}
	if reg != nil {
		// Relays of one process (the outbox role's, each sync worker's)
		// share these series; active counts up and down so that a standby
		// does not clear the publisher's 1.
		m.published = promreg.MustRegister(reg, m.published)
		m.failures = promreg.MustRegister(reg, m.failures)
		m.lag = promreg.MustRegister(reg, m.lag)
		m.active = promreg.MustRegister(reg, m.active)
	}
	return m
}
