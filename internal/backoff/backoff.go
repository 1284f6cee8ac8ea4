// Package backoff is how every loop in mailplane that retries waits
// between attempts: exponential waits from a floor to a cap, with a
// random part (jitter), so that a fleet of workers retrying the same
// failure spreads out instead of striking together. Consumers, runners,
// relays and startup probes all pace themselves with it, each with its own
// Policy; none writes its own doubling.
package backoff

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Policy says how long to wait before each attempt after a failure.
type Policy struct {
	// Floor is the wait after the first failure. Default 100ms.
	Floor time.Duration
	// Cap is the longest wait; waits double from Floor up to it. Default
	// 30s, or Floor if that is larger.
	Cap time.Duration
	// Jitter is the part of each wait drawn at random, from 0 (none: the
	// wait is the ceiling) to 1 (full jitter: anything from zero to the
	// ceiling). Peers that fail together (sync workers against one mail
	// server, every projector against one Postgres) use a half, so that
	// no wait is zero and no two attempts line up.
	Jitter float64
}

// Half is the jitter the house uses between peers: half of each wait
// fixed, half random.
const Half = 0.5

func (p Policy) normalized() Policy {
	if p.Floor <= 0 {
		p.Floor = 100 * time.Millisecond
	}
	if p.Cap <= 0 {
		p.Cap = 30 * time.Second
	}
	p.Cap = max(p.Cap, p.Floor)
	p.Jitter = min(max(p.Jitter, 0), 1)
	return p
}

// Ceiling is the longest wait after the n-th failure in a row (n from 1):
// Floor doubled n-1 times, at most Cap.
func (p Policy) Ceiling(n int) time.Duration {
	p = p.normalized()
	d := p.Floor
	for i := 1; i < n && d < p.Cap; i++ {
		d *= 2
	}
	return min(d, p.Cap)
}

// Wait is the wait after the n-th failure in a row, drawn with rnd (nil:
// the process's source): the ceiling, less a random part of up to Jitter
// of it.
func (p Policy) Wait(n int, rnd *rand.Rand) time.Duration {
	p = p.normalized()
	return p.jittered(p.Ceiling(n), rnd)
}

func (p Policy) jittered(ceiling time.Duration, rnd *rand.Rand) time.Duration {
	random := time.Duration(float64(ceiling) * p.Jitter)
	if random <= 0 {
		return ceiling
	}
	var r time.Duration
	if rnd != nil {
		r = time.Duration(rnd.Int64N(int64(random) + 1))
	} else {
		r = rand.N(random + 1)
	}
	return ceiling - random + r
}

// Backoff counts the failures in a row of one loop and gives the wait
// after each. It is not safe for concurrent use: a loop owns its Backoff.
type Backoff struct {
	p   Policy
	n   int
	rnd *rand.Rand
}

// New returns a Backoff pacing by p. rnd, if not nil, draws the jitter
// (tests pass a seeded source); nil uses the process's.
func New(p Policy, rnd *rand.Rand) *Backoff { return &Backoff{p: p.normalized(), rnd: rnd} }

// Next records a failure and returns how long to wait before the next
// attempt.
func (b *Backoff) Next() time.Duration {
	b.n++
	return b.p.Wait(b.n, b.rnd)
}

// NextWithin is Next with the ceiling lowered to limit (never below the
// floor): for a failure whose retry should come sooner than the policy's
// cap, say a server that asked to be retried within a minute.
func (b *Backoff) NextWithin(limit time.Duration) time.Duration {
	b.n++
	c := min(b.p.Ceiling(b.n), max(limit, b.p.Floor))
	return b.p.jittered(c, b.rnd)
}

// Failures is how many failures in a row Next has counted since the last
// Reset.
func (b *Backoff) Failures() int { return b.n }

// Reset records a success: the next failure waits the floor again.
func (b *Backoff) Reset() { b.n = 0 }

// Sleep waits d or until ctx is done, whichever is first, and returns
// ctx's error in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// permanent marks an error Retry must not retry.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent wraps err so that Retry returns it at once instead of trying
// again: a failure no wait will cure (bad configuration, a refused
// credential).
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// Retry calls fn until it returns nil, returns an error wrapped by
// Permanent (returned unwrapped), or ctx is done (ctx's error, joined with
// fn's last). Between attempts it waits by p; onRetry, if not nil, is told
// of each failure and the wait after it, for logs and metrics.
func Retry(ctx context.Context, p Policy, onRetry func(failures int, wait time.Duration, err error), fn func(ctx context.Context) error) error {
	b := New(p, nil)
	for {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if pe, ok := errors.AsType[permanent](err); ok {
			return pe.err
		}
		if ctx.Err() != nil {
			return errors.Join(ctx.Err(), err)
		}
		wait := b.Next()
		if onRetry != nil {
			onRetry(b.Failures(), wait, err)
		}
		if serr := Sleep(ctx, wait); serr != nil {
			return errors.Join(serr, err)
		}
	}
}
