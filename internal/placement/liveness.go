package placement

import (
	"slices"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// This file is liveness and retention: the tick that declares silent
// workers dead, the grace after a takeover, the liveness hold, and the
// forgetting of long-dead workers (see the package comment, Liveness,
// Liveness hold and Retention).

// GrantLiveness grants every live worker a whole LivenessWindow from at
// before it can die. An engine calls it with its own clock when it takes
// over a state restored from the log: the log records transitions, not the
// heartbeats that changed nothing, so a restored worker's last heartbeat is
// unknown and a tick must not take its recorded one for it.
func (s *State) GrantLiveness(at time.Time) {
	at = at.Round(0).UTC()
	s.grant(at)
	s.takeover = maxTime(s.takeover, at)
}

func (s *State) grant(at time.Time) {
	if at.After(s.graceFrom) {
		s.graceFrom = at
	}
}

func (s *State) tick(at time.Time) {
	// Live workers whose last heartbeat is more than LivenessWindow old,
	// once the grace granted has run a whole window.
	var dead []*placementWorker
	if cutoff := at.Add(-s.cfg.LivenessWindow); cutoff.After(s.graceFrom) {
		dead = s.liveBySeen.before(cutoff)
	}
	expiring := len(dead) > 0
	// The workers silent through the last hold die first, before a new
	// hold can begin at this tick: the resume granted them their window,
	// and a hold entered again whenever it ran out (heartbeats cut in a
	// loop) would spare them for ever.
	if doomed := s.silentThroughHold(dead); len(doomed) > 0 {
		s.die(doomed, at)
		dead = slices.DeleteFunc(dead, func(w *placementWorker) bool { return !w.live })
	}
	if s.holdLiveness(at, expiring) {
		dead = nil
	}
	s.die(dead, at)
	s.forget(at)
	s.retry(at)
}

// silentThroughHold returns the workers of dead not heard since the last
// hold began (or since this engine took over, when later), once that hold
// has ended on this engine: holdLiveness does not count them as silent.
func (s *State) silentThroughHold(dead []*placementWorker) []*placementWorker {
	lv := s.liveness
	if lv.Holding || lv.ResumedAt.IsZero() || s.takeover.After(lv.ResumedAt) {
		return nil
	}
	anchor := maxTime(lv.HeldSince, s.takeover)
	var out []*placementWorker
	for _, w := range dead {
		if !w.heard.After(anchor) {
			out = append(out, w)
		}
	}
	return out
}

// die declares the workers dead (ordered by id) and moves their mailboxes.
func (s *State) die(dead []*placementWorker, at time.Time) {
	slices.SortFunc(dead, func(a, b *placementWorker) int { return strings.Compare(a.id, b.id) })
	for _, w := range dead {
		// Last seen: its last heartbeat heard, or the grace granted when
		// that is later, so that an engine that restored the log and one
		// that heard the heartbeats itself record the same death.
		s.emit(&domain.PlacementWorkerDied{PlacementMeta: placementMeta(at, domain.ReasonHeartbeatExpired), WorkerID: w.id, LastSeen: maxTime(w.heard, s.graceFrom)})
		if w.tier == domain.TierDedicated && !w.releasing {
			org := s.orgs[w.org]
			s.release(w, domain.ReasonWorkerDied, at)
			s.ensureDedicated(org, at)
		}
		s.evacuate(w, domain.ReasonWorkerDied, at)
	}
}

// holdLiveness decides the liveness hold at a tick (expiring: some live
// worker's window ran out) and reports whether this tick declares no
// death.
//
// Not holding, it holds when at least LivenessHoldMinWorkers are live and
// at least LivenessHoldPermille of them were not heard for half a window:
// a fleet falling silent within one window is more likely the engine's
// view of it failing (the API, Postgres, the network) than the fleet
// dying. Workers not heard during the last hold do not count as silent
// (they were given their window when it ended, and die).
//
// Holding, a worker counts as silent until it is heard after the hold
// began (or after this engine took over, when later: it has heard
// nothing before) and within a window. The hold ends
// when the silent share falls below the threshold, or when it has lasted
// LivenessHoldMax; the fold of that decision grants every live worker a
// whole window from then, so those still silent die a window later, as
// after a takeover. The decisions record the counts and the threshold;
// the fold reads no heard time and no configuration.
func (s *State) holdLiveness(at time.Time, expiring bool) bool {
	live := int64(len(s.liveBySeen.items))
	threshold := s.cfg.LivenessHoldPermille
	lv := s.liveness
	if lv.Holding {
		if live == 0 {
			return true // (no death during a hold: never so)
		}
		anchor := maxTime(lv.HeldSince, s.takeover)
		silent := int64(s.liveBySeen.countBefore(maxTime(anchor.Add(time.Nanosecond), at.Add(-s.cfg.LivenessWindow))))
		reason := domain.ReasonHeartbeatsResumed
		switch {
		case s.cfg.LivenessHoldMax > 0 && at.Sub(lv.HeldSince) >= s.cfg.LivenessHoldMax:
			reason = domain.ReasonLivenessHoldExpired
		case silent*1000 >= threshold*live:
			return true
		}
		s.emit(&domain.PlacementLivenessResumed{
			PlacementMeta: placementMeta(at, reason), Scope: domain.LivenessScopeFleet,
			Silent: silent, Live: live, SharePermille: permille(silent, live), ThresholdPermille: threshold, HeldSince: lv.HeldSince,
		})
		return true
	}
	if !expiring || live < int64(s.cfg.LivenessHoldMinWorkers) {
		return false
	}
	// A worker expiring means the grace ended over a window ago, so a
	// worker's heard time alone says whether it is silent.
	silent := int64(s.liveBySeen.countBefore(at.Add(-s.cfg.LivenessWindow / 2)))
	if !lv.ResumedAt.IsZero() && !s.takeover.After(lv.ResumedAt) {
		// Silent through the hold: not heard after it began, or after
		// this engine took over when later. (An engine that took over
		// since the hold ended knows no heartbeat of it: it excludes none.)
		silent -= int64(s.liveBySeen.countBefore(maxTime(lv.HeldSince, s.takeover).Add(time.Nanosecond)))
	}
	if silent*1000 < threshold*live {
		return false
	}
	s.emit(&domain.PlacementLivenessHeld{
		PlacementMeta: placementMeta(at, domain.ReasonFleetSilent), Scope: domain.LivenessScopeFleet,
		Silent: silent, Live: live, SharePermille: permille(silent, live), ThresholdPermille: threshold,
		MinWorkers: int64(s.cfg.LivenessHoldMinWorkers),
	})
	return true
}

func permille(n, of int64) int64 {
	if of <= 0 {
		return 0
	}
	return n * 1000 / of
}

// forget forgets the dead workers whose last heartbeat is more than
// WorkerRetention old, oldest first (ties by id), at most
// MaxForgetPerTick of them. A dead worker holds nothing (its mailboxes
// were moved or refused when it died, and it was reverted or released);
// one that somehow did would be kept.
func (s *State) forget(at time.Time) {
	old := s.deadBySeen.before(at.Add(-s.cfg.WorkerRetention))
	slices.SortFunc(old, func(a, b *placementWorker) int {
		if placementSeenLess(a, b) {
			return -1
		}
		return 1
	})
	n := 0
	for _, w := range old {
		if w.count != 0 || w.tier == domain.TierDedicated || w.org != "" || w.pool != domain.RiskClean {
			continue
		}
		if n == s.cfg.MaxForgetPerTick {
			return // the next tick goes on
		}
		n++
		s.emit(&domain.PlacementWorkerForgotten{
			PlacementMeta: placementMeta(at, domain.ReasonRetentionExpired),
			WorkerID:      w.id, LastSeen: w.lastSeen, RetentionSeconds: int64(s.cfg.WorkerRetention / time.Second),
		})
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
