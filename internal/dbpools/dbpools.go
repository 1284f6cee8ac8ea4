// Package dbpools opens a process's Postgres connection pools, one per
// purpose, and waits for the database instead of failing when it is not
// there yet.
//
// One pool for everything let a thousand sync runners' fenced writes hold
// every connection while the health check and the assignments API queued
// behind them (the health check then reported the database down while it
// was healthy). Each purpose now has its own pool, its size configurable:
//
//   - Serve: health checks and the HTTP APIs (worker assignments, billing).
//     Small, and never shared with background work.
//   - Runners: the sync runners' fenced writes and the sync workers'
//     ownership. Bounded: a runner waits for a connection (under its write
//     deadline) rather than each holding one.
//   - Work: projectors, the outbox relay, the engine's snapshot, pruning.
//
// A pool that is not needed by the roles of a process has size 0 and is
// not opened.
package dbpools

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/migrations"
)

// Sizes are the pools' maximum connections; 0 leaves a pool unopened.
type Sizes struct {
	Serve   int32
	Runners int32
	Work    int32
}

// Pools are a process's Postgres pools.
type Pools struct {
	Serve   *pgxpool.Pool
	Runners *pgxpool.Pool
	Work    *pgxpool.Pool
}

// Close closes every pool opened.
func (p *Pools) Close() {
	for _, pool := range []*pgxpool.Pool{p.Serve, p.Runners, p.Work} {
		if pool != nil {
			pool.Close()
		}
	}
}

// Waiter reports what opening the pools waits for: the health check of a
// process still starting says it (`database: waiting: <why>`).
type Waiter struct {
	mu    sync.Mutex
	err   error
	ready bool
	// ping is the pool the health check pings once open: serve, the one
	// it must never queue in (else whichever is open).
	ping *pgxpool.Pool
}

// Err is nil once the pools are open and their database answers a ping;
// before, it says what the process waits for.
func (w *Waiter) Err(ctx context.Context) error {
	w.mu.Lock()
	ready, err, pool := w.ready, w.err, w.ping
	w.mu.Unlock()
	switch {
	case !ready && err != nil:
		return fmt.Errorf("waiting for the database: %w", err)
	case !ready:
		return errors.New("waiting for the database: connecting")
	}
	return pool.Ping(ctx)
}

func (w *Waiter) waiting(err error) {
	w.mu.Lock()
	w.err = err
	w.mu.Unlock()
}

func (w *Waiter) opened(p *Pools) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ready, w.err = true, nil
	w.ping = cmp.Or(p.Serve, p.Work, p.Runners)
}

// Options tune Open.
type Options struct {
	// Logger gets one line per failed attempt: what failed, when the next
	// comes.
	Logger *slog.Logger
	// Waiter, when set, follows the wait (for the health check).
	Waiter *Waiter
	// MinBackoff and MaxBackoff bound the wait between attempts (default
	// 500 ms and 15 s); each wait is jittered.
	MinBackoff, MaxBackoff time.Duration
	// ConnectTimeout bounds one connection attempt (default 10 s).
	ConnectTimeout time.Duration
}

// Open opens the pools of sizes on url, applying the pending migrations
// first. While the database cannot be reached (or the migrations fail) it
// waits with backoff, logging each failure, until ctx is done. Only a URL
// that does not parse fails at once.
func Open(ctx context.Context, url string, sizes Sizes, o Options) (*Pools, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Waiter == nil {
		o.Waiter = &Waiter{}
	}
	o.MinBackoff = cmp.Or(o.MinBackoff, 500*time.Millisecond)
	o.MaxBackoff = cmp.Or(o.MaxBackoff, 15*time.Second)
	cfg.ConnConfig.ConnectTimeout = cmp.Or(o.ConnectTimeout, 10*time.Second)

	// Every process of a deployment waits for the same database: half
	// jittered, so they do not all knock at once when it comes up.
	b := backoff.New(backoff.Policy{Floor: o.MinBackoff, Cap: o.MaxBackoff, Jitter: backoff.Half}, nil)
	for attempt := 1; ; attempt++ {
		err := migrate(ctx, cfg, o.Logger)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		o.Waiter.waiting(err)
		wait := b.Next()
		o.Logger.Warn("waiting for the database", "attempt", attempt, "err", err, "retry_in", wait)
		if err := backoff.Sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
	p := &Pools{}
	for _, pp := range []struct {
		dst  **pgxpool.Pool
		size int32
		name string
	}{{&p.Serve, sizes.Serve, "serve"}, {&p.Runners, sizes.Runners, "runners"}, {&p.Work, sizes.Work, "work"}} {
		if pp.size <= 0 {
			continue
		}
		c := cfg.Copy()
		c.MaxConns = pp.size
		c.MinConns = 0
		c.ConnConfig.RuntimeParams["application_name"] = "mailplane-" + pp.name
		pool, err := pgxpool.NewWithConfig(ctx, c)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("pool %s: %w", pp.name, err)
		}
		*pp.dst = pool
	}
	o.Waiter.opened(p)
	o.Logger.Info("database ready", "serve_conns", sizes.Serve, "runner_conns", sizes.Runners, "work_conns", sizes.Work)
	return p, nil
}

// migrate connects once and applies the pending migrations (two minutes
// at most); the connection is closed after.
func migrate(ctx context.Context, cfg *pgxpool.Config, log *slog.Logger) error {
	c := cfg.Copy()
	c.MaxConns, c.MinConns = 1, 0
	pool, err := pgxpool.NewWithConfig(ctx, c)
	if err != nil {
		return err
	}
	defer pool.Close()
	mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := pool.Ping(mctx); err != nil {
		return err
	}
	if err := migrations.Apply(mctx, pool, migrations.WithLogger(log)); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	return nil
}
