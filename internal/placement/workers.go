package placement

import (
	"time"

	"github.com/mailplane/mailplane/domain"
)

// This file is the worker events: heartbeats (registration, changes, the
// tier dwell, stopping) and health samples.

func (s *State) heartbeat(e *domain.WorkerHeartbeat, at time.Time) {
	tier := e.EffectiveTier()
	if !domain.ClientRequestableTier(tier) {
		return // dedicated is never accepted from a worker
	}
	w := s.workers[e.WorkerID]
	if w == nil {
		s.emit(&domain.PlacementWorkerRegistered{
			PlacementMeta: placementMeta(at, domain.ReasonWorkerRegistered),
			WorkerID:      e.WorkerID, Tier: tier, Egress: e.Egress, Address: e.Address, Stopping: e.Stopping,
			Capacity: Capacity(e.Egress, domain.HealthHealthy, at, at),
		})
		s.capacityAppeared = s.workers[e.WorkerID].offer() > 0
		return
	}
	if at.Before(w.heard) {
		return // stale
	}
	if tier != w.baseTier && w.live && at.Before(w.tierHeldUntil) {
		// Within the tier dwell: the change is not honoured now (a worker
		// flipping its tier would move its mailboxes on every heartbeat);
		// asked again after the dwell, it is.
		tier = w.baseTier
	}
	capacity := Capacity(e.Egress, w.health, w.firstSeen, at)
	tierChanged := tier != w.baseTier
	var reason domain.PlacementReason
	switch {
	case !w.live:
		reason = domain.ReasonWorkerRevived
	case tierChanged:
		reason = domain.ReasonWorkerTierChanged
	case e.Stopping && !w.stopping:
		reason = domain.ReasonWorkerStopping
	case !e.Stopping && w.stopping:
		reason = domain.ReasonWorkerResumed
	case e.Egress != w.egress || e.Address != w.address:
		reason = domain.ReasonWorkerChanged
	case capacity != w.capacity:
		reason = domain.ReasonCapacityRamp
	default:
		// Heard, not recorded: liveness is not a decision.
		w.heard = at
		s.reindexSeen(w)
		return
	}
	before := w.offer()
	wasStopping := w.stopping
	changed := &domain.PlacementWorkerChanged{
		PlacementMeta: placementMeta(at, reason),
		WorkerID:      w.id, Tier: tier, Egress: e.Egress, Address: e.Address, Stopping: e.Stopping, Capacity: capacity,
	}
	if tierChanged && s.cfg.TierDwell > 0 {
		changed.TierHeldUntil = at.Add(s.cfg.TierDwell)
	}
	s.emit(changed)
	switch {
	case w.tier == domain.TierDedicated && !w.releasing && (tierChanged || e.Stopping):
		org := s.orgs[w.org]
		r := domain.ReasonWorkerTierChanged
		if !tierChanged {
			r = domain.ReasonWorkerStopping
		}
		s.release(w, r, at)
		s.ensureDedicated(org, at)
		s.drain(w, r, at)
	case tierChanged:
		s.evacuate(w, domain.ReasonWorkerTierChanged, at)
	case e.Stopping && !wasStopping:
		s.drain(w, domain.ReasonWorkerStopping, at)
	}
	if w.offer() > before || (tierChanged && w.offer() > 0) {
		s.capacityAppeared = true
	}
}

func (s *State) healthSampled(e *domain.WorkerHealthSampled, at time.Time) {
	w := s.workers[e.WorkerID]
	if w == nil {
		return
	}
	h := s.cfg.WorkerHealth(w.health, e)
	capacity := Capacity(w.egress, h, w.firstSeen, at)
	if h == w.health && capacity == w.capacity {
		return
	}
	before := w.offer()
	s.emit(&domain.PlacementWorkerHealthChanged{
		PlacementMeta: placementMeta(at, domain.ReasonHealthSampled),
		WorkerID:      w.id, FromHealth: w.health, Health: h, Capacity: capacity,
		WindowSeconds: e.WindowSeconds, Sends: e.Sends, HardBounces: e.HardBounces, Complaints: e.Complaints,
	})
	if w.offer() > before {
		s.capacityAppeared = true
	}
}
