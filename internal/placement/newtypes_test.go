package placement

import (
	"reflect"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// TestPlacementIgnoresDisabledAndObservations: mailbox.disabled stops sync
// only ("Placement is not affected") and warmup_observed is health evidence
// for the scorer, not a placement input. The decider decides nothing on
// either, whether the mailbox is placed, pending or unknown, leaves its state
// as it was, and does not retry pending mailboxes on them.
func TestPlacementIgnoresDisabledAndObservations(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{})
	h.hb(1, domain.TierSharedFree, domain.EgressColdSMTP)
	h.add(1, 1, domain.ProviderSMTPIMAP, false)
	h.on(1, 1)
	// Fill the worker so that the next mailbox waits, pending.
	for mb := 2; h.worker(1).Load+1000 <= h.worker(1).Capacity*1000; mb++ {
		h.add(mb, 1, domain.ProviderSMTPIMAP, false)
	}
	pending := 100
	h.add(pending, 1, domain.ProviderSMTPIMAP, false)
	h.on(pending, 0)

	since := h.now.Add(-48 * time.Hour)
	before := h.live.Snapshot()
	for _, mb := range []int{1, pending, 999} { // placed, pending, unknown
		h.advance(time.Second)
		for _, ev := range []domain.Data{
			&domain.MailboxDisabled{MailboxID: plMailbox(mb), Cause: domain.DisableAuthFailing, Reason: "AUTHENTICATIONFAILED", FailingSince: &since},
			&domain.MailboxDisabled{MailboxID: plMailbox(mb), Cause: domain.DisableOperator, Reason: "operator"},
			&domain.WarmupObserved{MailboxID: plMailbox(mb), WarmupID: "wu-1", Placement: domain.PlacedJunk, LandedAt: h.now, Source: domain.ObservedBySync, RecipientMailboxID: plMailbox(2)},
			&domain.WarmupObserved{MailboxID: plMailbox(mb), WarmupID: "wu-2", Placement: domain.PlacedInbox, LandedAt: h.now, Source: domain.ObservedByReport},
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
	h.hb(2, domain.TierSharedFree, domain.EgressColdSMTP)
	h.on(pending, 2)
}
