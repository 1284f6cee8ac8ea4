package engine

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

func TestDecisionID(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 12, 0, 0, 123_456_789, time.UTC)
	id := DecisionID(at, "event/x/1/2/e", 0)
	if !domain.IsUUIDv7(id) {
		t.Fatalf("%s is not a lower-case UUIDv7", id)
	}
	u, err := uuid.Parse(id)
	if err != nil || u.Version() != 7 || u.Variant() != uuid.RFC4122 {
		t.Fatalf("%s: version %d variant %v err %v", id, u.Version(), u.Variant(), err)
	}
	if ms := u.Time(); time.Unix(ms.UnixTime()).UnixMilli() != at.UnixMilli() {
		sec, nsec := ms.UnixTime()
		t.Fatalf("embedded time %s, want %s", time.Unix(sec, nsec).UTC(), at.Truncate(time.Millisecond))
	}
	if DecisionID(at, "event/x/1/2/e", 0) != id {
		t.Fatal("not deterministic")
	}
	seen := map[string]bool{id: true}
	for _, other := range []string{
		DecisionID(at, "event/x/1/2/e", 1),
		DecisionID(at, "event/x/1/3/e", 0),
		DecisionID(at.Add(time.Millisecond), "event/x/1/2/e", 0),
	} {
		if seen[other] {
			t.Fatalf("collision: %s", other)
		}
		seen[other] = true
	}
	// Ids sort by time, as UUIDv7s do.
	if later := DecisionID(at.Add(time.Second), "a", 0); later <= id {
		t.Fatalf("%s does not sort after %s", later, id)
	}
	if z := DecisionID(time.Unix(-5, 0), "k", 0); !domain.IsUUIDv7(z) || z[:13] != "00000000-0000" {
		t.Fatalf("pre-epoch time: %s", z)
	}
}

func TestCauseKey(t *testing.T) {
	t.Parallel()
	ev := topics.Cause{ID: "e1", Type: domain.TypeMailboxAdded, Topic: topics.MailboxEvents, Partition: 3, Offset: 9}
	same := ev
	same.Index, same.Count = 2, 5
	if CauseKey(ev, t0, "x") != CauseKey(same, t0.Add(time.Hour), "y") {
		t.Fatal("an event's key must depend only on its position and id")
	}
	dup := ev
	dup.Offset = 10 // the same event id published twice
	if CauseKey(ev, t0, "") == CauseKey(dup, t0, "") {
		t.Fatal("two records of one event id must have different keys")
	}
	tick := topics.Cause{ID: topics.CauseTick, Type: topics.CauseTick}
	if CauseKey(tick, t0, "a") == CauseKey(tick, t0, "b") || CauseKey(tick, t0, "a") == CauseKey(tick, t0.Add(1), "a") {
		t.Fatal("a tick's key must depend on its time and the last decision")
	}
}
