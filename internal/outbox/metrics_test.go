package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/outbox"
)

// Two relays of one process on one registry (the outbox role's and a
// sync worker's) share their series: the second registers without
// panicking, the publisher's records count, and the standby's rounds do
// not clear the publisher's relay_active.
func TestRelaysShareMetrics(t *testing.T) {
	t.Parallel()
	pool, brokers := setup(t)
	reg := prometheus.NewRegistry()
	startRelay(t, context.Background(), pool, brokers, outbox.WithRegisterer(reg))
	add(t, pool, true, &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("1")})
	consume(t, brokers, 1)
	waitEmpty(t, pool)

	// The standby on a pool of its own, to count its rounds.
	standby, err := pgxpool.NewWithConfig(context.Background(), pool.Config().Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.Close)
	startRelay(t, context.Background(), standby, brokers, outbox.WithRegisterer(reg))
	// A second acquire means the first standby round is over.
	waitFor(t, "a standby round", func() bool { return standby.Stat().AcquireCount() >= 2 })
	add(t, pool, true, &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("2")})
	consume(t, brokers, 2)
	// Counted after the delete: wait for it.
	waitFor(t, "published_total 2", func() bool { return metricValue(t, reg, "mailplane_outbox_published_total") == 2 })
	if active := metricValue(t, reg, "mailplane_outbox_relay_active"); active != 1 {
		t.Fatalf("relay_active %v with one relay publishing and one standing by, want 1", active)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("no %s in 30 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	n, err := testutil.GatherAndCount(reg, name)
	if err != nil || n != 1 {
		t.Fatalf("%s: %d series, %v", name, n, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	t.Fatalf("%s not gathered", name)
	return 0
}
