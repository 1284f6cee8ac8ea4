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
	"encoding/json"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

// Source is the ce_source of mailbox.state records.
const Source = "mailplane/mailbox-state"

// FromAdded returns the state of the mailbox a mailbox.added event registers.
func FromAdded(e domain.Event, d *domain.MailboxAdded) domain.MailboxStateRecord {
	return domain.MailboxStateRecord{
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
		SourceEventID:     e.Key(),
	}
}

// Disabled returns the state of mailbox m once the mailbox.disabled event e
// is folded: m with Enabled false, folded from e (the record's ce_id and
// ce_time are e's). Every other field, AddedAt included, stays.
func Disabled(m domain.MailboxStateRecord, e domain.Event) domain.MailboxStateRecord {
	m.Enabled = false
	m.SourceEventID = e.Key()
	return m
}

// Rotated returns the state of mailbox m once the credentials_rotated
// event e is folded: m with e's sealed credentials, folded from e; every
// other field (Enabled, AddedAt) stays. ok is false, and m unchanged, when
// the rotation was computed from another registration than m's (its
// added_at differs: a mailbox.added came in between).
func Rotated(m domain.MailboxStateRecord, e domain.Event, d *domain.CredentialsRotated) (domain.MailboxStateRecord, bool) {
	if !d.AddedAt.Equal(m.AddedAt) {
		return m, false
	}
	m.SealedCredentials = d.SealedCredentials
	m.SourceEventID = e.Key()
	return m, true
}

func headers(id, subject string, t time.Time) []kgo.RecordHeader {
	return topics.AttributeHeaders(domain.Event{
		ID: id, Type: domain.TypeMailboxStateRecord, Source: Source, Time: t, Subject: subject,
	})
}

// Record returns m's mailbox.state record. The partition is left to the
// producer's partitioner (murmur2 of the key). at is the ce_time: the time
// of the event the record was folded from.
func Record(topic string, m domain.MailboxStateRecord, at time.Time) (*kgo.Record, error) {
	v, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return &kgo.Record{
		Topic:   topic,
		Key:     []byte(m.MailboxID),
		Value:   v,
		Headers: headers(m.SourceEventID, m.MailboxID, at),
	}, nil
}

// Tombstone returns the mailbox.state tombstone of a removed mailbox: a
// nil value, with the removal event's id and time in the headers.
func Tombstone(topic, mailboxID, eventID string, at time.Time) *kgo.Record {
	return &kgo.Record{
		Topic:   topic,
		Key:     []byte(mailboxID),
		Headers: headers(eventID, mailboxID, at),
	}
}

// Decode reads a mailbox.state record (domain.DecodeMailboxStateRecord).
// live is false for a tombstone (m then carries only MailboxID). A record
// that does not decode or validate is an error with a domain code; Decode
// never panics.
func Decode(r *kgo.Record) (m domain.MailboxStateRecord, live bool, err error) {
	t, ok := topics.Header(r, topics.HeaderType)
	if !ok {
		t = domain.TypeMailboxStateRecord // a record without the header is taken as its topic's type
	}
	return domain.DecodeMailboxStateRecord(t, r.Key, r.Value)
}
