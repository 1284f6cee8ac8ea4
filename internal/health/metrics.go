package health

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/promreg"
)

// Metrics are the health loop's metrics.
type Metrics struct {
	observations *prometheus.CounterVec
	scored       *prometheus.CounterVec
	states       *prometheus.GaugeVec
	ticked       prometheus.Counter
}

// NewMetrics registers the health metrics on reg (nil: unregistered); a
// second call on one registerer shares the first one's series.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		observations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mailplane_health_observations_total",
			Help: "Warmup placement observations scored, by placement (inbox, junk)."}, []string{"placement"}),
		scored: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mailplane_health_scored_total",
			Help: "mailbox.health_scored events emitted, by new state."}, []string{"state"}),
		states: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mailplane_health_mailboxes",
			Help: "Mailboxes with warmup evidence, by health state and the risk band it maps to."}, []string{"state", "band"}),
		ticked: prometheus.NewCounter(prometheus.CounterOpts{Name: "mailplane_health_ticked_total",
			Help: "Rows re-evaluated by the ticker (penalty ended or evidence aged out)."}),
	}
	if reg != nil {
		m.observations = promreg.MustRegister(reg, m.observations)
		m.scored = promreg.MustRegister(reg, m.scored)
		m.states = promreg.MustRegister(reg, m.states)
		m.ticked = promreg.MustRegister(reg, m.ticked)
	}
	return m
}

// Committed counts events after their transaction committed: observations
// the scorer applied and health_scored events emitted. It fits
// projections.WithCommitted.
func (m *Metrics) Committed(events []domain.Event) {
	for _, e := range events {
		switch d := e.Data.(type) {
		case *domain.WarmupObserved:
			m.observations.WithLabelValues(string(d.Placement)).Inc()
		case *domain.MailboxHealthScored:
			m.scored.WithLabelValues(string(d.State)).Inc()
		}
	}
}

func (m *Metrics) refreshStates(ctx context.Context, pool *pgxpool.Pool) error {
	rows, err := pool.Query(ctx, `SELECT state, count(*) FROM mailbox_health GROUP BY state`)
	if err != nil {
		return err
	}
	counts := map[domain.HealthState]float64{}
	var (
		s string
		n int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&s, &n}, func() error {
		counts[domain.HealthState(s)] = float64(n)
		return nil
	}); err != nil {
		return err
	}
	for _, st := range []domain.HealthState{domain.HealthHealthy, domain.HealthWatch, domain.HealthThrottled, domain.HealthQuarantined, domain.HealthBlocked} {
		m.states.WithLabelValues(string(st), string(placement.BandFromHealth(st))).Set(counts[st])
	}
	return nil
}
