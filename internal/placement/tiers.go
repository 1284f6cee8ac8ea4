package placement

import (
	"slices"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// This file is tiers and dedicated workers: an org's plan, the workers
// bound to dedicated orgs, the orgs short of them and the releases (see
// the package comment, Tiers and Dedicated).

// shortOrgs returns the orgs short of dedicated workers, longest waiting
// (earliest plan) first, ties by id.
func (s *State) shortOrgs() []*placementOrg {
	var out []*placementOrg
	for _, o := range s.dedicatedOrgs {
		if o.shortfall() > 0 {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b *placementOrg) int {
		if c := a.planSince.Compare(b.planSince); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	return out
}

func (s *State) nextShortOrg() *placementOrg {
	var best *placementOrg
	for _, o := range s.dedicatedOrgs {
		if o.shortfall() == 0 {
			continue
		}
		if best == nil || o.planSince.Before(best.planSince) || (o.planSince.Equal(best.planSince) && o.id < best.id) {
			best = o
		}
	}
	return best
}

// ensureDedicated binds workers until o has as many as its plan says, or
// nothing is left to bind.
func (s *State) ensureDedicated(o *placementOrg, at time.Time) {
	if o == nil {
		return
	}
	for o.shortfall() > 0 {
		// 1. one of o's own released workers still draining: cancel the release.
		var own *placementWorker
		for _, w := range s.draining {
			if w.tier == domain.TierDedicated && w.releasing && w.org == o.id && w.baseTier == domain.TierSharedPremium &&
				w.live && !w.stopping && TakesNew(w.health) && (own == nil || w.id < own.id) {
				own = w
			}
		}
		if own != nil {
			s.emit(&domain.PlacementDedicatedBound{PlacementMeta: placementMeta(at, domain.ReasonDedicatedNeeded), WorkerID: own.id, OrgID: o.id})
			continue
		}
		// 2. an idle shared premium worker, promoted. (Idle released workers
		// never persist: afterLeave hands them out or reverts them.)
		w := s.idleClean(domain.TierSharedPremium, nil)
		if w == nil {
			return
		}
		s.emit(&domain.PlacementWorkerPromoted{
			PlacementMeta: placementMeta(at, domain.ReasonDedicatedNeeded),
			WorkerID:      w.id, FromTier: w.tier, ToTier: domain.TierDedicated, FromPool: w.pool, ToPool: domain.RiskClean, OrgID: o.id,
		})
		s.emit(&domain.PlacementDedicatedBound{PlacementMeta: placementMeta(at, domain.ReasonDedicatedNeeded), WorkerID: w.id, OrgID: o.id})
	}
}

// release releases a bound dedicated worker; the caller moves its mailboxes.
func (s *State) release(w *placementWorker, reason domain.PlacementReason, at time.Time) {
	s.emit(&domain.PlacementDedicatedReleased{PlacementMeta: placementMeta(at, reason), WorkerID: w.id, OrgID: w.org})
}

func (s *State) planChanged(e *domain.OrgPlanChanged, at time.Time) {
	if o := s.orgs[e.OrgID]; o != nil && o.recorded && o.plan == e.Plan && o.dedicated == e.DedicatedWorkers && o.paid == e.Paid {
		return // nothing changes
	}
	s.emit(&domain.PlacementPlanRecorded{
		PlacementMeta: placementMeta(at, domain.ReasonPlanChanged),
		OrgID:         e.OrgID, Plan: e.Plan, DedicatedWorkers: e.DedicatedWorkers, Paid: e.Paid, Source: e.Source,
	})
	o := s.orgs[e.OrgID]
	// Release surplus dedicated workers, least loaded first.
	keep := 0
	if o.class() == placementDedicated {
		keep = o.dedicated
	}
	var released []*placementWorker
	if len(o.bound) > keep {
		bound := make([]*placementWorker, 0, len(o.bound))
		for _, w := range o.bound {
			bound = append(bound, w)
		}
		slices.SortFunc(bound, func(a, b *placementWorker) int {
			if a.load != b.load {
				if a.load < b.load {
					return -1
				}
				return 1
			}
			return strings.Compare(a.id, b.id)
		})
		released = bound[:len(bound)-keep]
		for _, w := range released {
			s.release(w, domain.ReasonPlanChanged, at)
		}
	}
	s.ensureDedicated(o, at)
	// Every mailbox of the org, in one ordered sequence.
	for _, m := range o.mailboxesSorted() {
		w := m.worker
		switch {
		case w == nil:
			s.place(m.id, o, m.weight, m.band, domain.ReasonPlanChanged, false, at)
		case !s.fits(m, w):
			s.relocate(m, moveMust, m.band, domain.ReasonPlanChanged, at)
		case !s.preferred(m, w):
			mode := moveDrain
			if w.live && !w.stopping && !w.releasing {
				mode = moveUpgrade
			}
			s.relocate(m, mode, m.band, domain.ReasonPlanChanged, at)
		}
	}
	for _, w := range released {
		s.afterLeave(w, at)
	}
}
