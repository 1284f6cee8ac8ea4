package domain

import (
	"reflect"
	"testing"
	"time"
)

// TestPlacementIgnoresDisabledAndObservations: mailbox.disabled stops sync
// only ("Placement is not affected") and warmup_observed is health evidence
// for the scorer, not a placement input. The decider decides nothing on
// either, whether the mailbox is placed, pending or unknown, leaves its state
// as it was, and does not retry pending mailboxes on them.
func TestPlacementIgnoresDisabledAndObservations(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, PlacementConfig{})
	h.hb(1, TierSharedFree, EgressColdSMTP)
	h.add(1, 1, ProviderSMTPIMAP, false)
	h.on(1, 1)
	// Fill the worker so that the next mailbox waits, pending.
	for mb := 2; h.worker(1).Load+1000 <= h.worker(1).Capacity*1000; mb++ {
		h.add(mb, 1, ProviderSMTPIMAP, false)
	}
	pending := 100
	h.add(pending, 1, ProviderSMTPIMAP, false)
	h.on(pending, 0)

	since := h.now.Add(-48 * time.Hour)
	before := h.live.Snapshot()
	for _, mb := range []int{1, pending, 999} { // placed, pending, unknown
		h.advance(time.Second)
		for _, ev := range []Data{
			&MailboxDisabled{MailboxID: plMailbox(mb), Cause: DisableAuthFailing, Reason: "AUTHENTICATIONFAILED", FailingSince: &since},
			&MailboxDisabled{MailboxID: plMailbox(mb), Cause: DisableOperator, Reason: "operator"},
			&WarmupObserved{MailboxID: plMailbox(mb), WarmupID: "wu-1", Placement: PlacedJunk, LandedAt: h.now, Source: ObservedBySync, RecipientMailboxID: plMailbox(2)},
			&WarmupObserved{MailboxID: plMailbox(mb), WarmupID: "wu-2", Placement: PlacedInbox, LandedAt: h.now, Source: ObservedByReport},
		} {
			if ds := h.apply(ev); len(ds) != 0 {
				t.Fatalf("%s for mailbox %d decided %v", ev.EventType(), mb, plTypes(ds))
			}
		}
	}
	if after := h.live.Snapshot(); !reflect.DeepEqual(before, after) {
		t.Fatalf("state changed:\nbefore %s\nafter  %s", plJSON(before), plJSON(after))
	}
	h.on(1, 1)
	h.on(pending, 0)
	// The pending queue is intact: capacity appearing places the mailbox.
	h.hb(2, TierSharedFree, EgressColdSMTP)
	h.on(pending, 2)
}
