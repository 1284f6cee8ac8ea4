package domain

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// The records the sync workers write: a mailbox's tier on the compacted
// sync.tier topic (state, one per mailbox), and the audit events of
// sync.audit (ownership of mailbox.state partitions, tier changes, runner
// failures). Their schemas are in schemas/derived.

// ce_types of the sync records.
const (
	TypeSyncTierRecord         = "mailplane.sync.tier.v1"
	TypeSyncOwnershipAcquired  = "mailplane.sync.ownership_acquired.v1"
	TypeSyncOwnershipLost      = "mailplane.sync.ownership_lost.v1"
	TypeSyncOwnershipSuspended = "mailplane.sync.ownership_suspended.v1"
	TypeSyncTierChanged        = "mailplane.sync.tier_changed.v1"
	TypeSyncFailed             = "mailplane.sync.failed.v1"
)

// SyncTierRecord is the value of a sync.tier record: a mailbox's tier as its
// owner last decided it, with the ownership it was decided under. A new
// owner starts the mailbox in this tier.
type SyncTierRecord struct {
	MailboxID string    `json:"mailbox_id"`
	Tier      SyncTier  `json:"tier"`
	Reason    string    `json:"reason"`
	Partition int32     `json:"partition"`
	Epoch     int64     `json:"epoch"`
	Owner     string    `json:"owner"`
	ChangedAt time.Time `json:"changed_at"`
}

// EventType is TypeSyncTierRecord.
func (*SyncTierRecord) EventType() string { return TypeSyncTierRecord }

// AggregateID is the mailbox id, the record's key.
func (r *SyncTierRecord) AggregateID() string { return r.MailboxID }

// Validate checks what a new owner relies on: the mailbox and a known tier.
func (r *SyncTierRecord) Validate() Problems {
	var ps Problems
	if r.MailboxID == "" {
		ps.Add("mailbox_id", CodeRequired, "is required")
	}
	if !r.Tier.Valid() {
		ps.Add("tier", CodeInvalid, "must be hot, warm or cold")
	}
	return ps
}

// DecodeSyncTierRecord reads a sync.tier record from its ce_type header (a
// record without one is taken as TypeSyncTierRecord), key and value; ok is
// false for a tombstone (a nil value), whose record carries only the
// mailbox id.
func DecodeSyncTierRecord(ceType string, key, value []byte) (rec SyncTierRecord, ok bool, err error) {
	if value == nil {
		return SyncTierRecord{MailboxID: string(key)}, false, nil
	}
	if ceType != TypeSyncTierRecord {
		return SyncTierRecord{}, false, fmt.Errorf("sync.tier record of type %q", ceType)
	}
	if err := json.Unmarshal(value, &rec); err != nil {
		return SyncTierRecord{}, false, err
	}
	if ps := rec.Validate(); len(ps) > 0 {
		return SyncTierRecord{}, false, ps.Err()
	}
	if rec.MailboxID != string(key) {
		return SyncTierRecord{}, false, fmt.Errorf("sync.tier record key %q is not the mailbox id %q", key, rec.MailboxID)
	}
	return rec, true, nil
}

// SyncOwnershipAcquired: a worker took an epoch of a partition.
type SyncOwnershipAcquired struct {
	Partition int32     `json:"partition"`
	Epoch     int64     `json:"epoch"`
	Owner     string    `json:"owner"`
	At        time.Time `json:"at"`
}

// EventType is TypeSyncOwnershipAcquired.
func (*SyncOwnershipAcquired) EventType() string { return TypeSyncOwnershipAcquired }

// AggregateID is the partition's key, "partition-<n>".
func (o *SyncOwnershipAcquired) AggregateID() string { return syncPartitionKey(o.Partition) }

// Validate accepts every value: the schema documents what workers write.
func (*SyncOwnershipAcquired) Validate() Problems { return nil }

