package mailboxstate

// De-duplication by event id.
//
// Producers may send an event again with the same ce_id (the ingest API
// documents retries as safe), so the log can hold a mailbox.added,
// mailbox.removed or mailbox.disabled twice. Folding the copy would be wrong
// when other events of the mailbox came in between: a late copy of a
// mailbox.added after the mailbox.removed would bring the mailbox back, a
// late copy of a removal after a re-add would remove it, a late copy of a
// mailbox.disabled after the re-add that enabled the mailbox again would
// disable it. The processor therefore remembers the ids it applied and
// skips a record whose id it already applied (outcome "duplicate": no
// output, offsets still committed).
//
// The memory is bounded by a window W (default 7 days, WithDedupeWindow) in
// log time, the timestamps of the mailbox.events records:
//
//   - Per input partition, clock is the newest timestamp among the records
//     applied so far. A mailbox.added, mailbox.removed or mailbox.disabled
//     record r is a duplicate when its id was applied from a record whose
//     timestamp is at least max(clock, r.timestamp) − W. In words: a copy
//     produced within W of the original is recognised; one produced later
//     than that is applied again. Ids older than the window are forgotten.
//     Timestamps come from producer clocks, so the edge of the window moves
//     by their skew. The rule depends on the log alone, not on when or in
//     how many sessions it is folded, so a replay decides as the live run
//     did.
//   - A copy is known by its id alone: a record reusing an applied id with
//     other data is skipped as well.
//   - Only mailbox.added, mailbox.removed and mailbox.disabled ids are
//     remembered (a mailbox.disabled about a mailbox that is not registered
//     too, though it produces no record: its copy after a mailbox.added
//     must not disable that mailbox): the other types produce nothing, so
//     folding them twice changes nothing. Records sent to the DLQ are not
//     remembered either.
//   - A copy lands on the partition of its original because the record key
//     is the mailbox id (topics.Decode rejects any other key) and every
//     mailplane producer partitions by the murmur2 hash of the key. A copy
//     produced by a client with another partitioner, or after mailbox.events
//     gained partitions, can land elsewhere and is not recognised.
//
// Memory: a remembered id is a map entry of a 16-byte UUID and an 8-byte
// timestamp, about 56 bytes with the map's overhead (BenchmarkApplied, at a
// million ids). It grows with the mailbox.added, mailbox.removed and
// mailbox.disabled events of one window (plus a sixteenth: ids are swept
// every W/16), not with the number of mailboxes: a bulk import of 100,000
// mailboxes costs about 6 MB for a week, importing all 1,000,000 in one
// week about 56 MB. Health scores and the other types cost nothing.
//
// The remembered ids survive restarts and rebalances through a changelog,
// topics.MailboxStateDedupe, written in the same Kafka transaction as the
// mailbox.state records and the input offsets, so it is exactly as current
// as the committed offsets (no second system, no two-phase commit).
// Partition p of the changelog holds the ids of partition p of
// mailbox.events. Each applied id is one record keyed "<group>/<event id>"
// (value: the input offset, the input record's timestamp, the mailbox id and
// type); when the processor forgets an id it writes a tombstone for it in
// the same way, so compaction keeps the topic at about one window of ids.
// The topic's retention (30 days in the catalog) is a backstop: the guarantee
// holds while the processor lags its input by less than retention − W
// (23 days by default); ids folded longer ago than the retention are gone
// from the changelog even if a lagging processor still needs them.
//
// On the first records of a partition in a session (a new assignment, a
// restart, or after an aborted transaction), the processor reads that
// changelog partition from its start to its end, read-committed, before
// folding anything, waiting for transactions still open on it (a
// predecessor's) to end. Entries are namespaced by consumer group, so a
// rebuild under a new group starts empty; and entries (and tombstones)
// written for input offsets at or after the position the partition resumes
// from are ignored, so rewinding the group's offsets (to zero, to rebuild
// mailbox.state) folds the rewound events again instead of taking them for
// duplicates. After a partial rewind, an id whose earlier changelog record
// compaction already replaced by a later one is forgotten; the rewound
// range then recognises copies of it only from their first re-application.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
)

// DefaultDedupeWindow is how long, in log time, the processor remembers the
// id of an event it applied.
const DefaultDedupeWindow = 7 * 24 * time.Hour

// headerEvictedAt, on a changelog tombstone, is the input offset whose
// transaction forgot the id.
const headerEvictedAt = "mailplane_evicted_at_offset"

// applied is the dedupe state of one input partition.
type applied struct {
	// ids maps an applied event id to the timestamp (Unix ms) of the
	// record it was applied from.
	ids map[uuid.UUID]int64
	// clock is the newest timestamp (Unix ms) among the applied records.
	// It is the maximum of ids' values, ids never forgetting the newest.
	clock int64
	// nextSweep is the clock at which the next sweep forgets old ids.
	nextSweep int64
}

func newApplied() *applied { return &applied{ids: map[uuid.UUID]int64{}} }

