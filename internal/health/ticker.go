package health

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/topics"
)

// Ticker evaluates the rows that are due (a penalty ended, evidence left
// the window) on the wall clock. Any number may run: rows are claimed with
// SKIP LOCKED.
type Ticker struct {
	pool     *pgxpool.Pool
	policy   domain.HealthPolicy
	interval time.Duration
	batch    int
	now      func() time.Time
	log      *slog.Logger
	m        *Metrics
}

// TickerOption configures a Ticker.
type TickerOption func(*Ticker)

// WithInterval sets how often due rows are looked for (default 1 min).
func WithInterval(d time.Duration) TickerOption { return func(t *Ticker) { t.interval = d } }

// WithClock sets the clock (default time.Now).
func WithClock(now func() time.Time) TickerOption { return func(t *Ticker) { t.now = now } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) TickerOption { return func(t *Ticker) { t.log = l } }

// WithMetrics records the ticker's work and the state gauges in m.
func WithMetrics(m *Metrics) TickerOption { return func(t *Ticker) { t.m = m } }

// NewTicker returns a ticker over pool's mailbox_health.
func NewTicker(pool *pgxpool.Pool, policy domain.HealthPolicy, opts ...TickerOption) *Ticker {
	t := &Ticker{pool: pool, policy: policy, interval: time.Minute, batch: 500, now: time.Now}
	for _, o := range opts {
		o(t)
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	return t
}

// Run ticks until ctx is done.
func (t *Ticker) Run(ctx context.Context) error {
	tk := time.NewTicker(t.interval)
	defer tk.Stop()
	for {
		for {
			n, err := t.Tick(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				t.log.Warn("health tick failed", "err", err)
				break
			}
			if n < t.batch {
				break
			}
		}
		if t.m != nil {
			if err := t.m.refreshStates(ctx, t.pool); err != nil && ctx.Err() == nil {
				t.log.Warn("health state counts", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tk.C:
		}
	}
}

const dueSQL = `SELECT mailbox_id::text, state, until, penalty_seconds, probation, score,
       bucket_hours, bucket_inbox, bucket_junk, last_eval
FROM mailbox_health WHERE next_check <= $1 ORDER BY next_check LIMIT $2 FOR UPDATE SKIP LOCKED`

// Tick evaluates one batch of due rows and returns how many it took.
func (t *Ticker) Tick(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	now := t.now().UTC()
	var (
		n       int
		emitted []domain.Event
	)
	err := pgx.BeginFunc(ctx, t.pool, func(tx pgx.Tx) error {
		emitted = emitted[:0]
		rows, err := tx.Query(ctx, dueSQL, now, t.batch)
		if err != nil {
			return err
		}
		recs, err := scanRecords(rows)
		if err != nil {
			return err
		}
		n = len(recs)
		if n == 0 {
			return nil
		}
		ids := make([]string, 0, n)
		changed := map[string]time.Time{}
		var out []*kgo.Record
		for id, r := range recs {
			ids = append(ids, id)
			next, scored := t.policy.Evaluate(*r, now)
			*r = next
			if scored == nil {
				continue
			}
			ev := domain.Event{ID: domain.NewEventID(), Type: domain.TypeMailboxHealthScored, Source: Source,
				Time: r.LastEval, Subject: id, Data: scored}
			rec, err := topics.Encode(ev)
			if err != nil {
				return err
			}
			out = append(out, rec)
			emitted = append(emitted, ev)
			changed[id] = r.LastEval
		}
		if err := save(ctx, tx, t.policy, recs, ids, nil, changed); err != nil {
			return err
		}
		return outbox.Add(ctx, tx, out...)
	})
	if err != nil {
		return 0, fmt.Errorf("health: tick: %w", err)
	}
	if t.m != nil {
		t.m.ticked.Add(float64(n))
		t.m.Committed(emitted)
	}
	return n, nil
}
