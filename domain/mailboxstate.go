package domain

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// TypeMailboxStateRecord is the ce_type of mailbox.state records
// (tombstones carry it too). The version is part of the contract: an
// incompatible change to MailboxStateRecord is a new type, and a new topic
// version.
const TypeMailboxStateRecord = "mailplane.mailbox.state.v1"

// MailboxStateRecord is one live mailbox as sync sees it: the value of its
// mailbox.state record, folded from the mailbox events by the mailbox.state
// processor.
type MailboxStateRecord struct {
	MailboxID     string       `json:"mailbox_id"`
	OrgID         string       `json:"org_id"`
	UserID        string       `json:"user_id"`
	Address       string       `json:"address"`
	Provider      Provider     `json:"provider"`
	WarmupEnabled bool         `json:"warmup_enabled"`
	IMAP          IMAPEndpoint `json:"imap"`
	// SealedCredentials open only with the sealing keyring and
	// CredentialsAAD(MailboxID, Provider, IMAP); they are never in plain
	// text here.
	SealedCredentials *SealedSecret `json:"sealed_credentials,omitempty"`
	// Enabled is false for a mailbox that is registered but must not be
	// synced: a mailbox.disabled event (persistent authentication failures,
	// or an operator) disables it, keeping every other field, until a
	// mailbox.added (say with new credentials) enables it again.
	Enabled bool `json:"enabled"`
	// AddedAt is the ce_time of the mailbox.added this record comes from,
	// never later than its record timestamp (the producer may date it
	// back, not forward: Event.ClaimNoLaterThanLogged); a mailbox.disabled
	// leaves it as it was.
	AddedAt time.Time `json:"added_at"`
	// SourceEventID is the ce_id of the event this record was folded from,
	// the mailbox.added or the mailbox.disabled (also the record's ce_id, so
	// a replay writes identical records).
	SourceEventID string `json:"source_event_id"`
}

// EventType is TypeMailboxStateRecord.
func (MailboxStateRecord) EventType() string { return TypeMailboxStateRecord }

// AggregateID is the mailbox id, the record's key.
func (m MailboxStateRecord) AggregateID() string { return m.MailboxID }

// SameSync reports whether m and o would be synced identically: every field
// but the provenance ones is equal. A sync worker restarts a mailbox's
// runner only when this is false.
func (m MailboxStateRecord) SameSync(o MailboxStateRecord) bool {
	if m.MailboxID != o.MailboxID || m.OrgID != o.OrgID || m.UserID != o.UserID ||
		m.Address != o.Address || m.Provider != o.Provider || m.WarmupEnabled != o.WarmupEnabled ||
		m.IMAP != o.IMAP || m.Enabled != o.Enabled {
		return false
	}
	switch {
	case m.SealedCredentials == nil && o.SealedCredentials == nil:
		return true
	case m.SealedCredentials == nil || o.SealedCredentials == nil:
		return false
	}
	return *m.SealedCredentials == *o.SealedCredentials
}

// Validate checks a state record's value.
func (m MailboxStateRecord) Validate() Problems {
	// The same rules as the event it comes from, and never a plain secret
	// (the type has no field for one).
	a := MailboxAdded{
		MailboxID: m.MailboxID, OrgID: m.OrgID, UserID: m.UserID, Address: m.Address,
		Provider: m.Provider, WarmupEnabled: m.WarmupEnabled, IMAP: m.IMAP,
		SealedCredentials: m.SealedCredentials,
	}
	ps := a.Validate()
	if m.AddedAt.IsZero() {
		ps.Add("added_at", CodeRequired, "is required")
	}
	return ps
}

// DecodeMailboxStateRecord reads a mailbox.state record from its ce_type
// header (a record without one is taken as TypeMailboxStateRecord), key and
// value. live is false for a tombstone (a nil value; m then carries only
// MailboxID). A record that does not decode or validate is an error with a
// domain code; it never panics.
func DecodeMailboxStateRecord(ceType string, key, value []byte) (m MailboxStateRecord, live bool, err error) {
	if len(key) == 0 {
		return MailboxStateRecord{}, false, Errorf(CodeRequired, "mailbox.state record has no key")
	}
	if value == nil {
		return MailboxStateRecord{MailboxID: string(key)}, false, nil
	}
	if ceType != TypeMailboxStateRecord {
		return MailboxStateRecord{}, false, Errorf(CodeUnknownType, "mailbox.state record of type %q, want %s", ceType, TypeMailboxStateRecord)
	}
	dec := json.NewDecoder(bytes.NewReader(value))
	if err := dec.Decode(&m); err != nil {
		return MailboxStateRecord{}, false, Errorf(CodeMalformedJSON, "mailbox.state record: %v", err)
	}
	if ps := m.Validate(); len(ps) > 0 {
		return MailboxStateRecord{}, false, ps.Err()
	}
	if m.MailboxID != string(key) {
		return MailboxStateRecord{}, false, Errorf(CodeKeyMismatch, "record key %q is not the mailbox id %q", key, m.MailboxID)
	}
	return m, true, nil
}

// String is safe to log: it names the mailbox, never its credentials.
func (m MailboxStateRecord) String() string {
	return fmt.Sprintf("mailbox %s (%s, %s:%d)", m.MailboxID, m.Provider, m.IMAP.Host, m.IMAP.Port)
}
