package projections

import (
	"github.com/mailplane/mailplane/internal/promreg"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are shared by every projector registered on one Registerer and
// labelled by projector name; mailbox or user ids never become labels. Lag
// and latency are the consumer's (internal/sla).
type metrics struct {
	applied      *prometheus.CounterVec
	batchSeconds *prometheus.HistogramVec
	dlq          *prometheus.CounterVec
	duplicates   *prometheus.CounterVec
	retries      *prometheus.CounterVec
	pruned       *prometheus.CounterVec
	batchLimit   *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		applied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_projector_records_applied_total",
			Help: "Events applied to Postgres by a projector (duplicates and dead letters excluded).",
		}, []string{"projector"}),
		batchSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mailplane_projector_batch_apply_seconds",
			Help:    "Time to apply one batch in one transaction, commit included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"projector"}),
		dlq: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_dlq_records_total",
			Help: "Records a projector sent to the DLQ, by error code.",
		}, []string{"projector", "code"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_projector_duplicates_skipped_total",
			Help: "Events skipped because their id was already applied (redelivery or a producer retry).",
		}, []string{"projector"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_projector_retries_total",
			Help: "Failed batch attempts that were retried, by kind (transient, permanent, fenced).",
		}, []string{"projector", "kind"}),
		pruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_projector_applied_ids_pruned_total",
			Help: "Applied event ids forgotten by a projector's prune, older than its dedupe window.",
		}, []string{"projector"}),
		batchLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mailplane_projector_batch_limit_records",
			Help: "The most records a projector's transaction takes now: its batch size, up to four times that while it catches up.",
		}, []string{"projector"}),
	}
	m.applied = promreg.MustRegister(reg, m.applied)
	m.batchSeconds = promreg.MustRegister(reg, m.batchSeconds)
	m.dlq = promreg.MustRegister(reg, m.dlq)
	m.duplicates = promreg.MustRegister(reg, m.duplicates)
	m.retries = promreg.MustRegister(reg, m.retries)
	m.pruned = promreg.MustRegister(reg, m.pruned)
	m.batchLimit = promreg.MustRegister(reg, m.batchLimit)
	return m
}
