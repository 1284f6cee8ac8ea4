package projections

import (
	"slices"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// The folds below reduce a batch of events to one row change per key, so a
// batch becomes one merge per table. They are pure. Each row change says
// which groups of columns the batch set; the merge SQL keeps the stored
// value of every group the batch did not touch. Folding a batch in one go or
// in pieces gives the same rows: that is what lets a projector choose its
// batch boundaries freely and a replay reproduce the live rows.
//
// The rules (which event sets which columns) are the registry's; if placement
// ever needs the same rules in memory they belong in domain/.

// mailboxChange is the folded effect of a batch on one mailbox row.
type mailboxChange struct {
	MailboxID string
	// Added is the last mailbox.added of the batch (nil: none); AddedAt
	// its time. An add also clears a removal that came before it.
	Added   *domain.MailboxAdded
	AddedAt time.Time
	// Sealed is the credentials of the last credentials_rotated not
	// followed by an add (nil: none); they replace the added ones.
	Sealed *domain.SealedSecret
	// Health is the last mailbox.health_scored (nil: none).
	Health *domain.MailboxHealthScored
	// RemovedAt and RemovalReason are set by the last mailbox.removed not
	// followed by an add; both stay nil when an add came after it.
	RemovedAt     *time.Time
	RemovalReason *string
	// DisabledAt and DisabledReason are set by the last mailbox.disabled
	// not followed by an add.
	DisabledAt     *time.Time
	DisabledReason *string
	// UpdatedAt and LastEventID are the last event's.
	UpdatedAt   time.Time
	LastEventID string
}

type orgChange struct {
	OrgID string
	Plan  *domain.OrgPlanChanged
	At    time.Time
}

// userChange carries the latest activity in the batch; the merge keeps the
// later of it and the stored one.
type userChange struct {
	UserID   string
	ActiveAt time.Time
	Source   domain.ActivitySource
}

type workerChange struct {
	WorkerID    string
	Heartbeat   *domain.WorkerHeartbeat // last heartbeat (nil: none)
	HeartbeatAt time.Time
	Sample      *domain.WorkerHealthSampled // last sample (nil: none)
	SampledAt   time.Time
}

// registryChanges is a batch folded per table, each sorted by key so that
// concurrent transactions lock rows in one order.
type registryChanges struct {
	Mailboxes []*mailboxChange
	Orgs      []*orgChange
	Users     []*userChange
	Workers   []*workerChange
}

// foldRegistry folds events, in log order, into row changes.
func foldRegistry(events []domain.Event) registryChanges {
	mailboxes := map[string]*mailboxChange{}
	orgs := map[string]*orgChange{}
	users := map[string]*userChange{}
	workers := map[string]*workerChange{}

	mailbox := func(id string) *mailboxChange {
		c := mailboxes[id]
		if c == nil {
			c = &mailboxChange{MailboxID: id}
			mailboxes[id] = c
		}
		return c
	}
	worker := func(id string) *workerChange {
		c := workers[id]
		if c == nil {
			c = &workerChange{WorkerID: id}
			workers[id] = c
		}
		return c
	}

	for _, e := range events {
		switch d := e.Data.(type) {
		case *domain.MailboxAdded:
			c := mailbox(d.MailboxID)
			c.Added, c.AddedAt = d, e.ClaimNoLaterThanLogged()
			c.Sealed = nil
			c.RemovedAt, c.RemovalReason = nil, nil
			c.DisabledAt, c.DisabledReason = nil, nil
			c.UpdatedAt, c.LastEventID = e.Time, e.Key()
		case *domain.MailboxRemoved:
			c := mailbox(d.MailboxID)
			t, reason := e.Time, d.Reason
			c.RemovedAt, c.RemovalReason = &t, &reason
			c.UpdatedAt, c.LastEventID = e.Time, e.Key()
		case *domain.MailboxDisabled:
			c := mailbox(d.MailboxID)
			t, reason := e.Time, string(d.Cause)+": "+d.Reason
			c.DisabledAt, c.DisabledReason = &t, &reason
			c.UpdatedAt, c.LastEventID = e.Time, e.Key()
		case *domain.CredentialsRotated:
			c := mailbox(d.MailboxID)
			c.Sealed = d.SealedCredentials
			c.UpdatedAt, c.LastEventID = e.Time, e.Key()
		case *domain.MailboxHealthScored:
			c := mailbox(d.MailboxID)
			c.Health = d
			c.UpdatedAt, c.LastEventID = e.Time, e.Key()
		case *domain.OrgPlanChanged:
			orgs[d.OrgID] = &orgChange{OrgID: d.OrgID, Plan: d, At: e.Time}
		case *domain.UserActive:
			// The latest activity wins whatever order it arrived in; on a
			// tie the later event does, as in the merge.
			c := users[d.UserID]
			if c == nil || !e.Time.Before(c.ActiveAt) {
				users[d.UserID] = &userChange{UserID: d.UserID, ActiveAt: e.Time, Source: d.Source}
			}
		case *domain.WorkerHeartbeat:
			c := worker(d.WorkerID)
			c.Heartbeat, c.HeartbeatAt = d, e.Time
		case *domain.WorkerHealthSampled:
			c := worker(d.WorkerID)
			c.Sample, c.SampledAt = d, e.Time
		}
	}
	return registryChanges{
		Mailboxes: sortedValues(mailboxes, func(c *mailboxChange) string { return c.MailboxID }),
		Orgs:      sortedValues(orgs, func(c *orgChange) string { return c.OrgID }),
		Users:     sortedValues(users, func(c *userChange) string { return c.UserID }),
		Workers:   sortedValues(workers, func(c *workerChange) string { return c.WorkerID }),
	}
}

func sortedValues[T any](m map[string]T, key func(T) string) []T {
	out := make([]T, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b T) int { return strings.Compare(key(a), key(b)) })
	return out
}
