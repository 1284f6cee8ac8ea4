package projections

import (
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
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
	if b.RemovedAt == nil || *b.RemovalReason != "churn" || b.Health.State != domain.HealthWatch || b.LastEventID != events[5].ID {
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
		{Permanent("", errString("x")), true, domain.CodeInvalid},
		{errString("connection reset"), false, ""},
	} {
		code, ok := IsPermanent(tc.err)
		if ok != tc.want || code != tc.code {
			t.Errorf("%v: %v %v", tc.err, code, ok)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// TestFoldRegistryIgnoresDisabledAndObservations: the registry has no
// column for either type, so it folds them to nothing: no row change of
// their own, and the mailbox's last event stays the one before them.
func TestFoldRegistryIgnoresDisabledAndObservations(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const m1, m2 = "m1", "m2"
	add := domain.Event{ID: "a", Type: domain.TypeMailboxAdded, Time: t0, Data: &domain.MailboxAdded{MailboxID: m1, Address: "a@b.c"}}
	others := []domain.Event{
		{ID: "b", Type: domain.TypeMailboxDisabled, Time: t0.Add(time.Second),
			Data: &domain.MailboxDisabled{MailboxID: m1, Cause: domain.DisableAuthFailing, Reason: "refused"}},
		{ID: "c", Type: domain.TypeWarmupObserved, Time: t0.Add(2 * time.Second),
			Data: &domain.WarmupObserved{MailboxID: m1, WarmupID: "w", Placement: domain.PlacedJunk, LandedAt: t0, Source: domain.ObservedBySync}},
		{ID: "d", Type: domain.TypeMailboxDisabled, Time: t0.Add(3 * time.Second),
			Data: &domain.MailboxDisabled{MailboxID: m2, Cause: domain.DisableOperator, Reason: "unknown mailbox"}},
	}
	if ch := foldRegistry(others); len(ch.Mailboxes)+len(ch.Orgs)+len(ch.Users)+len(ch.Workers) != 0 {
		t.Errorf("folded to row changes: %+v", ch)
	}
	ch := foldRegistry(append([]domain.Event{add}, others...))
	if len(ch.Mailboxes) != 1 {
		t.Fatalf("mailboxes: %+v", ch.Mailboxes)
	}
	if c := ch.Mailboxes[0]; c.MailboxID != m1 || c.LastEventID != "a" || !c.UpdatedAt.Equal(t0) || c.Added == nil || c.RemovedAt != nil {
		t.Errorf("mailbox: %+v", c)
	}
}
