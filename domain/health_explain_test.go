package domain_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// checkEvidence holds an event's evidence to the record the scorer left:
// the same window, counts and penalty, and a rule that matches the state.
func checkEvidence(t *testing.T, where string, p domain.HealthPolicy, r domain.HealthRecord, ev *domain.MailboxHealthScored) {
	t.Helper()
	e := ev.Evidence
	if e == nil {
		t.Fatalf("%s: event without evidence: %+v", where, ev)
	}
	inbox, junk := r.Counts()
	if e.WindowEnd == nil || !e.WindowEnd.Equal(r.LastEval) || e.WindowSeconds != int64(p.Window/time.Second) ||
		e.Inbox != int64(inbox) || e.Junk != int64(junk) || e.MinObservations != int64(p.MinObservations) ||
		e.PenaltySeconds != int64(r.PenaltyFor/time.Second) {
		t.Fatalf("%s: evidence %+v does not match the record %+v", where, e, r)
	}
	if n := inbox + junk; n > 0 && e.Rate != float64(junk)/float64(n) || n == 0 && e.Rate != 0 {
		t.Fatalf("%s: rate %v for %d of %d", where, e.Rate, junk, n)
	}
	switch e.Rule {
	case domain.HealthRuleLevel:
		if e.Threshold == nil || e.Threshold.State != ev.State || e.Rate < e.Threshold.Rate || e.Total() < e.MinObservations {
			t.Fatalf("%s: level evidence %+v for %s", where, e, ev.State)
		}
	case domain.HealthRuleBelowLevels:
		if ev.State != domain.HealthHealthy || e.Threshold == nil || e.Rate >= e.Threshold.Rate || e.Total() < e.MinObservations {
			t.Fatalf("%s: below-levels evidence %+v for %s", where, e, ev.State)
		}
	case domain.HealthRuleTooFew:
		if ev.State != domain.HealthHealthy || e.Threshold != nil || e.Total() >= e.MinObservations {
			t.Fatalf("%s: too-few evidence %+v for %s", where, e, ev.State)
		}
	case domain.HealthRuleProbation:
		if ev.State != domain.HealthThrottled || !r.Probation || e.Threshold != nil {
			t.Fatalf("%s: probation evidence %+v for %s", where, e, ev.State)
		}
	default:
		t.Fatalf("%s: rule %q", where, e.Rule)
	}
	if s := domain.ExplainHealth(ev.State, ev.Until, e); s == "" || strings.Contains(s, hmb) {
		t.Fatalf("%s: sentence %q", where, s)
	}
}

func TestHealthEvidenceOfEachRule(t *testing.T) {
	t.Parallel()
	p := domain.DefaultHealthPolicy()
	// 5 of 20 (25 %): quarantined for 7 days at the 20 % level.
	r, evs := feed(p, domain.HealthRecord{MailboxID: hmb}, 20, 5, t0)
	last := evs[len(evs)-1]
	if last.State != domain.HealthQuarantined || last.Evidence.Rule != domain.HealthRuleLevel ||
		*last.Evidence.Threshold != (domain.HealthThreshold{Rate: 0.20, State: domain.HealthQuarantined}) ||
		last.Evidence.PenaltySeconds != int64(7*day/time.Second) {
		t.Fatalf("quarantine evidence %+v", last.Evidence)
	}
	checkEvidence(t, "quarantine", p, r, last)
	// The quarantine ends with too little evidence: healthy, too few.
	r, ev := p.Evaluate(r, t0.Add(8*day))
	if ev == nil || ev.Evidence.Rule != domain.HealthRuleTooFew {
		t.Fatalf("too few: %+v", ev)
	}
	checkEvidence(t, "too few", p, r, ev)
	// A block, then its probation.
	r, _ = feed(p, domain.HealthRecord{MailboxID: hmb}, 20, 20, t0)
	r, ev = p.Evaluate(r, t0.Add(90*day))
	if ev == nil || ev.Evidence.Rule != domain.HealthRuleProbation || ev.Evidence.PenaltySeconds != int64(3*day/time.Second) {
		t.Fatalf("probation: %+v", ev)
	}
	checkEvidence(t, "probation", p, r, ev)
	// Watch, then healthy below the watch level.
	r, evs = feed(p, domain.HealthRecord{MailboxID: hmb}, 20, 2, t0)
	checkEvidence(t, "watch", p, r, evs[len(evs)-1])
	r, evs = feed(p, r, 1, 0, t0.Add(time.Hour)) // 2 of 21: below 10 %
	if len(evs) != 1 || evs[0].Evidence.Rule != domain.HealthRuleBelowLevels ||
		*evs[0].Evidence.Threshold != (domain.HealthThreshold{Rate: 0.10, State: domain.HealthWatch}) {
		t.Fatalf("below levels: %+v", evs)
	}
	checkEvidence(t, "healthy", p, r, evs[0])
}

