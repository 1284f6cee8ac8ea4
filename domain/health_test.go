package domain_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

const hmb = "0190a5b2-4c5e-7b1a-9c3d-0000000000b1"

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

const day = 24 * time.Hour

func obs(junk bool, at time.Time, i int) *domain.WarmupObserved {
	p := domain.PlacedInbox
	if junk {
		p = domain.PlacedJunk
	}
	return &domain.WarmupObserved{MailboxID: hmb, WarmupID: fmt.Sprintf("w%d", i), Placement: p, LandedAt: at, Source: domain.ObservedBySync}
}

// feed observes n messages at now, junk of them in Junk spread evenly, and
// returns the record and every event.
func feed(p domain.HealthPolicy, r domain.HealthRecord, n, junk int, now time.Time) (domain.HealthRecord, []*domain.MailboxHealthScored) {
	var evs []*domain.MailboxHealthScored
	for i := range n {
		var ev *domain.MailboxHealthScored
		isJunk := (i+1)*junk/n > i*junk/n
		r, ev = p.Observe(r, obs(isJunk, now, i), now)
		if ev != nil {
			evs = append(evs, ev)
		}
	}
	return r, evs
}

func TestHealthThresholds(t *testing.T) {
	t.Parallel()
	p := domain.DefaultHealthPolicy()
	cases := []struct {
		n, junk int
		want    domain.HealthState
		until   time.Duration
	}{
		{19, 19, domain.HealthHealthy, 0}, // too little evidence
		{20, 0, domain.HealthHealthy, 0},
		{20, 1, domain.HealthHealthy, 0},
		{20, 2, domain.HealthWatch, 0}, // exactly 10%
		{1000, 99, domain.HealthHealthy, 0},
		{1000, 100, domain.HealthWatch, 0},
		{1000, 149, domain.HealthWatch, 0},
		{1000, 150, domain.HealthThrottled, 3 * day},
		{1000, 199, domain.HealthThrottled, 3 * day},
		{1000, 200, domain.HealthQuarantined, 7 * day},
		{1000, 399, domain.HealthQuarantined, 7 * day},
		{1000, 400, domain.HealthBlocked, 30 * day},
		{1000, 799, domain.HealthBlocked, 30 * day},
		{1000, 800, domain.HealthBlocked, 90 * day},
		{20, 20, domain.HealthBlocked, 90 * day},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%d_of_%d", c.junk, c.n), func(t *testing.T) {
			t.Parallel()
			// Inbox placements first, junk last, so the final rate
			// decides with no earlier penalty in the way.
			r := domain.HealthRecord{MailboxID: hmb}
			var evs []*domain.MailboxHealthScored
			for i := range c.n {
				var ev *domain.MailboxHealthScored
				r, ev = p.Observe(r, obs(i >= c.n-c.junk, t0, i), t0)
				if ev != nil {
					evs = append(evs, ev)
				}
			}
			if r.CurrentState() != c.want {
				t.Fatalf("state %s, want %s", r.CurrentState(), c.want)
			}
			if got := r.Until.Sub(t0); c.until > 0 && got != c.until || c.until == 0 && !r.Until.IsZero() {
				t.Fatalf("until %v after, want %v", got, c.until)
			}
			if c.want == domain.HealthHealthy {
				if len(evs) != 0 {
					t.Fatalf("healthy all along, yet %d events", len(evs))
				}
				return
			}
			if len(evs) == 0 {
				t.Fatal("no event")
			}
			last := evs[len(evs)-1]
			if last.State != c.want || (c.until > 0) != (last.Until != nil) {
				t.Fatalf("last event %+v", last)
			}
			if last.Validate() != nil {
				t.Fatalf("invalid event: %v", last.Validate())
			}
			wantScore := float64(c.n-c.junk) * 100 / float64(c.n)
			if d := r.Score - wantScore; d > 0.01 || d < -0.01 {
				t.Fatalf("score %.2f, want %.2f", r.Score, wantScore)
			}
		})
	}
}

func TestHealthProbationAfterBlock(t *testing.T) {
	t.Parallel()
	p := domain.DefaultHealthPolicy()
	r, evs := feed(p, domain.HealthRecord{MailboxID: hmb}, 20, 10, t0) // 50%: blocked 30 days
	if r.State != domain.HealthBlocked || r.Until != t0.Add(30*day) || len(evs) == 0 {
		t.Fatalf("not blocked for 30 days: %+v", r)
	}
	// Good evidence during the block changes nothing.
	r, evs = feed(p, r, 100, 0, t0.Add(10*day))
	if r.State != domain.HealthBlocked || len(evs) != 0 {
		t.Fatalf("block did not hold: %s, %d events", r.State, len(evs))
	}
	// Just before its end: still blocked.
	r, ev := p.Evaluate(r, t0.Add(30*day-time.Second))
	if ev != nil || r.State != domain.HealthBlocked {
		t.Fatalf("ended early: %+v", ev)
	}
	// At its end: throttled probation, whatever the (aged-out) evidence.
	r, ev = p.Evaluate(r, t0.Add(30*day))
	if ev == nil || ev.State != domain.HealthThrottled || !r.Probation || ev.Until == nil || !ev.Until.Equal(t0.Add(33*day)) {
		t.Fatalf("no probation: %+v, record %+v", ev, r)
	}
	// Clean evidence during probation: still throttled.
	r, evs = feed(p, r, 30, 0, t0.Add(31*day))
	if r.State != domain.HealthThrottled || len(evs) != 0 {
		t.Fatalf("probation cut short: %s", r.State)
	}
	// Probation served with clean evidence: healthy.
	r, ev = p.Evaluate(r, t0.Add(33*day))
	if ev == nil || ev.State != domain.HealthHealthy || ev.Until != nil || r.Probation || !r.Until.IsZero() {
		t.Fatalf("not healthy after probation: %+v", ev)
	}
}

