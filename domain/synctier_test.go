package domain_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

func TestEvaluateSyncTiers(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	p := domain.SyncTierPolicy{SessionGrace: 15 * time.Minute, HotActivity: 2 * time.Hour, ColdAfter: 7 * 24 * time.Hour,
		UnknownGrace: 10 * time.Minute}
	old := now.Add(-30 * 24 * time.Hour)
	tracked := now.Add(-time.Hour)
	cases := []struct {
		name string
		in   domain.SyncTierInput
		want domain.SyncTierDecision
	}{
		{"session", domain.SyncTierInput{Current: domain.SyncTierCold, SessionAt: now.Add(-time.Minute), MailKnown: true, TrackedSince: tracked, AddedAt: old},
			domain.SyncTierDecision{domain.SyncTierHot, domain.SyncReasonSession}},
		{"session ended", domain.SyncTierInput{Current: domain.SyncTierHot, SessionAt: now.Add(-16 * time.Minute), MailKnown: true, NewestMail: now.Add(-5 * time.Hour), TrackedSince: tracked, AddedAt: old},
			domain.SyncTierDecision{domain.SyncTierWarm, domain.SyncReasonDefault}},
		{"recent mail", domain.SyncTierInput{Current: domain.SyncTierWarm, MailKnown: true, NewestMail: now.Add(-time.Hour), TrackedSince: tracked, AddedAt: old},
			domain.SyncTierDecision{domain.SyncTierHot, domain.SyncReasonRecentMail}},
		{"unknown mail keeps an inherited tier", domain.SyncTierInput{Current: domain.SyncTierHot, TrackedSince: now.Add(-time.Minute), AddedAt: old},
			domain.SyncTierDecision{domain.SyncTierHot, domain.SyncReasonUnknown}},
		{"unknown mail for too long", domain.SyncTierInput{Current: domain.SyncTierHot, TrackedSince: tracked, AddedAt: old},
			domain.SyncTierDecision{domain.SyncTierCold, domain.SyncReasonInactive}},
		{"new mailbox without mail is warm, not cold", domain.SyncTierInput{Current: domain.SyncTierWarm, MailKnown: true, TrackedSince: tracked, AddedAt: now.Add(-24 * time.Hour)},
			domain.SyncTierDecision{domain.SyncTierWarm, domain.SyncReasonDefault}},
		{"old mail", domain.SyncTierInput{Current: domain.SyncTierWarm, MailKnown: true, NewestMail: now.Add(-8 * 24 * time.Hour), TrackedSince: tracked, AddedAt: old},
			domain.SyncTierDecision{domain.SyncTierCold, domain.SyncReasonInactive}},
		{"an old session still counts as activity", domain.SyncTierInput{Current: domain.SyncTierCold, SessionAt: now.Add(-2 * 24 * time.Hour), MailKnown: true, TrackedSince: tracked, AddedAt: old},
			domain.SyncTierDecision{domain.SyncTierWarm, domain.SyncReasonDefault}},
	}
	for _, c := range cases {
		got := domain.EvaluateSyncTiers(now, p, []domain.SyncTierInput{c.in})[0]
		if got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestHotBudget checks that the budget demotes the least recently active
// hot mailboxes without a session, and never one in session.
func TestHotBudget(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	p := domain.SyncTierPolicy{SessionGrace: 15 * time.Minute, HotActivity: 2 * time.Hour, ColdAfter: 7 * 24 * time.Hour,
		UnknownGrace: 10 * time.Minute, HotBudget: 3}
	tracked := now.Add(-time.Hour)
	mail := func(ago time.Duration) domain.SyncTierInput {
		return domain.SyncTierInput{Current: domain.SyncTierHot, MailKnown: true, NewestMail: now.Add(-ago), TrackedSince: tracked, AddedAt: tracked}
	}
	session := domain.SyncTierInput{Current: domain.SyncTierHot, SessionAt: now.Add(-time.Minute), MailKnown: true, NewestMail: now.Add(-100 * time.Minute), TrackedSince: tracked, AddedAt: tracked}
	in := []domain.SyncTierInput{
		mail(10 * time.Minute), // 0: most recent
		mail(90 * time.Minute), // 1: least recent: demoted
		session,                // 2: session, oldest mail of all, never demoted
		mail(30 * time.Minute), // 3: demoted
		mail(60 * time.Minute), // 4: demoted
		session,                // 5
	}
	got := domain.EvaluateSyncTiers(now, p, in)
	want := []domain.SyncTierDecision{
		{domain.SyncTierHot, domain.SyncReasonRecentMail}, {domain.SyncTierWarm, domain.SyncReasonHotBudget}, {domain.SyncTierHot, domain.SyncReasonSession},
		{domain.SyncTierWarm, domain.SyncReasonHotBudget}, {domain.SyncTierWarm, domain.SyncReasonHotBudget}, {domain.SyncTierHot, domain.SyncReasonSession},
	}
	// Six hot (four by mail, two in session) against a budget of three:
	// the three least recently active mail-hot ones go (90m, 60m, 30m).
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("mailbox %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	// Sessions alone over the budget: nothing to demote, all stay hot.
	got = domain.EvaluateSyncTiers(now, domain.SyncTierPolicy{SessionGrace: time.Hour, HotBudget: 1}, []domain.SyncTierInput{session, session})
	if got[0].Tier != domain.SyncTierHot || got[1].Tier != domain.SyncTierHot {
		t.Errorf("sessions demoted: %+v", got)
	}
	// No budget.
	got = domain.EvaluateSyncTiers(now, domain.SyncTierPolicy{HotActivity: time.Hour, HotBudget: 0}, []domain.SyncTierInput{mail(time.Minute), mail(2 * time.Minute)})
	if got[0].Tier != domain.SyncTierHot || got[1].Tier != domain.SyncTierHot {
		t.Errorf("no budget: %+v", got)
	}
}

// Property: over random fleets, in-session mailboxes are always hot, the
// budget holds unless sessions alone exceed it, and every demoted mailbox
// was no more recently active than any session-less mailbox kept hot.
func TestEvaluateSyncTiersProperties(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 5))
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	ago := func(max time.Duration) time.Time { return now.Add(-time.Duration(rng.Int64N(int64(max)))) }
	for run := range 300 {
		p := domain.SyncTierPolicy{SessionGrace: 15 * time.Minute, HotActivity: 2 * time.Hour, ColdAfter: 7 * 24 * time.Hour,
			UnknownGrace: 10 * time.Minute, HotBudget: rng.IntN(20)}
		in := make([]domain.SyncTierInput, 1+rng.IntN(60))
		for i := range in {
			x := domain.SyncTierInput{Current: []domain.SyncTier{domain.SyncTierHot, domain.SyncTierWarm, domain.SyncTierCold}[rng.IntN(3)],
				TrackedSince: ago(time.Hour), AddedAt: ago(30 * 24 * time.Hour), MailKnown: rng.IntN(4) != 0}
			if rng.IntN(3) == 0 {
				x.SessionAt = ago(time.Hour)
			}
			if x.MailKnown && rng.IntN(5) != 0 {
				x.NewestMail = ago(10 * 24 * time.Hour)
			}
			in[i] = x
		}
		out := domain.EvaluateSyncTiers(now, p, in)
		again := domain.EvaluateSyncTiers(now, p, in)
		hot, sessions := 0, 0
		keptAct, demotedAct := time.Time{}, time.Time{}
		for i, d := range out {
			if d != again[i] {
				t.Fatalf("run %d: not deterministic", run)
			}
			if !d.Tier.Valid() {
				t.Fatalf("run %d: tier %q", run, d.Tier)
			}
			session := !in[i].SessionAt.IsZero() && now.Sub(in[i].SessionAt) <= p.SessionGrace
			if session {
				sessions++
				if d.Tier != domain.SyncTierHot {
					t.Fatalf("run %d: mailbox %d in session is %s", run, i, d.Tier)
				}
			}
			act := time.Time{}
			if in[i].MailKnown {
				act = in[i].NewestMail
			}
			if d.Tier == domain.SyncTierHot {
				hot++
				if !session && (keptAct.IsZero() || act.Before(keptAct)) {
					keptAct = act
				}
			}
			if d.Reason == domain.SyncReasonHotBudget && act.After(demotedAct) {
				demotedAct = act
			}
		}
		if p.HotBudget > 0 && hot > max(p.HotBudget, sessions) {
			t.Fatalf("run %d: %d hot over a budget of %d with %d sessions", run, hot, p.HotBudget, sessions)
		}
		if !demotedAct.IsZero() && !keptAct.IsZero() && demotedAct.After(keptAct) {
			t.Fatalf("run %d: demoted a mailbox active at %v while keeping one active at %v", run, demotedAct, keptAct)
		}
	}
}
