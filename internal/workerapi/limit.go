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
	// DefaultRememberedWorkers bounds the worker ids the limiter remembers
	// as known (about 100 bytes each).
	DefaultRememberedWorkers = 65_536
	// knownCheckTimeout bounds one question to Postgres: a heartbeat does
	// not wait on a database that does not answer.
	knownCheckTimeout = 2 * time.Second
)

// KnownWorkers tells which worker ids placement already knows; *PGStore is
// one (placement_workers), in internal/placement/postgres.
type KnownWorkers interface {
	KnownWorkers(ctx context.Context, ids []string) (map[string]bool, error)
}

// WorkerLimiter rate-limits heartbeats of worker ids placement does not
// know yet, with one token bucket for the whole server: whoever holds a
// credential (or a fleet secret, or a publish:worker.heartbeat scope),
// placement state grows by at most rate ids a second plus the burst.
//
// It remembers the ids it found known or admitted (bounded: the least
// recently seen are forgotten first), and asks Postgres only about the
// others, so a heartbeat of a worker it has seen needs no database: a
// Postgres outage must not silence the fleet (the engine, which folds the
// heartbeats from the log, knows its workers). When Postgres cannot be
// asked, ids it does not remember are charged to the bucket as new ones,
// which still bounds how fast placement state can grow.
type WorkerLimiter struct {
	known KnownWorkers
	rate  float64
	burst float64
	now   func() time.Time

	mu     sync.Mutex
	tokens float64
	last   time.Time
	seen   recentSet

	outcomes *prometheus.CounterVec
}

// NewWorkerLimiter returns a limiter admitting rate new worker ids a second
// with burst; rate <= 0 takes DefaultNewWorkerRate, burst <= 0
// DefaultNewWorkerBurst. It remembers DefaultRememberedWorkers ids.
// Metrics go to reg (nil: unregistered).
func NewWorkerLimiter(known KnownWorkers, rate float64, burst int, reg prometheus.Registerer) *WorkerLimiter {
	if rate <= 0 {
		rate = DefaultNewWorkerRate
	}
	if burst <= 0 {
		burst = DefaultNewWorkerBurst
	}
	l := &WorkerLimiter{known: known, rate: rate, burst: float64(burst), tokens: float64(burst),
		now: time.Now, seen: newRecentSet(DefaultRememberedWorkers),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_workerapi_new_workers_total",
			Help: "Heartbeats of worker ids the limiter did not remember, by outcome: known (placement knows them), admitted (new, a token each), unchecked (Postgres could not be asked: admitted on a token each), limited (refused 429).",
		}, []string{"outcome"})}
	for _, o := range []string{"known", "admitted", "unchecked", "limited"} {
		l.outcomes.WithLabelValues(o)
	}
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
// heartbeats name more new worker ids than the bucket holds. Other
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
	l.mu.Lock()
	ids = slices.DeleteFunc(ids, l.seen.touch)
	l.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	outcome := "admitted"
	qctx, cancel := context.WithTimeout(ctx, knownCheckTimeout)
	known, err := l.known.KnownWorkers(qctx, ids)
	cancel()
	if err != nil {
		outcome = "unchecked" // every id it does not remember is charged
	} else if n := len(ids); n > 0 {
		ids = slices.DeleteFunc(ids, func(id string) bool { return known[id] })
		l.mu.Lock()
		for id := range known {
			l.seen.add(id)
		}
		l.mu.Unlock()
		l.outcomes.WithLabelValues("known").Add(float64(n - len(ids)))
	}
	if len(ids) == 0 {
		return nil
	}
	n := float64(len(ids))
	now := l.now()

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
		l.seen.add(id)
	}
	l.outcomes.WithLabelValues(outcome).Add(n)
	return nil
}

// recentSet remembers at most about max ids, forgetting the least
// recently seen first: two generations, the older dropped whole when the
// newer is full; an id seen again moves to the newer. The caller locks.
type recentSet struct {
	max       int
	cur, prev map[string]struct{}
}

func newRecentSet(max int) recentSet {
	return recentSet{max: max, cur: map[string]struct{}{}, prev: map[string]struct{}{}}
}

// touch reports whether id is remembered, and keeps it if so.
func (s *recentSet) touch(id string) bool {
	if _, ok := s.cur[id]; ok {
		return true
	}
	if _, ok := s.prev[id]; ok {
		s.add(id)
		return true
	}
	return false
}

func (s *recentSet) add(id string) {
	if len(s.cur) >= s.max/2 {
		s.prev, s.cur = s.cur, make(map[string]struct{}, len(s.cur))
	}
	s.cur[id] = struct{}{}
	delete(s.prev, id)
}

// len is how many ids are remembered.
func (s *recentSet) len() int { return len(s.cur) + len(s.prev) }
