package mailsync

import (
	"context"
	"testing"
	"time"
)

func TestEvaluateTiers(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	p := TierPolicy{SessionGrace: 15 * time.Minute, HotActivity: 2 * time.Hour, ColdAfter: 7 * 24 * time.Hour,
		UnknownGrace: 10 * time.Minute}
	old := now.Add(-30 * 24 * time.Hour)
	tracked := now.Add(-time.Hour)
	cases := []struct {
		name string
		in   TierInput
		want TierDecision
	}{
		{"session", TierInput{Current: TierCold, SessionAt: now.Add(-time.Minute), MailKnown: true, TrackedSince: tracked, AddedAt: old},
			TierDecision{TierHot, ReasonSession}},
		{"session ended", TierInput{Current: TierHot, SessionAt: now.Add(-16 * time.Minute), MailKnown: true, NewestMail: now.Add(-5 * time.Hour), TrackedSince: tracked, AddedAt: old},
			TierDecision{TierWarm, ReasonDefault}},
		{"recent mail", TierInput{Current: TierWarm, MailKnown: true, NewestMail: now.Add(-time.Hour), TrackedSince: tracked, AddedAt: old},
			TierDecision{TierHot, ReasonRecentMail}},
		{"unknown mail keeps an inherited tier", TierInput{Current: TierHot, TrackedSince: now.Add(-time.Minute), AddedAt: old},
			TierDecision{TierHot, ReasonUnknown}},
		{"unknown mail for too long", TierInput{Current: TierHot, TrackedSince: tracked, AddedAt: old},
			TierDecision{TierCold, ReasonInactive}},
		{"new mailbox without mail is warm, not cold", TierInput{Current: TierWarm, MailKnown: true, TrackedSince: tracked, AddedAt: now.Add(-24 * time.Hour)},
			TierDecision{TierWarm, ReasonDefault}},
		{"old mail", TierInput{Current: TierWarm, MailKnown: true, NewestMail: now.Add(-8 * 24 * time.Hour), TrackedSince: tracked, AddedAt: old},
			TierDecision{TierCold, ReasonInactive}},
		{"an old session still counts as activity", TierInput{Current: TierCold, SessionAt: now.Add(-2 * 24 * time.Hour), MailKnown: true, TrackedSince: tracked, AddedAt: old},
			TierDecision{TierWarm, ReasonDefault}},
	}
	for _, c := range cases {
		got := EvaluateTiers(now, p, []TierInput{c.in})[0]
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
	p := TierPolicy{SessionGrace: 15 * time.Minute, HotActivity: 2 * time.Hour, ColdAfter: 7 * 24 * time.Hour,
		UnknownGrace: 10 * time.Minute, HotBudget: 3}
	tracked := now.Add(-time.Hour)
	mail := func(ago time.Duration) TierInput {
		return TierInput{Current: TierHot, MailKnown: true, NewestMail: now.Add(-ago), TrackedSince: tracked, AddedAt: tracked}
	}
	session := TierInput{Current: TierHot, SessionAt: now.Add(-time.Minute), MailKnown: true, NewestMail: now.Add(-100 * time.Minute), TrackedSince: tracked, AddedAt: tracked}
	in := []TierInput{
		mail(10 * time.Minute), // 0: most recent
		mail(90 * time.Minute), // 1: least recent: demoted
		session,                // 2: session, oldest mail of all, never demoted
		mail(30 * time.Minute), // 3: demoted
		mail(60 * time.Minute), // 4: demoted
		session,                // 5
	}
	got := EvaluateTiers(now, p, in)
	want := []TierDecision{
		{TierHot, ReasonRecentMail}, {TierWarm, ReasonHotBudget}, {TierHot, ReasonSession},
		{TierWarm, ReasonHotBudget}, {TierWarm, ReasonHotBudget}, {TierHot, ReasonSession},
	}
	// Six hot (four by mail, two in session) against a budget of three:
	// the three least recently active mail-hot ones go (90m, 60m, 30m).
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("mailbox %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	// Sessions alone over the budget: nothing to demote, all stay hot.
	got = EvaluateTiers(now, TierPolicy{SessionGrace: time.Hour, HotBudget: 1}, []TierInput{session, session})
	if got[0].Tier != TierHot || got[1].Tier != TierHot {
		t.Errorf("sessions demoted: %+v", got)
	}
	// No budget.
	got = EvaluateTiers(now, TierPolicy{HotActivity: time.Hour, HotBudget: 0}, []TierInput{mail(time.Minute), mail(2 * time.Minute)})
	if got[0].Tier != TierHot || got[1].Tier != TierHot {
		t.Errorf("no budget: %+v", got)
	}
}

func TestHostPacer(t *testing.T) {
	t.Parallel()
	p := newHostPacer(20, 2)
	ctx := context.Background()
	start := time.Now()
	for range 6 { // 2 from the burst, then 4 at 20/s: about 200ms
		if err := p.wait(ctx, "imap.a.example"); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > 2*time.Second {
		t.Errorf("6 connections at 20/s with burst 2 took %s, want about 200ms", d)
	}
	// Another host has its own bucket: with host A's burst spent at one
	// connection per 2 s, a shared bucket would make host B wait 2 s per
	// connection; its own bucket lets both through at once.
	slow := newHostPacer(0.5, 2)
	for range 2 {
		if err := slow.wait(ctx, "imap.a.example"); err != nil {
			t.Fatal(err)
		}
	}
	start = time.Now()
	for range 2 {
		if err := slow.wait(ctx, "IMAP.B.example"); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d >= 1500*time.Millisecond {
		t.Errorf("a second host waited %s: it shares the first host's bucket", d)
	}
	// A canceled wait returns at once with the context's error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.wait(cctx, "imap.a.example"); err == nil {
		t.Error("canceled wait returned nil")
	}
}
