package mailsync

import (
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

// The sync records' types are in domain (syncrecords.go); this file writes
// and reads them on Kafka.

const (
	sourcePrefix     = "mailplane/sync/"
	maxAuditErrorLen = 500
)

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

// DecodeTierRecord reads a sync.tier record (domain.DecodeSyncTierRecord);
// ok is false for a tombstone.
func DecodeTierRecord(r *kgo.Record) (rec domain.SyncTierRecord, ok bool, err error) {
	t, found := topics.Header(r, topics.HeaderType)
	if !found {
		t = domain.TypeSyncTierRecord // a record without the header is taken as its topic's type
	}
	return domain.DecodeSyncTierRecord(t, r.Key, r.Value)
}

// truncate bounds s to n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