func TestHealthProbationWithoutEvidenceEndsHealthy(t *testing.T) {
	t.Parallel()
	p := domain.DefaultHealthPolicy()
	r, _ := feed(p, domain.HealthRecord{MailboxID: hmb}, 20, 20, t0) // blocked 90 days
	r, ev := p.Evaluate(r, t0.Add(90*day))
	if ev == nil || ev.State != domain.HealthThrottled {
		t.Fatalf("want probation, got %+v", ev)
	}
	r, ev = p.Evaluate(r, t0.Add(93*day))
	if ev == nil || ev.State != domain.HealthHealthy {
		t.Fatalf("want healthy, got %+v (%+v)", ev, r)
	}
}

func TestHealthBlockEndsIntoWorseEvidence(t *testing.T) {
	t.Parallel()
	p := domain.DefaultHealthPolicy()
	r, _ := feed(p, domain.HealthRecord{MailboxID: hmb}, 20, 10, t0) // blocked 30 days
	// Fresh bad evidence just before the end: blocked again at the end
	// (same state, same length: no event), not probation.
	r, _ = feed(p, r, 20, 10, t0.Add(29*day))
	r, ev := p.Evaluate(r, t0.Add(30*day))
	if ev != nil || r.State != domain.HealthBlocked || r.Probation || r.Until != t0.Add(60*day) {
		t.Fatalf("want blocked again until day 60, got %+v event %+v", r, ev)
	}
	// Quarantine-level evidence at a block's end: quarantined, not
	// probation.
	r2, _ := feed(p, domain.HealthRecord{MailboxID: hmb}, 20, 10, t0)
	r2, _ = feed(p, r2, 20, 5, t0.Add(29*day)) // 25%
	r2, ev = p.Evaluate(r2, t0.Add(30*day))
	if ev == nil || ev.State != domain.HealthQuarantined || r2.Probation {
		t.Fatalf("want quarantined, got %+v", ev)
	}
}

func TestHealthPenaltyHoldsThenFollowsEvidence(t *testing.T) {
	t.Parallel()
	p := domain.DefaultHealthPolicy()
	r, _ := feed(p, domain.HealthRecord{MailboxID: hmb}, 100, 25, t0) // quarantined 7 days
	if r.State != domain.HealthQuarantined {
		t.Fatalf("state %s", r.State)
	}
	r, evs := feed(p, r, 400, 0, t0.Add(2*day)) // 5%
	if r.State != domain.HealthQuarantined || len(evs) != 0 {
		t.Fatalf("penalty did not hold: %s", r.State)
	}
	// No probation after a quarantine: at its end the evidence rules.
	r, ev := p.Evaluate(r, t0.Add(7*day))
	if ev == nil || ev.State != domain.HealthHealthy {
		t.Fatalf("want healthy, got %+v", ev)
	}
}

func TestHealthEscalationDuringPenalty(t *testing.T) {
	t.Parallel()
	p := domain.DefaultHealthPolicy()
	r, _ := feed(p, domain.HealthRecord{MailboxID: hmb}, 100, 15, t0) // throttled
	if r.State != domain.HealthThrottled {
		t.Fatalf("state %s", r.State)
	}
	r, evs := feed(p, r, 30, 30, t0.Add(time.Hour)) // 45 of 130 = 34.6%: quarantined
	if r.State != domain.HealthQuarantined || len(evs) != 1 || !evs[0].Until.Equal(t0.Add(time.Hour+7*day)) {
		t.Fatalf("no escalation to quarantined: %s %v", r.State, evs)
	}
	// Blocked 30 days, then 90: the longer block is an event too.
	r, evs = feed(p, r, 40, 40, t0.Add(2*time.Hour)) // 85/170 = 50%
	if r.State != domain.HealthBlocked || r.PenaltyFor != 30*day || len(evs) != 1 {
		t.Fatalf("want blocked 30 days: %+v, %d events", r, len(evs))
	}
	r, evs = feed(p, r, 400, 400, t0.Add(3*time.Hour)) // 485/570 = 85%
	if r.PenaltyFor != 90*day || len(evs) != 1 || !evs[0].Until.Equal(t0.Add(3*time.Hour+90*day)) {
		t.Fatalf("want blocked 90 days with an event: %+v, %v", r, evs)
	}
}

