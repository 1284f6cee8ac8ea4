package mailsync

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

// ce_types of the records sync writes. Tier records (sync.tier) are
// state, one per mailbox, compacted; the others are audit events on
// sync.audit.
const (
	TypeTier               = "mailplane.sync.tier.v1"
	TypeOwnershipAcquired  = "mailplane.sync.ownership_acquired.v1"
	TypeOwnershipLost      = "mailplane.sync.ownership_lost.v1"
	TypeOwnershipSuspended = "mailplane.sync.ownership_suspended.v1"
	TypeTierChanged        = "mailplane.sync.tier_changed.v1"
	TypeSyncFailed         = "mailplane.sync.failed.v1"
	sourcePrefix           = "mailplane/sync/"
	maxAuditErrorLen       = 500
)

// TierRecord is the value of a sync.tier record: a mailbox's tier as its
// owner last decided it, with the ownership it was decided under. A new
// owner starts the mailbox in this tier.
type TierRecord struct {
	MailboxID string    `json:"mailbox_id"`
	Tier      Tier      `json:"tier"`
	Reason    string    `json:"reason"`
	Partition int32     `json:"partition"`
	Epoch     int64     `json:"epoch"`
	Owner     string    `json:"owner"`
	ChangedAt time.Time `json:"changed_at"`
}

func (*TierRecord) EventType() string     { return TypeTier }
func (r *TierRecord) AggregateID() string { return r.MailboxID }
func (r *TierRecord) Validate() domain.Problems {
	var ps domain.Problems
	if r.MailboxID == "" {
		ps.Add("mailbox_id", domain.CodeRequired, "is required")
	}
	if !r.Tier.Valid() {
		ps.Add("tier", domain.CodeInvalid, "must be hot, warm or cold")
	}
	return ps
}

// OwnershipAcquired: a worker took an epoch of a partition.
type OwnershipAcquired struct {
	Partition int32     `json:"partition"`
	Epoch     int64     `json:"epoch"`
	Owner     string    `json:"owner"`
	At        time.Time `json:"at"`
}

func (*OwnershipAcquired) EventType() string     { return TypeOwnershipAcquired }
func (o *OwnershipAcquired) AggregateID() string { return partitionKey(o.Partition) }
func (*OwnershipAcquired) Validate() domain.Problems {
	return nil
}

// Ownership loss reasons.
const (
	LostRevoked = "revoked" // the group moved the partition (or the worker left)
	LostLost    = "lost"    // the worker fell out of the group
)

// OwnershipLost: a worker stopped a partition's runners because the group
// took the partition away.
type OwnershipLost struct {
	Partition int32     `json:"partition"`
	Epoch     int64     `json:"epoch"`
	Owner     string    `json:"owner"`
	Reason    string    `json:"reason"`
	Runners   int       `json:"runners"`
	At        time.Time `json:"at"`
}

func (*OwnershipLost) EventType() string     { return TypeOwnershipLost }
func (o *OwnershipLost) AggregateID() string { return partitionKey(o.Partition) }
func (*OwnershipLost) Validate() domain.Problems {
	return nil
}

// Suspension reasons.
const (
	SuspendedWatchdog = "watchdog" // no group request answered in time
	SuspendedFenced   = "fenced"   // a write found a newer epoch
)

// OwnershipSuspended: a worker stopped a partition's runners on its own
// suspicion that it may no longer own it; it restarts them under a new
// epoch if the group confirms it still does.
type OwnershipSuspended struct {
	Partition int32     `json:"partition"`
	Epoch     int64     `json:"epoch"`
	Owner     string    `json:"owner"`
	Reason    string    `json:"reason"`
	Runners   int       `json:"runners"`
	At        time.Time `json:"at"`
}

func (*OwnershipSuspended) EventType() string     { return TypeOwnershipSuspended }
func (o *OwnershipSuspended) AggregateID() string { return partitionKey(o.Partition) }
func (*OwnershipSuspended) Validate() domain.Problems {
	return nil
}

// TierChanged: an owner changed a mailbox's tier.
type TierChanged struct {
	MailboxID string    `json:"mailbox_id"`
	From      Tier      `json:"from"`
	To        Tier      `json:"to"`
	Reason    string    `json:"reason"`
	Partition int32     `json:"partition"`
	Epoch     int64     `json:"epoch"`
	Owner     string    `json:"owner"`
	At        time.Time `json:"at"`
}

func (*TierChanged) EventType() string     { return TypeTierChanged }
func (t *TierChanged) AggregateID() string { return t.MailboxID }
func (*TierChanged) Validate() domain.Problems {
	return nil
}

// SyncFailed: a runner returned an error (it is restarted after a backoff).
type SyncFailed struct {
	MailboxID string `json:"mailbox_id"`
	Partition int32  `json:"partition"`
	Epoch     int64  `json:"epoch"`
	Owner     string `json:"owner"`
	Error     string `json:"error"`
	// Category classifies an IMAP runner's failure (imapsync.Kind:
	// auth_failed, credentials_unbound, policy_refused, connect, ...);
	// empty for other runners' failures.
	Category string    `json:"category,omitempty"`
	Attempt  int       `json:"attempt"`
	At       time.Time `json:"at"`
}

func (*SyncFailed) EventType() string     { return TypeSyncFailed }
func (s *SyncFailed) AggregateID() string { return s.MailboxID }
func (*SyncFailed) Validate() domain.Problems {
	return nil
}

func partitionKey(p int32) string { return "partition-" + strconv.Itoa(int(p)) }

// encodeRecord renders d as a CloudEvent in binary mode on topic.
func encodeRecord(topic, owner string, at time.Time, d domain.Data) (*kgo.Record, error) {
	return topics.EncodeTo(topic, domain.Event{
		ID: domain.NewEventID(), Type: d.EventType(), Source: sourcePrefix + owner,
		Time: at, Subject: d.AggregateID(), Data: d,
	})
}

// tierTombstone clears a removed mailbox's tier record.
func tierTombstone(mailboxID string) *kgo.Record {
	return &kgo.Record{Topic: topics.SyncTier, Key: []byte(mailboxID)}
}

// DecodeTierRecord reads a sync.tier record; ok is false for a tombstone.
func DecodeTierRecord(r *kgo.Record) (rec TierRecord, ok bool, err error) {
	if r.Value == nil {
		return TierRecord{MailboxID: string(r.Key)}, false, nil
	}
	if t, found := topics.Header(r, topics.HeaderType); found && t != TypeTier {
		return TierRecord{}, false, fmt.Errorf("sync.tier record of type %q", t)
	}
	if err := json.Unmarshal(r.Value, &rec); err != nil {
		return TierRecord{}, false, err
	}
	if ps := rec.Validate(); len(ps) > 0 {
		return TierRecord{}, false, ps.Err()
	}
	if rec.MailboxID != string(r.Key) {
		return TierRecord{}, false, fmt.Errorf("sync.tier record key %q is not the mailbox id %q", r.Key, rec.MailboxID)
	}
	return rec, true, nil
}

// truncate bounds s to n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
