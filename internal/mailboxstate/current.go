package mailboxstate

// Folding mailbox.disabled: the mailbox's current record.
//
// mailbox.added and mailbox.removed fold into a record (or a tombstone) of
// their own, but mailbox.disabled keeps the mailbox's record with Enabled
// false, so folding it needs the record the mailbox has when the event is
// folded. The processor holds no per-mailbox state (memory would grow with
// the number of mailboxes, and the dedupe changelog keeps a window, not
// every mailbox): mailbox.state itself is the store. It holds, read
// committed, exactly what the events before the committed input offsets
// made of each mailbox, since the records and the offsets are committed in
// the same transactions.
//
// So before a transaction whose batch holds mailbox.disabled records, the
// processor reads the mailbox.state partitions of those mailboxes, read
// committed, to their end as of the read (waiting for transactions still
// open on them, as the dedupe restore does), and keeps the last record of
// each of those mailboxes. While folding the batch, the batch's own outputs
// for those mailboxes (an add, a removal or a disable earlier in the same
// batch) take precedence. A mailbox without a record, or whose last record
// is a tombstone, is not registered: its mailbox.disabled changes nothing.
//
// Cost: one read of up to 1/StatePartitions of mailbox.state per distinct
// partition per batch that holds mailbox.disabled events (rare: persistent
// authentication failures, operators); batches without them read nothing.
//
// Rewinds: after the group's offsets are rewound to rebuild mailbox.state in
// place, mailbox.state also holds the records the first run wrote for the
// rewound range. A mailbox the rewound run has written no record for yet
// (its mailbox.added lies before the rewind point) is then read as the
// first run left it, so a mailbox.disabled in the rewound range may write a
// record with that later state (or, if it was later removed, nothing); the
// mailbox's later events in the range are folded again after it, so the
// mailbox's last record, when the rewound range is folded, is the same as
// the first run's. Rebuilding into a fresh topic is exact.

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

// current is a mailbox's record as the fold sees it.
type current struct {
	m    domain.MailboxStateRecord
	live bool  // false: a tombstone
	err  error // the last record does not decode
}

// batchState is what the fold of one batch knows of the mailboxes its
// mailbox.disabled events are about.
type batchState struct {
	// keys are those mailboxes.
	keys map[string]bool
	// read is their last record in mailbox.state before the batch
	// (absent: none).
	read map[string]current
	// folded is the batch's own latest output for them.
	folded map[string]current
}

// disabledKeys returns the keys (mailbox ids) of the mailbox.disabled and
// mailbox.credentials_rotated records in recs, nil if there are none. It reads headers only: a record
// that turns out not to decode is dead-lettered by the fold.
func disabledKeys(recs []*kgo.Record) map[string]bool {
	var keys map[string]bool
	for _, r := range recs {
		// Both fold into the mailbox's current record.
		if t, ok := topics.Header(r, topics.HeaderType); ok && (t == domain.TypeMailboxDisabled || t == domain.TypeCredentialsRotated) && len(r.Key) > 0 {
			if keys == nil {
				keys = map[string]bool{}
			}
			keys[string(r.Key)] = true
		}
	}
	return keys
}

// get returns mailbox id's record, ok false when it has none.
func (b *batchState) get(id string) (current, bool) {
	if b == nil {
		return current{}, false
	}
	if c, ok := b.folded[id]; ok {
		return c, true
	}
	c, ok := b.read[id]
	return c, ok
}

// set records the batch's output for mailbox id, if the batch needs it.
func (b *batchState) set(id string, c current) {
	if b == nil || !b.keys[id] {
		return
	}
	if b.folded == nil {
		b.folded = map[string]current{}
	}
	b.folded[id] = c
}

// readState returns the last mailbox.state record of each mailbox in ids
// that has one. It reads the partitions the ids hash to, read-committed, to
// their high watermark as of the call.
func (p *Processor) readState(ctx context.Context, ids map[string]bool) (map[string]current, error) {
	start := time.Now()
	var parts []int32
	pick := func(n int) []int32 {
		// The partition of a key, as the processor's producer places it
		// (partitioner: murmur2 of the key).
		place := kgo.StickyKeyPartitioner(nil).ForTopic(p.stateTopic)
		seen := map[int32]bool{}
		for id := range ids {
			part := int32(place.Partition(&kgo.Record{Key: []byte(id)}, n))
			if !seen[part] {
				seen[part] = true
				parts = append(parts, part)
			}
		}
		return parts
	}
	out := map[string]current{}
	recs, err := p.readToEnd(ctx, "state-read", p.stateTopic, pick, func(r *kgo.Record) {
		if ids[string(r.Key)] {
			m, live, err := Decode(r)
			out[string(r.Key)] = current{m: m, live: live, err: err}
		}
	})
	if err != nil {
		return nil, err
	}
	p.log.Debug("mailbox.state read for mailbox.disabled", "mailboxes", len(ids), "partitions", len(parts),
		"records_read", recs, "took", time.Since(start).Round(time.Millisecond))
	return out, nil
}
