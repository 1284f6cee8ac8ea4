// Package mailboxstate keeps the compacted mailbox.state topic: one record
// per live mailbox, keyed by mailbox id, holding what a sync worker needs to
// run it (a disabled mailbox keeps its record, with Enabled false), and a
// tombstone when the mailbox is removed. Its Processor folds
// the mailbox domain events into that topic exactly once (a Kafka
// transaction per batch, input offsets committed in the same transaction),
// and once per event id: a copy of an event produced again with the same
// ce_id within the dedupe window (default 7 days of log time) is skipped,
// through a changelog of applied ids written in the same transactions (see
// dedupe.go for the design and its bounds). Its record codec is shared by
// the processor and the sync workers.
//
// mailbox.state is derived: replaying the mailbox events into a fresh topic
// (with any partition count) rebuilds it. Records are placed by the
// Kafka-compatible murmur2 hash of their key, so sync.tier, keyed the same way
// and created with the same partition count, is co-partitioned with it.
package mailboxstate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

// Type is the ce_type of mailbox.state records (tombstones carry it too).
// The version is part of the contract: an incompatible change to Mailbox is
// a new type, and a new topic version.
const Type = "mailplane.mailbox.state.v1"

// Source is the ce_source of mailbox.state records.
const Source = "mailplane/mailbox-state"

// Mailbox is one live mailbox as sync sees it: the value of its
// mailbox.state record.
type Mailbox struct {
	MailboxID     string              `json:"mailbox_id"`
	OrgID         string              `json:"org_id"`
	UserID        string              `json:"user_id"`
	Address       string              `json:"address"`
	Provider      domain.Provider     `json:"provider"`
	WarmupEnabled bool                `json:"warmup_enabled"`
	IMAP          domain.IMAPEndpoint `json:"imap"`
	// SealedCredentials open only with the sealing keyring and
	// domain.CredentialsAAD(MailboxID, Provider, IMAP); they are never in
	// plain text here.
	SealedCredentials *domain.SealedSecret `json:"sealed_credentials,omitempty"`
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

// SameSync reports whether a and b would be synced identically: every field
// but the provenance ones is equal. A sync worker restarts a mailbox's
// runner only when this is false.
func (m Mailbox) SameSync(o Mailbox) bool {
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

// FromAdded returns the state of the mailbox a mailbox.added event registers.
func FromAdded(e domain.Event, d *domain.MailboxAdded) Mailbox {
	return Mailbox{
		MailboxID:         d.MailboxID,
		OrgID:             d.OrgID,
		UserID:            d.UserID,
		Address:           d.Address,
		Provider:          d.Provider,
		WarmupEnabled:     d.WarmupEnabled,
		IMAP:              d.IMAP,
		SealedCredentials: d.SealedCredentials,
		Enabled:           true,
		AddedAt:           e.ClaimNoLaterThanLogged().UTC(),
		SourceEventID:     e.ID,
	}
}

// Disabled returns the state of mailbox m once the mailbox.disabled event e
// is folded: m with Enabled false, folded from e (the record's ce_id and
// ce_time are e's). Every other field, AddedAt included, stays.
func Disabled(m Mailbox, e domain.Event) Mailbox {
	m.Enabled = false
	m.SourceEventID = e.ID
	return m
}

// Rotated returns the state of mailbox m once the credentials_rotated
// event e is folded: m with e's sealed credentials, folded from e; every
// other field (Enabled, AddedAt) stays. ok is false, and m unchanged, when
// the rotation was computed from another registration than m's (its
// added_at differs: a mailbox.added came in between).
func Rotated(m Mailbox, e domain.Event, d *domain.CredentialsRotated) (Mailbox, bool) {
	if !d.AddedAt.Equal(m.AddedAt) {
		return m, false
	}
	m.SealedCredentials = d.SealedCredentials
	m.SourceEventID = e.ID
	return m, true
}

// Validate checks a state record's value.
func (m Mailbox) Validate() domain.Problems {
	// The same rules as the event it comes from, and never a plain secret
	// (the type has no field for one).
	a := domain.MailboxAdded{
		MailboxID: m.MailboxID, OrgID: m.OrgID, UserID: m.UserID, Address: m.Address,
		Provider: m.Provider, WarmupEnabled: m.WarmupEnabled, IMAP: m.IMAP,
		SealedCredentials: m.SealedCredentials,
	}
	ps := a.Validate()
	if m.AddedAt.IsZero() {
		ps.Add("added_at", domain.CodeRequired, "is required")
	}
	return ps
}

func headers(id, subject string, t time.Time) []kgo.RecordHeader {
	return []kgo.RecordHeader{
		{Key: topics.HeaderSpecVersion, Value: []byte(domain.SpecVersion)},
		{Key: topics.HeaderID, Value: []byte(id)},
		{Key: topics.HeaderType, Value: []byte(Type)},
		{Key: topics.HeaderSource, Value: []byte(Source)},
		{Key: topics.HeaderTime, Value: []byte(t.UTC().Format(time.RFC3339Nano))},
		{Key: topics.HeaderSubject, Value: []byte(subject)},
		{Key: topics.HeaderContentType, Value: []byte(topics.ContentTypeJSON)},
	}
}

// Record returns m's mailbox.state record. The partition is left to the
// producer's partitioner (murmur2 of the key). at is the ce_time: the time
// of the event the record was folded from.
func Record(m Mailbox, at time.Time) (*kgo.Record, error) {
	v, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return &kgo.Record{
		Topic:   topics.MailboxState,
		Key:     []byte(m.MailboxID),
		Value:   v,
		Headers: headers(m.SourceEventID, m.MailboxID, at),
	}, nil
}

// Tombstone returns the mailbox.state tombstone of a removed mailbox: a
// nil value, with the removal event's id and time in the headers.
func Tombstone(mailboxID, eventID string, at time.Time) *kgo.Record {
	return &kgo.Record{
		Topic:   topics.MailboxState,
		Key:     []byte(mailboxID),
		Headers: headers(eventID, mailboxID, at),
	}
}

// Decode reads a mailbox.state record. live is false for a tombstone (m
// then carries only MailboxID). A record that does not decode or validate is
// an error with a domain code; Decode never panics.
func Decode(r *kgo.Record) (m Mailbox, live bool, err error) {
	if len(r.Key) == 0 {
		return Mailbox{}, false, domain.Errorf(domain.CodeRequired, "mailbox.state record has no key")
	}
	if r.Value == nil {
		return Mailbox{MailboxID: string(r.Key)}, false, nil
	}
	if t, ok := topics.Header(r, topics.HeaderType); ok && t != Type {
		return Mailbox{}, false, domain.Errorf(domain.CodeUnknownType, "mailbox.state record of type %q, want %s", t, Type)
	}
	dec := json.NewDecoder(bytes.NewReader(r.Value))
	if err := dec.Decode(&m); err != nil {
		return Mailbox{}, false, domain.Errorf(domain.CodeMalformedJSON, "mailbox.state record: %v", err)
	}
	if ps := m.Validate(); len(ps) > 0 {
		return Mailbox{}, false, ps.Err()
	}
	if m.MailboxID != string(r.Key) {
		return Mailbox{}, false, domain.Errorf(domain.CodeKeyMismatch, "record key %q is not the mailbox id %q", r.Key, m.MailboxID)
	}
	return m, true, nil
}

// String is safe to log: it names the mailbox, never its credentials.
func (m Mailbox) String() string {
	return fmt.Sprintf("mailbox %s (%s, %s:%d)", m.MailboxID, m.Provider, m.IMAP.Host, m.IMAP.Port)
}