func TestHealthWindow(t *testing.T) {
	t.Parallel()
	p := domain.DefaultHealthPolicy()
	// 10 junk landed 8 days ago: outside the window, never counted.
	r := domain.HealthRecord{MailboxID: hmb}
	for i := range 10 {
		r, _ = p.Observe(r, obs(true, t0.Add(-8*day), i), t0)
	}
	if in, junk := r.Counts(); in+junk != 0 {
		t.Fatalf("old evidence counted: %d", in+junk)
	}
	// 3 junk of 20 at t0: throttled... evidence leaves the window a week
	// later and the record forgets it.
	r, _ = feed(p, r, 20, 2, t0)
	if r.State != domain.HealthWatch {
		t.Fatalf("state %s", r.State)
	}
	next := p.NextCheck(r)
	if next.Before(t0.Add(7*day)) || next.After(t0.Add(7*day+time.Hour)) {
		t.Fatalf("next check %v", next)
	}
	r, ev := p.Evaluate(r, next)
	if in, junk := r.Counts(); in+junk != 0 || ev != nil || r.State != domain.HealthWatch {
		t.Fatalf("after the window: %d observations, event %+v, state %s (too little evidence keeps watch)", in+junk, ev, r.State)
	}
	// A message landing in the future counts now.
	r, _ = p.Observe(r, obs(false, next.Add(day), 99), next)
	if in, _ := r.Counts(); in != 1 || r.Buckets[0].Hour != next.Unix()/3600 {
		t.Fatalf("future landing: %+v", r.Buckets)
	}
	// The clock does not go back.
	r2, _ := p.Evaluate(r, t0)
	if !r2.LastEval.Equal(r.LastEval) {
		t.Fatalf("clock went back to %v", r2.LastEval)
	}
}

// Property: over random evidence and clocks, the record stays consistent
// and events are emitted exactly on state changes or longer blocks.
func TestHealthProperties(t *testing.T) {
	t.Parallel()
	p := domain.DefaultHealthPolicy()
	rng := rand.New(rand.NewPCG(7, 11))
	for run := range 200 {
		r := domain.HealthRecord{MailboxID: hmb}
		now := t0
		spam := rng.Float64()
		for step := range 400 {
			now = now.Add(time.Duration(rng.IntN(int(12 * time.Hour))))
			prev := r
			var ev *domain.MailboxHealthScored
			if rng.IntN(5) == 0 {
				r, ev = p.Evaluate(r, now)
			} else {
				landed := now.Add(-time.Duration(rng.IntN(int(9 * day))))
				r, ev = p.Observe(r, obs(rng.Float64() < spam, landed, step), now)
			}
			where := fmt.Sprintf("run %d step %d", run, step)
			s := r.CurrentState()
			penalty := s == domain.HealthThrottled || s == domain.HealthQuarantined || s == domain.HealthBlocked
			if penalty == r.Until.IsZero() {
				t.Fatalf("%s: state %s with until %v", where, s, r.Until)
			}
			if r.Probation && s != domain.HealthThrottled {
				t.Fatalf("%s: probation in %s", where, s)
			}
			changed := s != prev.CurrentState() || s == domain.HealthBlocked && prev.CurrentState() == domain.HealthBlocked && r.PenaltyFor > prev.PenaltyFor
			if changed != (ev != nil) {
				t.Fatalf("%s: %s→%s, event %+v", where, prev.CurrentState(), s, ev)
			}
			if ev != nil {
				if ps := ev.Validate(); len(ps) != 0 {
					t.Fatalf("%s: invalid event %v", where, ps)
				}
				// Healthy again straight from a block: never.
				if s == domain.HealthHealthy && prev.CurrentState() == domain.HealthBlocked {
					t.Fatalf("%s: blocked → healthy without probation", where)
				}
				checkEvidence(t, where, p, r, ev)
			}
			// A running penalty is never shortened or softened.
			if !prev.Until.IsZero() && r.LastEval.Before(prev.Until) {
				if r.Until.Before(prev.Until) && !(severityOf(s) > severityOf(prev.CurrentState())) || severityOf(s) < severityOf(prev.CurrentState()) {
					t.Fatalf("%s: penalty %s until %v softened to %s until %v", where, prev.CurrentState(), prev.Until, s, r.Until)
				}
			}
			for i := 1; i < len(r.Buckets); i++ {
				if r.Buckets[i].Hour <= r.Buckets[i-1].Hour {
					t.Fatalf("%s: buckets out of order", where)
				}
			}
		}
	}
}

func severityOf(s domain.HealthState) int {
	return map[domain.HealthState]int{domain.HealthHealthy: 1, domain.HealthWatch: 2, domain.HealthThrottled: 3, domain.HealthQuarantined: 4, domain.HealthBlocked: 5}[s]
}

func TestHealthPolicyValidate(t *testing.T) {
	t.Parallel()
	if err := domain.DefaultHealthPolicy().Validate(); err != nil {
		t.Fatal(err)
	}
	bad := domain.DefaultHealthPolicy()
	bad.Levels[1].MinRate = 0.9 // not descending
	if bad.Validate() == nil {
		t.Fatal("levels out of order accepted")
	}
}
