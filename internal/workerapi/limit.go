package workerapi

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/promreg"
)

// Defaults of NewWorkerLimiter: a fleet brings up a few workers a second
// at most; a burst covers a deploy starting a batch of them.
const (
	DefaultNewWorkerRate  = 2.0
	DefaultNewWorkerBurst = 20
	// newWorkerMemory is how long an admitted id counts as known before
	// placement's projection shows it (its next heartbeats must not take
	// tokens again).
	newWorkerMemory = 10 * time.Minute
)

// KnownWorkers tells which worker ids placement already knows; *PGStore is
// one (placement_workers), in internal/placement/projection.
type KnownWorkers interface {
	KnownWorkers(ctx context.Context, ids []string) (map[string]bool, error)
}

// WorkerLimiter rate-limits heartbeats of worker ids placement does not
// know yet, with one token bucket for the whole server: whoever holds a
// credential (or a fleet secret, or a publish:worker.heartbeat scope),
// placement state grows by at most rate ids a second plus the burst.
type WorkerLimiter struct {
	known KnownWorkers
	rate  float64
	burst float64
	now   func() time.Time

	mu       sync.Mutex
	tokens   float64
	last     time.Time
	admitted map[string]time.Time // admitted, maybe not projected yet

	outcomes *prometheus.CounterVec
}

// NewWorkerLimiter returns a limiter admitting rate new worker ids a second
// with burst; rate <= 0 takes DefaultNewWorkerRate, burst <= 0
// DefaultNewWorkerBurst. Metrics go to reg (nil: unregistered).
func NewWorkerLimiter(known KnownWorkers, rate float64, burst int, reg prometheus.Registerer) *WorkerLimiter {
	if rate <= 0 {
		rate = DefaultNewWorkerRate
	}
	if burst <= 0 {
		burst = DefaultNewWorkerBurst
	}
	l := &WorkerLimiter{known: known, rate: rate, burst: float64(burst), tokens: float64(burst),
		now: time.Now, admitted: map[string]time.Time{},
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_workerapi_new_workers_total",
			Help: "Heartbeats of worker ids placement did not know yet, by outcome (admitted, limited).",
		}, []string{"outcome"})}
	if reg != nil {
		l.outcomes = promreg.MustRegister(reg, l.outcomes)
	}
	return l
}

// limitedError is a rate_limited refusal with its Retry-After.
type limitedError struct {
	err   *domain.Error
	retry time.Duration
}

func (e *limitedError) Error() string             { return e.err.Error() }
func (e *limitedError) Unwrap() error             { return e.err }
func (e *limitedError) RetryAfter() time.Duration { return e.retry }

// Admit is an api.Admission: it refuses, as a whole, a request whose
// heartbeats name more unknown worker ids than the bucket holds. Other
// events pass.
func (l *WorkerLimiter) Admit(ctx context.Context, events []domain.Event) error {
	var ids []string
	for _, ev := range events {
		if hb, ok := ev.Data.(*domain.WorkerHeartbeat); ok && ev.Type == domain.TypeWorkerHeartbeat {
			ids = append(ids, hb.WorkerID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	now := l.now()
	l.mu.Lock()
	for id, at := range l.admitted {
		if now.Sub(at) > newWorkerMemory {
			delete(l.admitted, id)
		}
	}
	ids = slices.DeleteFunc(ids, func(id string) bool { _, ok := l.admitted[id]; return ok })
	l.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	known, err := l.known.KnownWorkers(ctx, ids)
	if err != nil {
		return domain.Errorf(domain.CodeUnavailable, "worker ids could not be checked; retry shortly")
	}
	ids = slices.DeleteFunc(ids, func(id string) bool { return known[id] })
	if len(ids) == 0 {
		return nil
	}
	n := float64(len(ids))

	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() {
		l.tokens = math.Min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	}
	l.last = now
	if n > l.tokens {
		l.outcomes.WithLabelValues("limited").Add(n)
		retry := time.Duration(math.Ceil((math.Min(n, l.burst)-l.tokens)/l.rate)) * time.Second
		if n > l.burst {
			// Never admissible in one request: say so rather than let the
			// client retry forever.
			return &limitedError{err: domain.Errorf(domain.CodeRateLimited,
				"%d new worker ids in one request; at most %d are admitted at once", len(ids), int(l.burst)), retry: retry}
		}
		return &limitedError{err: domain.Errorf(domain.CodeRateLimited,
			"too many new worker ids; retry in %s", retry), retry: retry}
	}
	l.tokens -= n
	for _, id := range ids {
		l.admitted[id] = now
	}
	l.outcomes.WithLabelValues("admitted").Add(n)
	return nil
}