func TestExplainHealth(t *testing.T) {
	t.Parallel()
	until := time.Date(2026, 12, 12, 9, 30, 0, 0, time.UTC)
	end := until.Add(-7 * day)
	ev := func(inbox, junk int64, rule domain.HealthRule, th *domain.HealthThreshold, penalty time.Duration) *domain.HealthEvidence {
		rate := 0.0
		if inbox+junk > 0 {
			rate = float64(junk) / float64(inbox+junk)
		}
		return &domain.HealthEvidence{WindowSeconds: int64(7 * day / time.Second), WindowEnd: &end, Inbox: inbox, Junk: junk,
			MinObservations: 20, Rate: rate, Rule: rule, Threshold: th, PenaltySeconds: int64(penalty / time.Second)}
	}
	cases := []struct {
		name  string
		state domain.HealthState
		until *time.Time
		e     *domain.HealthEvidence
		want  string
	}{
		{"quarantined", domain.HealthQuarantined, &until,
			ev(73, 23, domain.HealthRuleLevel, &domain.HealthThreshold{Rate: 0.2, State: domain.HealthQuarantined}, 7*day),
			"quarantined until 12 Dec 2026 09:30 UTC: 23 of 96 warmup messages (24 %) landed in spam over the last 7 days; the quarantine level is 20 %"},
		{"blocked", domain.HealthBlocked, &until,
			ev(10, 30, domain.HealthRuleLevel, &domain.HealthThreshold{Rate: 0.4, State: domain.HealthBlocked}, 30*day),
			"blocked until 12 Dec 2026 09:30 UTC: 30 of 40 warmup messages (75 %) landed in spam over the last 7 days; the block level is 40 %"},
		{"throttled", domain.HealthThrottled, &until,
			ev(82, 18, domain.HealthRuleLevel, &domain.HealthThreshold{Rate: 0.15, State: domain.HealthThrottled}, 3*day),
			"throttled until 12 Dec 2026 09:30 UTC: 18 of 100 warmup messages (18 %) landed in spam over the last 7 days; the throttle level is 15 %"},
		{"watch", domain.HealthWatch, nil,
			ev(18, 2, domain.HealthRuleLevel, &domain.HealthThreshold{Rate: 0.1, State: domain.HealthWatch}, 0),
			"on watch: 2 of 20 warmup messages (10 %) landed in spam over the last 7 days; the watch level is 10 %"},
		{"healthy", domain.HealthHealthy, nil,
			ev(97, 3, domain.HealthRuleBelowLevels, &domain.HealthThreshold{Rate: 0.1, State: domain.HealthWatch}, 0),
			"healthy: 3 of 100 warmup messages (3 %) landed in spam over the last 7 days, below the watch level of 10 %"},
		{"healthy just below a level", domain.HealthHealthy, nil,
			ev(804, 196, domain.HealthRuleBelowLevels, &domain.HealthThreshold{Rate: 0.2, State: domain.HealthQuarantined}, 0),
			"healthy: 196 of 1000 warmup messages (19.6 %) landed in spam over the last 7 days, below the quarantine level of 20 %"},
		{"too few observations", domain.HealthHealthy, nil,
			ev(11, 1, domain.HealthRuleTooFew, nil, 0),
			"healthy: too few observations to judge: 12 of the 20 warmup messages needed over the last 7 days"},
		{"probation", domain.HealthThrottled, &until,
			ev(40, 0, domain.HealthRuleProbation, nil, 3*day),
			"throttled until 12 Dec 2026 09:30 UTC: on probation after a block ended; meanwhile 0 of 40 warmup messages (0 %) landed in spam over the last 7 days"},
		{"no evidence", domain.HealthQuarantined, &until, nil, "quarantined until 12 Dec 2026 09:30 UTC"},
		{"no state", "", nil, nil, "healthy"},
	}
	for _, c := range cases {
		if got := domain.ExplainHealth(c.state, c.until, c.e); got != c.want {
			t.Errorf("%s:\n got  %q\n want %q", c.name, got, c.want)
		}
	}
}

