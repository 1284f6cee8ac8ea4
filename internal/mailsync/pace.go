package mailsync

import (
	"context"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// hostPacer paces connection setup per IMAP host with a token bucket per
// host: a worker that is handed thousands of mailboxes on one provider at
// once (an assignment, a failover) ramps its connections up instead of
// opening them all in the same second.
type hostPacer struct {
	rate  float64 // tokens per second; <= 0: no pacing
	burst float64

	mu      sync.Mutex
	buckets map[string]*bucket
	now     func() time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newHostPacer(rate float64, burst int) *hostPacer {
	return &hostPacer{rate: rate, burst: float64(max(burst, 1)), buckets: map[string]*bucket{}, now: time.Now}
}

// wait takes a token of host's bucket, waiting for it if needed. Tokens are
// reserved in call order, so waiters are served first come, first served.
func (p *hostPacer) wait(ctx context.Context, host string) error {
	if p.rate <= 0 {
		return ctx.Err()
	}
	host = strings.ToLower(host)
	p.mu.Lock()
	now := p.now()
	b := p.buckets[host]
	if b == nil {
		if len(p.buckets) > 10000 {
			p.pruneLocked(now)
		}
		b = &bucket{tokens: p.burst, last: now}
		p.buckets[host] = b
	}
	b.tokens = min(p.burst, b.tokens+now.Sub(b.last).Seconds()*p.rate)
	b.last = now
	b.tokens--
	var d time.Duration
	if b.tokens < 0 {
		d = time.Duration(-b.tokens / p.rate * float64(time.Second))
	}
	p.mu.Unlock()
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		// Give the reservation back.
		p.mu.Lock()
		b.tokens = min(p.burst, b.tokens+1)
		p.mu.Unlock()
		return ctx.Err()
	}
}

// pruneLocked drops full buckets: they carry no state.
func (p *hostPacer) pruneLocked(now time.Time) {
	for h, b := range p.buckets {
		if b.tokens+now.Sub(b.last).Seconds()*p.rate >= p.burst {
			delete(p.buckets, h)
		}
	}
}

// HostSlots bounds what a worker runs at once on each IMAP host: the warm
// and cold polls (Config.PollsInFlight), and the IMAP runner's setups
// (imapsync's share of its setup slots per host). For the polls: the
// connection pacing bounds how fast polls start, not how many are open:
// when the runners' store is slower than the pace (a cold start of 25,000
// mailboxes per worker, each first poll writing its cursors), polls that
// started keep their IMAP connections open while they wait, and at 100,000
// mailboxes four workers held 10,000 connections each, filling the IMAP
// server's file table (BENCHMARKS.md, "Fleet rehearsal"). The bound is per
// host, like the pacing and like the connection limits providers set per
// client: a host that does not answer holds only its own mailboxes' slots.
// Slots are handed out first come, first served.
type HostSlots struct {
	n int64 // per host; <= 0: unbounded

	mu    sync.Mutex
	hosts map[string]*hostSlots
}

type hostSlots struct {
	sem   *semaphore.Weighted
	users int // holding or waiting: the entry goes with the last
}

// NewHostSlots returns n slots per host (n <= 0: unbounded). Host names
// are compared case-insensitively.
func NewHostSlots(n int) *HostSlots {
	return &HostSlots{n: int64(n), hosts: map[string]*hostSlots{}}
}

// Acquire waits for a slot of host; release gives it back (once, however
// often it is called).
func (p *HostSlots) Acquire(ctx context.Context, host string) (release func(), err error) {
	if p == nil || p.n <= 0 {
		return func() {}, ctx.Err()
	}
	host = strings.ToLower(host)
	p.mu.Lock()
	h := p.hosts[host]
	if h == nil {
		h = &hostSlots{sem: semaphore.NewWeighted(p.n)}
		p.hosts[host] = h
	}
	h.users++
	p.mu.Unlock()
	leave := func() {
		p.mu.Lock()
		if h.users--; h.users == 0 {
			delete(p.hosts, host)
		}
		p.mu.Unlock()
	}
	if err := h.sem.Acquire(ctx, 1); err != nil {
		leave()
		return func() {}, err
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			h.sem.Release(1)
			leave()
		})
	}, nil
}
