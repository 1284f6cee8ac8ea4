package mailsync

import (
	"github.com/mailplane/mailplane/internal/promreg"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics of a worker. Gauges move by deltas, so workers sharing a
// registerer (several in one process) add up. No mailbox or user id is ever
// a label.
type metrics struct {
	partitionsOwned  prometheus.Gauge
	statePartitions  prometheus.Gauge
	runners          *prometheus.GaugeVec
	fencedWrites     prometheus.Counter
	watchdogStops    prometheus.Counter
	watchdogProbes   prometheus.Counter
	rebalances       *prometheus.CounterVec
	rebalanceSeconds *prometheus.HistogramVec
	tierChanges      *prometheus.CounterVec
	runnerFailures   prometheus.Counter
	badRecords       prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		partitionsOwned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mailplane_sync_partitions_owned",
			Help: "mailbox.state partitions this worker owns (assigned and holding a current epoch).",
		}),
		statePartitions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mailplane_sync_state_partitions",
			Help: "Partitions of mailbox.state as this worker last listed them: what the sync fleet must own between them.",
		}),
		runners: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mailplane_sync_runners",
			Help: "Mailbox runners running, by tier.",
		}, []string{"tier"}),
		fencedWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mailplane_sync_fenced_writes_total",
			Help: "Writes refused because their epoch was no longer the partition's (runner writes and tier records).",
		}),
		watchdogStops: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mailplane_sync_watchdog_stops_total",
			Help: "Times the watchdog stopped every runner because no group request had been answered for the session timeout minus the margin.",
		}),
		watchdogProbes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mailplane_sync_watchdog_probes_total",
			Help: "Heartbeats the watchdog sent itself while the group client was silent (a rebalance) that the coordinator answered REBALANCE_IN_PROGRESS: the member still held.",
		}),
		rebalances: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_sync_rebalances_total",
			Help: "Rebalance callbacks that changed this worker's partitions, by event (assigned, revoked, lost).",
		}, []string{"event"}),
		rebalanceSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mailplane_sync_rebalance_seconds",
			Help:    "assigned: per partition, from its assignment until its runners were started; revoked, lost: per callback, until every runner of the partitions had stopped.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"event"}),
		tierChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_sync_tier_changes_total",
			Help: "Tier changes decided by this worker, by new tier.",
		}, []string{"tier"}),
		runnerFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mailplane_sync_runner_failures_total",
			Help: "Runner runs that ended with an error (each is restarted after a backoff).",
		}),
		badRecords: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mailplane_sync_bad_records_total",
			Help: "mailbox.state, sync.tier or user records that did not decode and were skipped.",
		}),
	}
	m.partitionsOwned = promreg.MustRegister(reg, m.partitionsOwned)
	m.statePartitions = promreg.MustRegister(reg, m.statePartitions)
	m.runners = promreg.MustRegister(reg, m.runners)
	m.fencedWrites = promreg.MustRegister(reg, m.fencedWrites)
	m.watchdogStops = promreg.MustRegister(reg, m.watchdogStops)
	m.watchdogProbes = promreg.MustRegister(reg, m.watchdogProbes)
	m.rebalances = promreg.MustRegister(reg, m.rebalances)
	m.rebalanceSeconds = promreg.MustRegister(reg, m.rebalanceSeconds)
	m.tierChanges = promreg.MustRegister(reg, m.tierChanges)
	m.runnerFailures = promreg.MustRegister(reg, m.runnerFailures)
	m.badRecords = promreg.MustRegister(reg, m.badRecords)
	for _, t := range allTiers {
		m.runners.WithLabelValues(string(t))
		m.tierChanges.WithLabelValues(string(t))
	}
	return m
}
