package mailsync_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/sla"
)

// TestSyncLag: a worker reports the lag of every mailbox.state partition
// it owns, nothing behind once its live set is read; a member joining
// takes partitions, which the first stops reporting; a member that left
// reports none.
func TestSyncLag(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	f := newFixture(10)
	var mbs []domain.MailboxStateRecord
	for range 40 {
		mbs = append(mbs, f.mailbox("", time.Hour))
	}
	e.produce(stateRecords(t, mbs...)...)
	a := e.start(testConfig(t, "lag-a"), nil)
	waitFor(t, 30*time.Second, "the first member caught up on every partition", func() (bool, string) {
		lags := syncLag(t, a.reg)
		if len(lags) != 4 {
			return false, fmt.Sprintf("partitions reported: %v", lags)
		}
		for p, v := range lags {
			if v != 0 {
				return false, fmt.Sprintf("partition %s %v records behind", p, v)
			}
		}
		return true, ""
	})
	b := e.start(testConfig(t, "lag-b"), nil)
	waitFor(t, 30*time.Second, "the members reporting the partitions between them", func() (bool, string) {
		la, lb := syncLag(t, a.reg), syncLag(t, b.reg)
		if len(la) == 0 || len(lb) == 0 || len(la)+len(lb) != 4 {
			return false, fmt.Sprintf("first %v, second %v", la, lb)
		}
		for p := range la {
			if _, both := lb[p]; both {
				return false, "partition " + p + " reported by both"
			}
		}
		return true, ""
	})
	a.stop()
	if la := syncLag(t, a.reg); len(la) != 0 {
		t.Fatalf("a member that left reports %v", la)
	}
}

// syncLag returns the records behind of each partition the sync consumer
// reports on reg, by partition.
func syncLag(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "mailplane_consumer_lag_records" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["consumer"] == string(sla.Sync) {
				out[labels["partition"]] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}
