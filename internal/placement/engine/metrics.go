package engine

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/promreg"
)

// metrics are the engine's series. Labels are bounded sets (decision kinds,
// reasons, tiers, pools, health states): never a mailbox, worker or org id.
type metrics struct {
	decisions  *prometheus.CounterVec // kind, reason
	pending    prometheus.Gauge
	promotions prometheus.Counter
	migrations prometheus.Counter
	workers    *prometheus.GaugeVec // tier, pool, health
	active     prometheus.Gauge
	commits    prometheus.Counter
	aborts     *prometheus.CounterVec // reason
	deadLetter *prometheus.CounterVec // code
	restore    prometheus.Histogram
	restoreLen prometheus.Gauge
	// restoreFailures counts restores retried.
	restoreFailures prometheus.Counter
	// holding is 1 while the active engine holds liveness; holds counts
	// the holds it began.
	holding prometheus.Gauge
	holds   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_placement_decisions_total",
			Help: "Placement decisions committed to the decision log, by kind (assigned, refused, migrated, ...) and reason.",
		}, []string{"kind", "reason"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mailplane_placement_pending",
			Help: "Pending placements: refused mailboxes waiting for capacity plus dedicated orgs' mailboxes degraded onto shared premium.",
		}),
		promotions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mailplane_placement_promotions_total",
			Help: "Workers promoted into a risk pool or to dedicated.",
		}),
		migrations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mailplane_placement_migrations_total",
			Help: "Mailboxes moved from one worker to another.",
		}),
		workers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mailplane_placement_workers",
			Help: `Sending workers known to the engine by tier, risk pool and health state; health is "dead" for workers whose heartbeats stopped.`,
		}, []string{"tier", "pool", "health"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mailplane_placement_engine_active",
			Help: "1 while this engine is the active (deciding) one, 0 while it is a standby or restoring.",
		}),
		commits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mailplane_placement_transactions_total",
			Help: "Decision-log transactions committed.",
		}),
		aborts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_placement_aborts_total",
			Help: "Batches abandoned, by reason: not_committed (rebalance, membership lost, offset commit refused), produce_error, end_error (the session ends), decider (the decider failed; the session ends). Each is followed by a restore.",
		}, []string{"reason"}),
		deadLetter: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_placement_dead_letters_total",
			Help: "Input records that could not be decoded, sent to the DLQ in the transaction that skipped them, by error code.",
		}, []string{"code"}),
		restore: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mailplane_placement_restore_seconds",
			Help:    "Time to restore the engine's state (checkpoint load and decision-log tail) on becoming active.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}),
		restoreFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mailplane_placement_restore_failures_total",
			Help: "Restores that failed (checkpoint or decision log unreadable) and were retried while the engine kept its inputs.",
		}),
		holding: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mailplane_placement_liveness_holding",
			Help: "1 while the active engine holds liveness (too many workers silent at once: no worker is declared dead for silence), 0 otherwise and on a standby.",
		}),
		holds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mailplane_placement_liveness_holds_total",
			Help: "Liveness holds this engine began (placement.liveness_held decisions committed).",
		}),
		restoreLen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mailplane_placement_restore_decisions",
			Help: "Decisions folded from the decision log by the last restore.",
		}),
	}
	m.decisions = promreg.MustRegister(reg, m.decisions)
	m.pending = promreg.MustRegister(reg, m.pending)
	m.promotions = promreg.MustRegister(reg, m.promotions)
	m.migrations = promreg.MustRegister(reg, m.migrations)
	m.workers = promreg.MustRegister(reg, m.workers)
	m.active = promreg.MustRegister(reg, m.active)
	m.commits = promreg.MustRegister(reg, m.commits)
	m.aborts = promreg.MustRegister(reg, m.aborts)
	m.deadLetter = promreg.MustRegister(reg, m.deadLetter)
	m.restore = promreg.MustRegister(reg, m.restore)
	m.restoreLen = promreg.MustRegister(reg, m.restoreLen)
	m.restoreFailures = promreg.MustRegister(reg, m.restoreFailures)
	m.holding = promreg.MustRegister(reg, m.holding)
	m.holds = promreg.MustRegister(reg, m.holds)
	return m
}

// setActive sets the active gauge and, from st (nil when not active),
// the liveness hold gauge.
func (m *metrics) setActive(active bool, st *placement.State) {
	a, h := 0.0, 0.0
	if active {
		a = 1
	}
	if active && st != nil && st.Liveness().Holding {
		h = 1
	}
	m.active.Set(a)
	m.holding.Set(h)
}

// decisionKind is the kind label of a decision type:
// "mailplane.placement.assigned.v1" → "assigned".
func decisionKind(eventType string) string {
	return strings.TrimPrefix(domain.ShortType(eventType), "placement.")
}

// workerLabels are a worker's labels on mailplane_placement_workers.
type workerLabels struct{ tier, pool, health string }

func labelsOf(v placement.WorkerView) workerLabels {
	health := string(v.Health)
	if !v.Live {
		health = "dead"
	}
	return workerLabels{string(v.Tier), string(v.Pool), health}
}

// workerGauge keeps mailplane_placement_workers exact: it remembers every
// worker's labels and moves the worker between series when they change.
type workerGauge struct {
	vec    *prometheus.GaugeVec
	of     map[string]workerLabels
	counts map[workerLabels]int
}

func newWorkerGauge(vec *prometheus.GaugeVec) *workerGauge {
	return &workerGauge{vec: vec, of: map[string]workerLabels{}, counts: map[workerLabels]int{}}
}

// reset forgets every worker and zeroes the series it set.
func (g *workerGauge) reset() {
	for l := range g.counts {
		g.counts[l] = 0
		g.vec.WithLabelValues(l.tier, l.pool, l.health).Set(0)
	}
	clear(g.of)
}

// update sets worker id's labels from the state.
func (g *workerGauge) update(s *placement.State, id string) {
	v, ok := s.Worker(id)
	old, had := g.of[id]
	if !ok {
		if had {
			delete(g.of, id)
			g.move(old, -1)
		}
		return
	}
	l := labelsOf(v)
	if had && old == l {
		return
	}
	if had {
		g.move(old, -1)
	}
	g.of[id] = l
	g.move(l, +1)
}

func (g *workerGauge) move(l workerLabels, by int) {
	g.counts[l] += by
	g.vec.WithLabelValues(l.tier, l.pool, l.health).Set(float64(g.counts[l]))
}

// workerOf returns the worker a decision changes, if any.
func workerOf(d domain.PlacementDecision) (string, bool) {
	switch d := d.(type) {
	case *domain.PlacementWorkerRegistered:
		return d.WorkerID, true
	case *domain.PlacementWorkerChanged:
		return d.WorkerID, true
	case *domain.PlacementWorkerHealthChanged:
		return d.WorkerID, true
	case *domain.PlacementWorkerDied:
		return d.WorkerID, true
	case *domain.PlacementWorkerForgotten:
		return d.WorkerID, true
	case *domain.PlacementWorkerPromoted:
		return d.WorkerID, true
	case *domain.PlacementWorkerReverted:
		return d.WorkerID, true
	case *domain.PlacementDedicatedBound:
		return d.WorkerID, true
	case *domain.PlacementDedicatedReleased:
		return d.WorkerID, true
	}
	return "", false
}
