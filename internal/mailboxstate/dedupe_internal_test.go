package mailboxstate

import (
	"encoding/binary"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

func fixedID(n uint64) uuid.UUID {
	var u uuid.UUID
	binary.BigEndian.PutUint64(u[8:], n)
	u[6], u[8] = 0x70, u[8]&0x3f|0x80
	return u
}

// TestAppliedWindow checks the rule: a copy is recognised while its
// original's timestamp is within the window of the newest applied one and
// of the copy's own.
func TestAppliedWindow(t *testing.T) {
	t.Parallel()
	const w = 1000
	a := newApplied()
	x, y, z := fixedID(1), fixedID(2), fixedID(3)
	a.add(x, 10_000)
	if !a.seen(x, 10_500, w) || !a.seen(x, 11_000, w) || !a.seen(x, 9_000, w) {
		t.Fatal("a copy within the window is not recognised")
	}
	if a.seen(x, 11_001, w) {
		t.Fatal("a copy beyond the window is recognised")
	}
	if a.seen(y, 10_000, w) {
		t.Fatal("an id never applied is recognised")
	}
	// Newer applied records move the clock: x's copy, even one dated
	// early, is now beyond the window.
	a.add(y, 12_000)
	if a.seen(x, 10_000, w) || !a.seen(y, 10_000, w) {
		t.Fatal("the clock does not follow the newest applied record")
	}
	// The first sweep runs at once and forgets x only.
	if got := a.sweep(w, 100); !slices.Equal(got, []uuid.UUID{x}) {
		t.Fatalf("sweep forgot %v, want x", got)
	}
	// The next one waits for the clock to move by every.
	a.add(z, 12_050)
	if got := a.sweep(w, 100); got != nil {
		t.Fatalf("early sweep forgot %v", got)
	}
	a.add(z, 13_100)
	if got := a.sweep(w, 100); !slices.Equal(got, []uuid.UUID{y}) {
		t.Fatalf("sweep forgot %v, want y", got)
	}
	if len(a.ids) != 1 {
		t.Fatalf("%d ids remembered, want 1", len(a.ids))
	}
}

// TestChangelogReplay checks the restore of one partition from changelog
// records: other groups are ignored, tombstones forget, re-applications
// overwrite, and what was written for offsets at or after the resume point
// (a rewound future) is ignored.
func TestChangelogReplay(t *testing.T) {
	t.Parallel()
	const group = "g"
	t0 := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	in := func(off int64, d time.Duration) *kgo.Record {
		return &kgo.Record{Partition: 3, Offset: off, Timestamp: t0.Add(d)}
	}
	ev := func(id uuid.UUID) domain.Event {
		return domain.Event{ID: id.String(), Type: domain.TypeMailboxAdded, Subject: "m"}
	}
	a, b, c, d := fixedID(1), fixedID(2), fixedID(3), fixedID(4)
	log := []*kgo.Record{
		changelogRecord(topics.MailboxStateDedupe, group, a, ev(a), in(10, 0)),
		changelogRecord(topics.MailboxStateDedupe, "other", b, ev(b), in(11, time.Second)),
		changelogRecord(topics.MailboxStateDedupe, group, b, ev(b), in(12, 2*time.Second)),
		changelogRecord(topics.MailboxStateDedupe, group, c, ev(c), in(13, 3*time.Second)),
		changelogTombstone(topics.MailboxStateDedupe, group, 3, c, 14),
		changelogRecord(topics.MailboxStateDedupe, group, a, ev(a), in(20, 10*time.Second)), // re-applied beyond the window
		changelogRecord(topics.MailboxStateDedupe, group, d, ev(d), in(30, 20*time.Second)),
		changelogTombstone(topics.MailboxStateDedupe, group, 3, b, 31),
	}
	for _, r := range log {
		if r.Partition != 3 || r.Topic == "" {
			t.Fatalf("changelog record %s on %s/%d", r.Key, r.Topic, r.Partition)
		}
	}
	restore := func(resume int64) map[uuid.UUID]int64 {
		s := newApplied()
		for _, r := range log {
			s.replay(group, r, resume)
		}
		s.finish()
		return s.ids
	}
	ms := func(d time.Duration) int64 { return t0.Add(d).UnixMilli() }
	for _, tc := range []struct {
		resume int64
		want   map[uuid.UUID]int64
	}{
		{100, map[uuid.UUID]int64{a: ms(10 * time.Second), d: ms(20 * time.Second)}},
		{31, map[uuid.UUID]int64{a: ms(10 * time.Second), b: ms(2 * time.Second), d: ms(20 * time.Second)}},
		{25, map[uuid.UUID]int64{a: ms(10 * time.Second), b: ms(2 * time.Second)}},
		// a's re-application at 20 is rewound: a is remembered from its
		// first application (while compaction has not removed that record).
		{15, map[uuid.UUID]int64{a: ms(0), b: ms(2 * time.Second)}},
		{13, map[uuid.UUID]int64{a: ms(0), b: ms(2 * time.Second)}},
		{0, map[uuid.UUID]int64{}},
	} {
		got := restore(tc.resume)
		if len(got) != len(tc.want) {
			t.Errorf("resume %d: %v, want %v", tc.resume, got, tc.want)
			continue
		}
		for id, at := range tc.want {
			if got[id] != at {
				t.Errorf("resume %d: %s at %d, want %d", tc.resume, id, got[id], at)
			}
		}
	}
}

func TestChangelogKey(t *testing.T) {
	t.Parallel()
	id := fixedID(42)
	g, got, ok := parseChangelogKey(changelogKey("a/b", id))
	if !ok || g != "a/b" || got != id {
		t.Fatalf("parsed %q %s %v", g, got, ok)
	}
	for _, k := range []string{"", "no-slash", "g/not-a-uuid"} {
		if _, _, ok := parseChangelogKey([]byte(k)); ok {
			t.Errorf("%q parsed", k)
		}
	}
}

// BenchmarkApplied measures the memory of remembered ids: the bytes/id
// metric is what one mailbox.added or mailbox.removed in the window costs.
func BenchmarkApplied(b *testing.B) {
	const n = 1_000_000
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		a := newApplied()
		for i := range uint64(n) {
			a.add(fixedID(i), int64(i))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/id")
		runtime.KeepAlive(a)
	}
}
