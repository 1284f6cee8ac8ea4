package health_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/health"
)

// Two health loops on one registry share the series: the second
// registers without panicking and what it counts is exported.
func TestMetricsShareTheRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	health.NewMetrics(reg)
	second := health.NewMetrics(reg)
	second.Committed([]domain.Event{{Data: &domain.WarmupObserved{Placement: domain.PlacedInbox}}})
	n, err := testutil.GatherAndCount(reg, "mailplane_health_observations_total")
	if err != nil || n != 1 {
		t.Fatalf("mailplane_health_observations_total: %d series, %v", n, err)
	}
}
