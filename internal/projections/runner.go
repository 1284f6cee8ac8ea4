package projections

import "github.com/prometheus/client_golang/prometheus"

// RunnerMetrics are the projector metrics a runner outside this package
// reports under (the placement projection's own runner).
type RunnerMetrics struct {
	Applied      *prometheus.CounterVec
	BatchSeconds *prometheus.HistogramVec
	Retries      *prometheus.CounterVec
}

// NewRunnerMetrics registers (or reuses) the projector metrics on reg.
func NewRunnerMetrics(reg prometheus.Registerer) *RunnerMetrics {
	m := newMetrics(reg)
	return &RunnerMetrics{Applied: m.applied, BatchSeconds: m.batchSeconds, Retries: m.retries}
}