// seen reports whether id was applied from a record within window of a
// record at ts.
func (a *applied) seen(id uuid.UUID, ts, window int64) bool {
	at, ok := a.ids[id]
	return ok && at >= max(a.clock, ts)-window
}

// add remembers id, applied from a record at ts.
func (a *applied) add(id uuid.UUID, ts int64) {
	a.ids[id] = ts
	a.clock = max(a.clock, ts)
}

// sweep forgets the ids that left the window and returns them, sorted. It
// runs at most once per every of clock, so that forgetting costs one pass
// over the map per every rather than per transaction; ids live at most
// window+every.
func (a *applied) sweep(window, every int64) []uuid.UUID {
	if a.clock < a.nextSweep {
		return nil
	}
	a.nextSweep = a.clock + every
	horizon := a.clock - window
	var out []uuid.UUID
	for id, at := range a.ids {
		if at < horizon {
			out = append(out, id)
		}
	}
	for _, id := range out {
		delete(a.ids, id)
	}
	slices.SortFunc(out, func(x, y uuid.UUID) int { return bytes.Compare(x[:], y[:]) })
	return out
}

// entry is the value of a changelog record.
type entry struct {
	// Offset is the mailbox.events offset the event was applied from.
	Offset int64 `json:"offset"`
	// LogTime is that record's timestamp, Unix ms.
	LogTime   int64  `json:"log_time_ms"`
	MailboxID string `json:"mailbox_id"`
	Type      string `json:"type"`
}

func changelogKey(group string, id uuid.UUID) []byte {
	return []byte(group + "/" + id.String())
}

// parseChangelogKey splits a changelog key into its group and event id.
func parseChangelogKey(k []byte) (group string, id uuid.UUID, ok bool) {
	s := string(k)
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return "", uuid.UUID{}, false
	}
	id, err := uuid.Parse(s[i+1:])
	if err != nil {
		return "", uuid.UUID{}, false
	}
	return s[:i], id, true
}

// changelogRecord remembers that e, read from r, was applied.
func changelogRecord(topic, group string, id uuid.UUID, e domain.Event, r *kgo.Record) *kgo.Record {
	v, _ := json.Marshal(entry{Offset: r.Offset, LogTime: r.Timestamp.UnixMilli(), MailboxID: e.Subject, Type: e.Type})
	return &kgo.Record{Topic: topic, Partition: r.Partition, Key: changelogKey(group, id), Value: v}
}

// changelogTombstone forgets id; at is the input offset whose transaction
// forgot it.
func changelogTombstone(topic, group string, partition int32, id uuid.UUID, at int64) *kgo.Record {
	return &kgo.Record{
		Topic: topic, Partition: partition, Key: changelogKey(group, id),
		Headers: []kgo.RecordHeader{{Key: headerEvictedAt, Value: strconv.AppendInt(nil, at, 10)}},
	}
}

// replay applies one changelog record of group to a, for a partition that
// resumes at input offset resume: entries and tombstones written for input
// offsets at or after resume belong to a future that was rewound, and are
// ignored.
func (a *applied) replay(group string, r *kgo.Record, resume int64) {
	g, id, ok := parseChangelogKey(r.Key)
	if !ok || g != group {
		return
	}
	if r.Value == nil {
		for _, h := range r.Headers {
			if h.Key == headerEvictedAt {
				if at, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil && at >= resume {
					return
				}
			}
		}
		delete(a.ids, id)
		return
	}
	var e entry
	if err := json.Unmarshal(r.Value, &e); err != nil || e.Offset >= resume {
		return
	}
	a.ids[id] = e.LogTime
}

// finish sets the clock after a replay: the newest applied timestamp, which
// is never forgotten.
func (a *applied) finish() {
	for _, at := range a.ids {
		a.clock = max(a.clock, at)
	}
	a.nextSweep = 0 // sweep on the next transaction
}

// restore reads the changelog partitions of the input partitions in resume
// (partition → the input offset it resumes from) and returns their dedupe
// state. It reads each partition to the high watermark as of the call, in
// read-committed mode, so it sees every transaction that ended before and
// waits for those still open.
func (p *Processor) restore(ctx context.Context, resume map[int32]int64) (map[int32]*applied, error) {
	start := time.Now()
	out := make(map[int32]*applied, len(resume))
	for part := range resume {
		out[part] = newApplied()
	}
	pick := func(int) []int32 { return keys(resume) }
	n, err := p.readToEnd(ctx, "restore", p.dedupeTopic, pick, func(r *kgo.Record) {
		out[r.Partition].replay(p.cfg.group.Group, r, resume[r.Partition])
	})
	if err != nil {
		return nil, fmt.Errorf("restore (%s must have as many partitions as %s): %w", p.dedupeTopic, p.eventsTopic, err)
	}
	ids := 0
	for _, a := range out {
		a.finish()
		ids += len(a.ids)
	}
	p.log.Info("dedupe state restored", "partitions", keys(resume), "changelog_records", n, "ids", ids, "took", time.Since(start).Round(time.Millisecond))
	return out, nil
}

func keys[V any](m map[int32]V) []int32 {
	out := make([]int32, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
