package placement

import (
	"time"

	"github.com/mailplane/mailplane/domain"
)

// This file is placement: finding the worker a mailbox goes to (the
// least utilised eligible one, see the package comment, Placement),
// placing, refusing and moving mailboxes, and what a worker left idle
// becomes.

// target is where a mailbox can go.
type placementTarget struct {
	worker   *placementWorker
	promote  bool // promote the idle clean worker into the band's pool first
	degraded bool // a dedicated org's mailbox on shared premium
}

// bestDedicated returns o's eligible bound worker with headroom for weight
// and the lowest utilisation, ties by id.
func (s *State) bestDedicated(o *placementOrg, weight int64, exclude *placementWorker) *placementWorker {
	var best *placementWorker
	for _, w := range o.bound {
		if w == exclude || !w.eligible() || w.headroom() < weight {
			continue
		}
		if best == nil || placementLess(w, best) {
			best = w
		}
	}
	return best
}

// findShared finds a shared worker of tier in band's pool with headroom for
// weight, or an idle clean worker of tier to promote into the pool.
func (s *State) findShared(tier domain.Tier, band domain.RiskPool, weight int64, exclude *placementWorker) placementTarget {
	c := placementClassOf(weight)
	if w := s.heaps[placementBucket(tier, band)][c].best(exclude); w != nil {
		return placementTarget{worker: w}
	}
	if band != domain.RiskClean {
		if w := s.idleClean(tier, exclude); w != nil {
			return placementTarget{worker: w, promote: true}
		}
	}
	return placementTarget{}
}

// idleClean returns the idle eligible clean worker of tier with the lowest
// id. Idle workers have utilisation 0, the heap minimum, and headroom for
// every weight.
func (s *State) idleClean(tier domain.Tier, exclude *placementWorker) *placementWorker {
	w := s.heaps[placementBucket(tier, domain.RiskClean)][placementClasses-1].best(exclude)
	if w == nil || w.count != 0 {
		return nil
	}
	return w
}

func (s *State) findTarget(o *placementOrg, weight int64, band domain.RiskPool, exclude *placementWorker) placementTarget {
	cls := o.class()
	if cls == placementDedicated {
		if w := s.bestDedicated(o, weight, exclude); w != nil {
			return placementTarget{worker: w}
		}
		t := s.findShared(domain.TierSharedPremium, band, weight, exclude)
		t.degraded = true
		return t
	}
	return s.findShared(placementSharedTier(cls), band, weight, exclude)
}

func (s *State) promoteToPool(w *placementWorker, band domain.RiskPool, at time.Time) {
	s.emit(&domain.PlacementWorkerPromoted{
		PlacementMeta: placementMeta(at, domain.ReasonPoolNeeded),
		WorkerID:      w.id, FromTier: w.tier, ToTier: w.tier, FromPool: w.pool, ToPool: band,
	})
}

// place puts a new or pending mailbox on a worker; on failure it refuses
// (when refuse) or leaves the mailbox as it is. The mailbox need not exist
// yet: probe carries its attributes.
func (s *State) place(id string, o *placementOrg, weight int64, band domain.RiskPool, reason domain.PlacementReason, refuse bool, at time.Time) bool {
	if o.shortfall() > 0 {
		s.ensureDedicated(o, at) // bind before degrading
	}
	t := s.findTarget(o, weight, band, nil)
	if t.worker == nil {
		if refuse {
			s.emit(&domain.PlacementRefused{
				PlacementMeta: placementMeta(at, domain.ReasonNoEligibleWorker),
				MailboxID:     id, OrgID: o.id, Tier: placementWantedTier(o), Band: band, Weight: weight, Cause: reason,
			})
		}
		return false
	}
	if t.promote {
		s.promoteToPool(t.worker, band, at)
	}
	s.emit(&domain.PlacementAssigned{
		PlacementMeta: placementMeta(at, reason),
		MailboxID:     id, OrgID: o.id, WorkerID: t.worker.id, Tier: t.worker.tier, Band: band, Weight: weight, Degraded: t.degraded,
	})
	return true
}

func placementWantedTier(o *placementOrg) domain.Tier {
	if o.class() == placementDedicated {
		return domain.TierDedicated
	}
	return placementSharedTier(o.class())
}

type placementMove int

