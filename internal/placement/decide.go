package placement

import (
	"fmt"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// This file is the decider's entry: Apply takes one input (an event or a
// tick), dispatches it and returns the decisions, each folded through
// ApplyDecision as it is emitted; and the mailbox events (added, removed).

// Input is one input to the decider: a domain event's data with the
// time the log appended it (TrustedTime of the record timestamp, not the
// producer's ce_time), or a tick when Event is nil. At is the decider's
// clock for this input; the decisions record it.
type Input struct {
	At    time.Time
	Event domain.Data
}

// EventInput makes an input from a domain event whose record the
// log stamped logged, decided when the engine's clock reads now.
func EventInput(e domain.Event, logged, now time.Time) Input {
	return Input{At: domain.TrustedTime(logged, now), Event: e.Data}
}

// Tick makes a tick input: liveness expiry and retries of pending
// placements, drains and dedicated shortfalls.
func Tick(now time.Time) Input { return Input{At: now} }

// Apply decides on one input and returns the decisions, each already folded
// into s. Apply trusts its input to be validated (the engine validates
// events before they reach the log); events about unknown mailboxes or
// workers, duplicates and stale heartbeats decide nothing.
func (s *State) Apply(in Input) []domain.PlacementDecision {
	s.out = nil
	s.capacityAppeared = false
	at := in.At.Round(0).UTC()
	switch e := in.Event.(type) {
	case nil:
		s.tick(at)
	case *domain.MailboxAdded:
		s.mailboxAdded(e, at)
	case *domain.MailboxRemoved:
		s.mailboxRemoved(e, at)
	case *domain.MailboxHealthScored:
		s.healthScored(e, at)
	case *domain.OrgPlanChanged:
		s.planChanged(e, at)
	case *domain.WorkerHeartbeat:
		s.heartbeat(e, at)
	case *domain.WorkerHealthSampled:
		s.healthSampled(e, at)
	}
	if s.capacityAppeared {
		s.retry(at)
	}
	out := s.out
	s.out = nil
	return out
}

func (s *State) emit(d domain.PlacementDecision) {
	if err := s.ApplyDecision(d); err != nil {
		panic(fmt.Sprintf("placement: decider emitted an inconsistent decision %s: %v", d.EventType(), err))
	}
	s.out = append(s.out, d)
}

func placementMeta(at time.Time, r domain.PlacementReason) domain.PlacementMeta {
	return domain.PlacementMeta{At: at, Reason: r}
}

func (s *State) mailboxAdded(e *domain.MailboxAdded, at time.Time) {
	if _, ok := s.mailboxes[e.MailboxID]; ok {
		return // idempotent: the mailbox is already known
	}
	o := s.orgs[e.OrgID]
	if o == nil {
		o = &placementOrg{id: e.OrgID} // unknown org: free; created by the fold
	} else {
		s.ensureDedicated(o, at)
	}
	s.place(e.MailboxID, o, Weight(e.Provider, e.WarmupEnabled), domain.RiskClean, domain.ReasonMailboxAdded, true, at)
}

func (s *State) mailboxRemoved(e *domain.MailboxRemoved, at time.Time) {
	m := s.mailboxes[e.MailboxID]
	if m == nil {
		return
	}
	from := m.worker
	d := &domain.PlacementUnassigned{
		PlacementMeta: placementMeta(at, domain.ReasonMailboxRemoved),
		MailboxID:     m.id, OrgID: m.org.id, Band: m.band, Weight: m.weight, Detail: e.Reason,
	}
	if from != nil {
		d.WorkerID = from.id
	}
	s.emit(d)
	s.afterLeave(from, at)
}
