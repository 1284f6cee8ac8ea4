package projections

import (
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/applyonce"
)

func TestFoldRegistry(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	n := 0
	ev := func(d domain.Data, sec int) domain.Event {
		n++
		return domain.Event{ID: string(rune('a' + n)), Type: d.EventType(), Time: t0.Add(time.Duration(sec) * time.Second), Data: d}
	}
	const m1, m2, u1, w1 = "m1", "m2", "u1", "w1"
	events := []domain.Event{
		ev(&domain.MailboxAdded{MailboxID: m1, Address: "a@b.c"}, 1),
		ev(&domain.MailboxRemoved{MailboxID: m1, Reason: "gone"}, 2),
		ev(&domain.MailboxAdded{MailboxID: m1, Address: "x@y.z"}, 3),
		ev(&domain.MailboxAdded{MailboxID: m2}, 1),
		ev(&domain.MailboxHealthScored{MailboxID: m2, State: domain.HealthWatch}, 2),
		ev(&domain.MailboxRemoved{MailboxID: m2, Reason: "churn"}, 3),
		ev(&domain.UserActive{UserID: u1, Source: domain.ActivityLogin}, 10),
		ev(&domain.UserActive{UserID: u1, Source: domain.ActivityWSPing}, 5),
		ev(&domain.UserActive{UserID: u1, Source: domain.ActivityWSConnect}, 10),
		ev(&domain.WorkerHealthSampled{WorkerID: w1, Sends: 5}, 1),
		ev(&domain.WorkerHeartbeat{WorkerID: w1, Address: "h1"}, 2),
		ev(&domain.WorkerHeartbeat{WorkerID: w1, Address: "h2"}, 3),
	}
	ch := foldRegistry(events)
	if len(ch.Mailboxes) != 2 || ch.Mailboxes[0].MailboxID != m1 {
		t.Fatalf("mailboxes: %+v", ch.Mailboxes)
	}
	a := ch.Mailboxes[0]
	if a.Added.Address != "x@y.z" || !a.AddedAt.Equal(t0.Add(3*time.Second)) || a.RemovedAt != nil || a.RemovalReason != nil || a.Health != nil {
		t.Errorf("re-added mailbox: %+v", a)
	}
	b := ch.Mailboxes[1]
	if b.RemovedAt == nil || *b.RemovalReason != "churn" || b.Health.State != domain.HealthWatch || b.LastEventID != events[5].Key() {
		t.Errorf("removed mailbox: %+v", b)
	}
	u := ch.Users[0]
	if !u.ActiveAt.Equal(t0.Add(10*time.Second)) || u.Source != domain.ActivityWSConnect {
		t.Errorf("user: latest activity, later event on a tie: %+v", u)
	}
	w := ch.Workers[0]
	if w.Heartbeat.Address != "h2" || w.Sample.Sends != 5 || !w.SampledAt.Equal(t0.Add(time.Second)) {
		t.Errorf("worker: %+v", w)
	}
	if len(foldRegistry(nil).Mailboxes) != 0 {
		t.Error("empty fold")
	}
}

func TestIsPermanent(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
		code domain.Code
	}{
		{domain.Errorf(domain.CodeConflict, "x"), true, domain.CodeConflict},
		{domain.Errorf(domain.CodeUnavailable, "x"), false, ""},
		{applyonce.Permanent("", errString("x")), true, domain.CodeInvalid},
		{errString("connection reset"), false, ""},
	} {
		code, ok := applyonce.IsPermanent(tc.err)
		if ok != tc.want || code != tc.code {
			t.Errorf("%v: %v %v", tc.err, code, ok)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// TestFoldRegistryDisabledAndObservations: a disable marks its mailbox
// (known or not); observations (on their own topic, which the registry does
// not read) fold to nothing.
func TestFoldRegistryDisabledAndObservations(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const m1, m2 = "m1", "m2"
	add := domain.Event{ID: "a", Type: domain.TypeMailboxAdded, Time: t0, Data: &domain.MailboxAdded{MailboxID: m1, Address: "a@b.c"}}
	obs := domain.Event{ID: "c", Type: domain.TypeWarmupObserved, Time: t0.Add(2 * time.Second),
		Data: &domain.WarmupObserved{MailboxID: m1, WarmupID: "w", Placement: domain.PlacedJunk, LandedAt: t0, Source: domain.ObservedBySync}}
	if ch := foldRegistry([]domain.Event{obs}); len(ch.Mailboxes)+len(ch.Orgs)+len(ch.Users)+len(ch.Workers) != 0 {
		t.Errorf("an observation folded to row changes: %+v", ch)
	}
	events := []domain.Event{add,
		{ID: "b", Type: domain.TypeMailboxDisabled, Time: t0.Add(time.Second),
			Data: &domain.MailboxDisabled{MailboxID: m1, Cause: domain.DisableAuthFailing, Reason: "refused"}},
		obs,
		{ID: "d", Type: domain.TypeMailboxDisabled, Time: t0.Add(3 * time.Second),
			Data: &domain.MailboxDisabled{MailboxID: m2, Cause: domain.DisableOperator, Reason: "by hand"}},
	}
	ch := foldRegistry(events)
	if len(ch.Mailboxes) != 2 {
		t.Fatalf("mailboxes: %+v", ch.Mailboxes)
	}
	c := ch.Mailboxes[0]
	if c.MailboxID != m1 || c.LastEventID != domain.EventKey("", "b") || c.Added == nil || c.DisabledAt == nil || *c.DisabledReason != "auth_failing: refused" {
		t.Errorf("mailbox 1: %+v", c)
	}
	if c := ch.Mailboxes[1]; c.MailboxID != m2 || c.Added != nil || c.DisabledAt == nil || *c.DisabledReason != "operator: by hand" {
		t.Errorf("mailbox 2: %+v", c)
	}
	// Added again after the disable: enabled.
	ch = foldRegistry(append(events[:2:2], domain.Event{ID: "e", Type: domain.TypeMailboxAdded, Time: t0.Add(4 * time.Second), Data: &domain.MailboxAdded{MailboxID: m1}}))
	if c := ch.Mailboxes[0]; c.DisabledAt != nil || c.DisabledReason != nil {
		t.Errorf("re-added mailbox still disabled: %+v", c)
	}
}
