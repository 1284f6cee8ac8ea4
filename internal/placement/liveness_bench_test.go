package placement

import (
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// BenchmarkDecisionLogPerDay counts the decision records a steady fleet of
// 10,000 sending workers adds to the log in a day: every worker heartbeats
// every 10 s (the default interval), the engine ticks every 2 s, nothing
// else happens. The workers register, then the fleet runs from 23 h to 25 h
// of age (7.2 M heartbeats), across one day boundary of the age ramp,
// where a worker's capacity may change: a transition, recorded once a day.
// records/day = the ramp records + 12 × the other records of the two hours.
// The same inputs run on the code before liveness by transitions gave the
// figure it is compared with in BENCHMARKS.md.
//
//	go test ./internal/placement/ -run '^$' -bench DecisionLogPerDay -benchtime 1x
func BenchmarkDecisionLogPerDay(b *testing.B) {
	const (
		workers   = 10_000
		heartbeat = 10 * time.Second
		tick      = 2 * time.Second
		from, to  = 23 * time.Hour, 25 * time.Hour
	)
	hbs := make([]*domain.WorkerHeartbeat, workers)
	for i := range hbs {
		egress := []domain.Egress{domain.EgressOAuthAPI, domain.EgressColdSMTP, domain.EgressWarmupOnly}[i%3]
		hbs[i] = &domain.WorkerHeartbeat{WorkerID: plWorker(i), Tier: domain.TierSharedPremium, Egress: egress, Address: "10.0.0.1:25"}
	}
	for range b.N {
		s := NewState(Config{HeartbeatInterval: heartbeat})
		for i, hb := range hbs {
			s.Apply(Input{At: plT0.Add(time.Duration(i) * time.Microsecond), Event: hb})
		}
		ramps, other := 0, 0
		// Heartbeats spread evenly over each interval; the first tick
		// comes once every worker was heard again (an engine ticks only
		// when it has caught up with its inputs).
		step := heartbeat / workers
		nextTick := plT0.Add(from + heartbeat)
		for at, i := plT0.Add(from), 0; at.Before(plT0.Add(to)); at, i = at.Add(step), (i+1)%workers {
			ds := s.Apply(Input{At: at, Event: hbs[i]})
			if !at.Before(nextTick) {
				ds = append(ds, s.Apply(Tick(at))...)
				nextTick = nextTick.Add(tick)
			}
			for _, d := range ds {
				if d.Meta().Reason == domain.ReasonCapacityRamp {
					ramps++
				} else {
					other++
				}
			}
		}
		b.ReportMetric(float64(ramps), "ramp-records/day")
		b.ReportMetric(float64(other*int(24*time.Hour/(to-from))), "other-records/day")
		b.ReportMetric(float64(ramps+other*int(24*time.Hour/(to-from))), "records/day")
	}
}
