package domain

import "slices"

// The record catalog. Every record type mailplane writes, on every topic,
// has one Go type in this package and one JSON Schema: the domain events
// (events.go, registry) in schemas/, the records derived from them in
// schemas/derived: the placement decision log (placement_decisions.go),
// mailbox.state (mailboxstate.go), sync.tier and sync.audit
// (syncrecords.go), and the operator audit (opsaudit.go). Package topics
// says which topic carries which types.

var derivedRegistry = map[string]func() Data{
	TypeMailboxStateRecord:     func() Data { return new(MailboxStateRecord) },
	TypeSyncTierRecord:         func() Data { return new(SyncTierRecord) },
	TypeSyncOwnershipAcquired:  func() Data { return new(SyncOwnershipAcquired) },
	TypeSyncOwnershipLost:      func() Data { return new(SyncOwnershipLost) },
	TypeSyncOwnershipSuspended: func() Data { return new(SyncOwnershipSuspended) },
	TypeSyncTierChanged:        func() Data { return new(SyncTierChanged) },
	TypeSyncFailed:             func() Data { return new(SyncFailed) },
	TypeOpsAction:              func() Data { return new(OpsAction) },
}

// DerivedRecordTypes returns the type of every record mailplane derives from
// the domain events (placement decisions, mailbox.state, sync.tier and
// sync.audit records), sorted.
func DerivedRecordTypes() []string {
	ts := PlacementDecisionTypes()
	for t := range derivedRegistry {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// RecordTypes returns every record type in the catalog, the domain events
// and the derived records, sorted.
func RecordTypes() []string {
	ts := slices.Concat(EventTypes(), DerivedRecordTypes())
	slices.Sort(ts)
	return ts
}

// NewRecord returns an empty value of any record type in the catalog.
func NewRecord(recordType string) (Data, bool) {
	if d, ok := NewData(recordType); ok {
		return d, true
	}
	if d, ok := NewPlacementDecision(recordType); ok {
		return d, true
	}
	if f, ok := derivedRegistry[recordType]; ok {
		return f(), true
	}
	return nil, false
}