const (
	moveMust    placementMove = iota // the mailbox does not fit: move or refuse
	moveDrain                        // its worker is draining: move if anything fits
	moveUpgrade                      // degraded: move only onto its org's dedicated worker
)

// relocate moves a placed mailbox per mode. fromBand is the band it was
// placed under (differs from m.band right after a band change).
func (s *State) relocate(m *placementMailbox, mode placementMove, fromBand domain.RiskPool, reason domain.PlacementReason, at time.Time) bool {
	return s.relocateWith(m, mode, fromBand, reason, nil, at)
}

// relocateWith is relocate whose move or refusal carries evidence: that of
// the health score whose band change made the mailbox move.
func (s *State) relocateWith(m *placementMailbox, mode placementMove, fromBand domain.RiskPool, reason domain.PlacementReason,
	evidence *domain.HealthEvidence, at time.Time) bool {
	from := m.worker
	if m.org.shortfall() > 0 {
		s.ensureDedicated(m.org, at) // bind before degrading
	}
	var t placementTarget
	if mode == moveUpgrade {
		t.worker = s.bestDedicated(m.org, m.weight, from)
	} else {
		t = s.findTarget(m.org, m.weight, m.band, from)
	}
	if t.worker == nil {
		if mode == moveMust {
			s.emit(&domain.PlacementRefused{
				PlacementMeta: placementMeta(at, domain.ReasonNoEligibleWorker),
				MailboxID:     m.id, OrgID: m.org.id, Tier: placementWantedTier(m.org), Band: m.band, Weight: m.weight,
				FromWorker: from.id, FromBand: fromBand, Cause: reason, Evidence: evidence,
			})
			s.afterLeave(from, at)
		}
		return false
	}
	if t.promote {
		s.promoteToPool(t.worker, m.band, at)
	}
	s.emit(&domain.PlacementMigrated{
		PlacementMeta: placementMeta(at, reason),
		MailboxID:     m.id, OrgID: m.org.id, Weight: m.weight,
		FromWorker: from.id, ToWorker: t.worker.id, FromTier: from.tier, ToTier: t.worker.tier,
		FromBand: fromBand, ToBand: m.band, Degraded: t.degraded, Evidence: evidence,
	})
	s.afterLeave(from, at)
	return true
}

// afterLeave reacts to w losing a mailbox: an idle pool worker reverts to
// clean; an idle released dedicated worker goes to the org waiting longest
// for one, else reverts to its heartbeat tier.
func (s *State) afterLeave(w *placementWorker, at time.Time) {
	if w == nil || w.count != 0 {
		return
	}
	if w.tier == domain.TierDedicated {
		if !w.releasing {
			return
		}
		if w.baseTier == domain.TierSharedPremium && w.live && !w.stopping && TakesNew(w.health) {
			if o := s.nextShortOrg(); o != nil {
				s.emit(&domain.PlacementDedicatedBound{PlacementMeta: placementMeta(at, domain.ReasonDedicatedNeeded), WorkerID: w.id, OrgID: o.id})
				s.capacityAppeared = true
				return
			}
		}
		s.emit(&domain.PlacementWorkerReverted{
			PlacementMeta: placementMeta(at, domain.ReasonIdle),
			WorkerID:      w.id, FromTier: w.tier, ToTier: w.baseTier, FromPool: w.pool, ToPool: domain.RiskClean, OrgID: w.org,
		})
		s.capacityAppeared = true
		return
	}
	if w.pool != domain.RiskClean {
		s.emit(&domain.PlacementWorkerReverted{
			PlacementMeta: placementMeta(at, domain.ReasonIdle),
			WorkerID:      w.id, FromTier: w.tier, ToTier: w.tier, FromPool: w.pool, ToPool: domain.RiskClean,
		})
		s.capacityAppeared = true
	}
}

func (s *State) drain(w *placementWorker, reason domain.PlacementReason, at time.Time) {
	for _, m := range w.mailboxesSorted() {
		if m.worker == w {
			s.relocate(m, moveDrain, m.band, reason, at)
		}
	}
	s.afterLeave(w, at)
}

func (s *State) evacuate(w *placementWorker, reason domain.PlacementReason, at time.Time) {
	for _, m := range w.mailboxesSorted() {
		if m.worker == w {
			s.relocate(m, moveMust, m.band, reason, at)
		}
	}
	s.afterLeave(w, at)
}
