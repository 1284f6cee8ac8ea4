package domain_test

import (
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

func TestDerivedID(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 7, 0, 0, 123e6, time.UTC)
	// Pinned: ids already on logs (placement decisions) were derived this
	// way; a change here would re-identify them.
	got := domain.DerivedID(at, "mailplane.placement.decision-id.v1", "mailplane.worker.events.v1/3/42/0190a5b2-4c5e-7b1a-9c3d-00000000d001", "2")
	if want := "01a22b40-d9fb-7e66-b271-7c129d2ad820"; got != want {
		t.Fatalf("DerivedID = %s, want %s", got, want)
	}
	if !domain.IsUUIDv7(got) {
		t.Fatalf("%s is not a UUIDv7", got)
	}
	if domain.DerivedID(at, "a", "b", "c") == domain.DerivedID(at, "a", "bc") || domain.DerivedID(at, "x", "b") == domain.DerivedID(at, "y", "b") {
		t.Fatal("different inputs gave one id")
	}
	if domain.DerivedID(time.Unix(-5, 0), "a")[:13] != "00000000-0000" {
		t.Fatal("a time before the epoch is not clamped to 0")
	}
}

func TestNewEventIDIsAnOrderedUUIDv7(t *testing.T) {
	t.Parallel()
	prev := ""
	seen := map[string]bool{}
	for i := 0; i < 20000; i++ {
		id := domain.NewEventID()
		if !domain.IsUUIDv7(id) {
			t.Fatalf("id %d %q is not a UUIDv7", i, id)
		}
		if id <= prev {
			t.Fatalf("id %d %q does not follow %q", i, id, prev)
		}
		if seen[id] {
			t.Fatalf("id %q minted twice", id)
		}
		seen[id], prev = true, id
	}
}

func TestEventKey(t *testing.T) {
	t.Parallel()
	v7 := domain.NewEventID()
	if domain.EventKey("/a", v7) != v7 {
		t.Error("a UUIDv7 id is not its own key")
	}
	const v4 = "2c5ea4c0-4067-4f5a-9a31-1c9b6f4e8d21"
	for _, id := range []string{v4, "order-4711", "ORDER-4711"} {
		k := domain.EventKey("/shop", id)
		if !domain.IsUUIDv7(k) || k == id {
			t.Errorf("key of %q is %q, want a UUIDv7 of its own", id, k)
		}
		if domain.EventKey("/shop", id) != k {
			t.Errorf("key of %q is not deterministic", id)
		}
		// CloudEvents identify an event by source and id together.
		if domain.EventKey("/billing", id) == k {
			t.Errorf("key of %q is the same from another source", id)
		}
	}
	if domain.EventKey("/shop", "order-4711") == domain.EventKey("/shop", "ORDER-4711") {
		t.Error("ids that differ by case share a key")
	}
	e := domain.Event{ID: "order-4711", Source: "/shop"}
	if e.Key() != domain.EventKey("/shop", "order-4711") {
		t.Error("Event.Key is not EventKey of its source and id")
	}
}
