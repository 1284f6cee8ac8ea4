package imapsync

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Two runners on one registry share their series instead of panicking.
func TestMetricsShareTheRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	first, second := newMetrics(reg), newMetrics(reg)
	if first.failures != second.failures || first.settingUp != second.settingUp {
		t.Fatal("the second runner's metrics are not the first's")
	}
}