// Ownership loss reasons.
const (
	SyncLostRevoked = "revoked" // the group moved the partition (or the worker left)
	SyncLostLost    = "lost"    // the worker fell out of the group
)

// SyncOwnershipLost: a worker stopped a partition's runners because the
// group took the partition away.
type SyncOwnershipLost struct {
	Partition int32     `json:"partition"`
	Epoch     int64     `json:"epoch"`
	Owner     string    `json:"owner"`
	Reason    string    `json:"reason"`
	Runners   int       `json:"runners"`
	At        time.Time `json:"at"`
}

// EventType is TypeSyncOwnershipLost.
func (*SyncOwnershipLost) EventType() string { return TypeSyncOwnershipLost }

// AggregateID is the partition's key, "partition-<n>".
func (o *SyncOwnershipLost) AggregateID() string { return syncPartitionKey(o.Partition) }

// Validate accepts every value: the schema documents what workers write.
func (*SyncOwnershipLost) Validate() Problems { return nil }

// Suspension reasons.
const (
	SyncSuspendedWatchdog = "watchdog" // no group request answered in time
	SyncSuspendedFenced   = "fenced"   // a write found a newer epoch
)

// SyncOwnershipSuspended: a worker stopped a partition's runners on its own
// suspicion that it may no longer own it; it restarts them under a new
// epoch if the group confirms it still does.
type SyncOwnershipSuspended struct {
	Partition int32     `json:"partition"`
	Epoch     int64     `json:"epoch"`
	Owner     string    `json:"owner"`
	Reason    string    `json:"reason"`
	Runners   int       `json:"runners"`
	At        time.Time `json:"at"`
}

// EventType is TypeSyncOwnershipSuspended.
func (*SyncOwnershipSuspended) EventType() string { return TypeSyncOwnershipSuspended }

// AggregateID is the partition's key, "partition-<n>".
func (o *SyncOwnershipSuspended) AggregateID() string { return syncPartitionKey(o.Partition) }

// Validate accepts every value: the schema documents what workers write.
func (*SyncOwnershipSuspended) Validate() Problems { return nil }

// SyncTierChanged: an owner changed a mailbox's tier.
type SyncTierChanged struct {
	MailboxID string    `json:"mailbox_id"`
	From      SyncTier  `json:"from"`
	To        SyncTier  `json:"to"`
	Reason    string    `json:"reason"`
	Partition int32     `json:"partition"`
	Epoch     int64     `json:"epoch"`
	Owner     string    `json:"owner"`
	At        time.Time `json:"at"`
}

// EventType is TypeSyncTierChanged.
func (*SyncTierChanged) EventType() string { return TypeSyncTierChanged }

// AggregateID is the mailbox id.
func (t *SyncTierChanged) AggregateID() string { return t.MailboxID }

// Validate accepts every value: the schema documents what workers write.
func (*SyncTierChanged) Validate() Problems { return nil }

// SyncFailed: a runner returned an error (it is restarted after a backoff).
type SyncFailed struct {
	MailboxID string `json:"mailbox_id"`
	Partition int32  `json:"partition"`
	Epoch     int64  `json:"epoch"`
	Owner     string `json:"owner"`
	Error     string `json:"error"`
	// Category classifies an IMAP runner's failure (imapsync.Kind:
	// auth_failed, credentials_unbound, policy_refused, connect,
	// server_oversized, server_slow, ...);
	// empty for other runners' failures.
	Category string    `json:"category,omitempty"`
	Attempt  int       `json:"attempt"`
	At       time.Time `json:"at"`
}

// EventType is TypeSyncFailed.
func (*SyncFailed) EventType() string { return TypeSyncFailed }

// AggregateID is the mailbox id.
func (s *SyncFailed) AggregateID() string { return s.MailboxID }

// Validate accepts every value: the schema documents what workers write.
func (*SyncFailed) Validate() Problems { return nil }

func syncPartitionKey(p int32) string { return "partition-" + strconv.Itoa(int(p)) }