func TestHealthEvidenceValidate(t *testing.T) {
	t.Parallel()
	end := t0
	good := func() *domain.HealthEvidence {
		return &domain.HealthEvidence{WindowSeconds: 7 * 86400, WindowEnd: &end, Inbox: 73, Junk: 23, MinObservations: 20,
			Rate: 23.0 / 96, Rule: domain.HealthRuleLevel, Threshold: &domain.HealthThreshold{Rate: 0.2, State: domain.HealthQuarantined},
			PenaltySeconds: 7 * 86400}
	}
	if ps := good().Validate(); len(ps) != 0 {
		t.Fatalf("good evidence refused: %v", ps)
	}
	cases := []struct {
		field string
		edit  func(e *domain.HealthEvidence)
	}{
		{"window_seconds", func(e *domain.HealthEvidence) { e.WindowSeconds = 0 }},
		{"window_seconds", func(e *domain.HealthEvidence) { e.WindowSeconds = domain.MaxHealthWindowSeconds + 1 }},
		{"window_end", func(e *domain.HealthEvidence) { e.WindowEnd = nil }},
		{"inbox", func(e *domain.HealthEvidence) { e.Inbox = -1 }},
		{"junk", func(e *domain.HealthEvidence) { e.Junk = domain.MaxCount + 1 }},
		{"min_observations", func(e *domain.HealthEvidence) { e.MinObservations = 0 }},
		{"rate", func(e *domain.HealthEvidence) { e.Rate = math.NaN() }},
		{"rate", func(e *domain.HealthEvidence) { e.Rate = 1.01 }},
		{"rate", func(e *domain.HealthEvidence) { e.Rate = -0.1 }},
		{"rule", func(e *domain.HealthEvidence) { e.Rule = "" }},
		{"rule", func(e *domain.HealthEvidence) { e.Rule = "level\n" }},
		{"threshold.rate", func(e *domain.HealthEvidence) { e.Threshold.Rate = 0 }},
		{"threshold.rate", func(e *domain.HealthEvidence) { e.Threshold.Rate = math.Inf(1) }},
		{"threshold.state", func(e *domain.HealthEvidence) { e.Threshold.State = "sick" }},
		{"penalty_seconds", func(e *domain.HealthEvidence) { e.PenaltySeconds = -1 }},
	}
	for _, c := range cases {
		e := good()
		c.edit(e)
		ev := &domain.MailboxHealthScored{MailboxID: hmb, State: domain.HealthQuarantined, Score: 76, Reason: "r", Evidence: e}
		ps := ev.Validate()
		if len(ps) != 1 || ps[0].Field != "evidence."+c.field {
			t.Errorf("%s: problems %v", c.field, ps)
		}
	}
}
