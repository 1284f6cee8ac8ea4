package consume

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/internal/promreg"
)

// metrics are the runtime's series of one consumer, labelled by its name.
type metrics struct {
	polls         prometheus.Counter
	records       prometheus.Counter
	handlerErrors prometheus.Counter
	fetchErrors   prometheus.Counter
	skipped       prometheus.Counter
	aborts        prometheus.Counter
	leaveTimeouts prometheus.Counter
	rebalances    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, name string) *metrics {
	counter := func(what, help string) prometheus.Counter {
		return promreg.MustRegister(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_consume_" + what + "_total", Help: help,
		}, []string{"consumer"})).WithLabelValues(name)
	}
	return &metrics{
		polls:         counter("polls", "Polls of the consumer runtime (internal/consume), by consumer."),
		records:       counter("records", "Records polled, by consumer."),
		handlerErrors: counter("handler_errors", "Handler calls that failed and ended the consumer's run, by consumer."),
		fetchErrors:   counter("fetch_errors", "Fetch errors seen by the consumer runtime, by consumer."),
		skipped:       counter("redriven_skipped", "Records redriven from the dead-letter topic for another consumer and skipped, by consumer."),
		aborts:        counter("transaction_aborts", "Kafka transactions of a batch (Batch.Transact) that aborted, by consumer."),
		leaveTimeouts: counter("leave_timeouts", "Leaves of the group that did not finish within their bound, by consumer."),
		rebalances: promreg.MustRegister(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_consume_rebalance_callbacks_total",
			Help: "Partition callbacks of group consumers (assigned, revoked, lost), by consumer.",
		}, []string{"consumer", "event"})),
	}
}
