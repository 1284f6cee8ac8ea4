package placement

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// This file is the checks the tests hold the decider to, by brute force
// rather than through the decider's indexes: the invariants of a state
// (Invariants) and the justification of each decision (RefusalJustified,
// DecisionJustified).

// placementFitsBrute is invariant 3, written independently of the decider.
func placementFitsBrute(orgClass placementClass, orgID string, band domain.RiskPool, w *placementWorker) error {
	switch w.tier {
	case domain.TierSharedFree:
		if orgClass != placementFree {
			return fmt.Errorf("a paid org's mailbox on shared_free worker %s", w.id)
		}
	case domain.TierSharedPremium:
		if orgClass == placementFree {
			return fmt.Errorf("a free org's mailbox on shared_premium worker %s", w.id)
		}
	case domain.TierDedicated:
		if w.org != orgID {
			return fmt.Errorf("on dedicated worker %s of org %q", w.id, w.org)
		}
		if orgClass == placementFree {
			return fmt.Errorf("a free org's mailbox on dedicated worker %s", w.id)
		}
		return nil
	default:
		return fmt.Errorf("worker %s has tier %q", w.id, w.tier)
	}
	if w.pool != band {
		return fmt.Errorf("band %s on worker %s of pool %s", band, w.id, w.pool)
	}
	return nil
}

// Invariants checks a state: invariant 3 (no mailbox on a worker of
// another tier, another org's dedicated worker or another risk pool),
// invariant 4 (each worker's load is exactly the sum of its mailboxes'
// weights), pending mailboxes have no worker, dedicated bindings are one org
// per worker and at most the plan's count, dead workers carry nothing, idle
// shared workers are clean, released workers are draining, and the
// placement index agrees with the workers. It recomputes everything from the
// mailboxes, in O(state).
func Invariants(s *State) error {
	c := &invariantCheck{s: s, load: map[string]int64{}, count: map[string]int{}, orgCount: map[string]int{}, orgShared: map[string]int{}}
	c.mailboxes()
	for id, w := range s.workers {
		c.worker(id, w)
		c.workerTier(id, w)
		c.workerIndex(id, w)
	}
	c.heaps()
	c.orgs()
	return errors.Join(c.errs...)
}

// invariantCheck collects what Invariants finds.
type invariantCheck struct {
	s                   *State
	errs                []error
	load                map[string]int64
	count               map[string]int
	orgCount, orgShared map[string]int
}

func (c *invariantCheck) bad(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// mailboxes checks every mailbox and sums what the workers and orgs must
// agree with.
func (c *invariantCheck) mailboxes() {
	s, bad := c.s, c.bad
	for id, m := range s.mailboxes {
		if m.id != id || m.org == nil || s.orgs[m.org.id] != m.org {
			bad("mailbox %s: broken identity or org link", id)
			continue
		}
		c.orgCount[m.org.id]++
		if m.worker == nil {
			if s.pending[id] != m || m.pendingReason == "" {
				bad("mailbox %s has no worker but is not pending with a reason", id)
			}
			continue
		}
		if s.pending[id] != nil || m.pendingReason != "" {
			bad("mailbox %s is on worker %s and pending", id, m.worker.id)
		}
		w := s.workers[m.worker.id]
		if w != m.worker {
			bad("mailbox %s on unknown worker %s", id, m.worker.id)
			continue
		}
		if err := placementFitsBrute(m.org.class(), m.org.id, m.band, w); err != nil {
			bad("invariant 3: mailbox %s (org %s): %v", id, m.org.id, err)
		}
		c.load[w.id] += m.weight
		c.count[w.id]++
		if w.tier != domain.TierDedicated {
			c.orgShared[m.org.id]++
		}
	}
	for id, m := range s.pending {
		if s.mailboxes[id] != m || m.worker != nil {
			bad("pending %s is not a known mailbox without a worker", id)
		}
	}
}

// worker checks a worker's load, count and mailbox list (invariant 4).
func (c *invariantCheck) worker(id string, w *placementWorker) {
	bad := c.bad
	if w.load != c.load[id] {
		bad("invariant 4: worker %s load %d, its mailboxes weigh %d", id, w.load, c.load[id])
	}
	if w.count != c.count[id] {
		bad("worker %s count %d, has %d mailboxes", id, w.count, c.count[id])
	}
	n := 0
	for m := w.head; m != nil && n <= w.count; m = m.wNext {
		if m.worker != w {
			bad("worker %s lists mailbox %s placed elsewhere", id, m.id)
		}
		n++
	}
	if n != w.count {
		bad("worker %s lists %d mailboxes, counts %d", id, n, w.count)
	}
	if !w.live && w.count > 0 {
		bad("dead worker %s carries %d mailboxes", id, w.count)
	}
	if w.capacity < 1 {
		bad("worker %s capacity %d", id, w.capacity)
	}
}

// workerTier checks what a worker's tier allows: bindings, pools.
func (c *invariantCheck) workerTier(id string, w *placementWorker) {
	s, bad := c.s, c.bad
	switch w.tier {
	case domain.TierDedicated:
		switch {
		case w.org == "":
			bad("dedicated worker %s bound to no org", id)
		case w.releasing:
			if w.count == 0 {
				bad("released worker %s is idle and was not reverted", id)
			}
			if o := s.orgs[w.org]; o != nil && o.bound[id] != nil {
				bad("released worker %s still bound to %s", id, w.org)
			}
		default:
			o := s.orgs[w.org]
			switch {
			case o == nil || o.bound[id] != w:
				bad("worker %s names org %s, which does not bind it", id, w.org)
			case o.class() != placementDedicated:
				bad("worker %s bound to org %s whose plan is not dedicated", id, w.org)
			}
			if !w.live || w.stopping || w.baseTier != domain.TierSharedPremium {
				bad("bound worker %s is dead, stopping or not premium", id)
			}
		}
		if w.pool != domain.RiskClean {
			bad("dedicated worker %s in pool %s", id, w.pool)
		}
	case domain.TierSharedFree, domain.TierSharedPremium:
		if w.org != "" || w.releasing {
			bad("shared worker %s bound to org %q", id, w.org)
		}
		if w.tier != w.baseTier {
			bad("shared worker %s tier %s, heartbeat tier %s", id, w.tier, w.baseTier)
		}
		if w.count == 0 && w.pool != domain.RiskClean {
			bad("idle worker %s in pool %s", id, w.pool)
		}
	default:
		bad("worker %s tier %q", id, w.tier)
	}
}

// workerIndex checks a worker's places in the decider's indexes.
func (c *invariantCheck) workerIndex(id string, w *placementWorker) {
	s, bad := c.s, c.bad
	nb := -1
	if w.tier != domain.TierDedicated && w.live && !w.stopping && !w.releasing && TakesNew(w.health) {
		nb = placementBucket(w.tier, w.pool)
	}
	for c, cw := range placementClassWeights {
		want := nb >= 0 && w.capacity*1000-w.load >= cw
		in := w.pos[c] >= 0
		if want != in {
			bad("index: worker %s class %d: in heap %v, should be %v", id, c, in, want)
			continue
		}
		if in && (w.bucket != nb || w.pos[c] >= len(s.heaps[nb][c].items) || s.heaps[nb][c].items[w.pos[c]] != w) {
			bad("index: worker %s class %d at a wrong position", id, c)
		}
	}
	seen := &s.liveBySeen
	if !w.live {
		seen = &s.deadBySeen
	}
	if w.heard.Before(w.lastSeen) || (!w.live && !w.heard.Equal(w.lastSeen)) {
		bad("worker %s (live %v) heard at %s, last seen (recorded) at %s", id, w.live, w.heard, w.lastSeen)
	}
	if w.seenPos < 0 || w.seenDead == w.live || w.seenPos >= len(seen.items) || seen.items[w.seenPos] != w {
		bad("index: worker %s (live %v) not at its place in the heaps by last heartbeat", id, w.live)
	}
	_, dr := s.draining[id]
	if want := w.live && (w.stopping || w.releasing) && w.count > 0; dr != want {
		bad("draining set: worker %s in it %v, should be %v", id, dr, want)
	}
}

// heaps checks the heaps themselves: order, and that they hold only known
// workers.
func (c *invariantCheck) heaps() {
	s, bad := c.s, c.bad
	for b := range s.heaps {
		for c := range s.heaps[b] {
			h := &s.heaps[b][c]
			for i, w := range h.items {
				if i > 0 && placementLess(w, h.items[(i-1)/2]) {
					bad("index: heap %d/%d out of order at %d", b, c, i)
				}
				if s.workers[w.id] != w {
					bad("index: heap %d/%d holds unknown worker %s", b, c, w.id)
				}
			}
		}
	}
	for name, h := range map[string]*placementSeenHeap{"live": &s.liveBySeen, "dead": &s.deadBySeen} {
		for i, w := range h.items {
			if i > 0 && placementSeenLess(w, h.items[(i-1)/2]) {
				bad("index: %s heap by last heartbeat out of order at %d", name, i)
			}
			if s.workers[w.id] != w || w.seenPos != i {
				bad("index: %s heap by last heartbeat holds worker %s, unknown or misplaced", name, w.id)
			}
		}
	}
	if n := len(s.liveBySeen.items) + len(s.deadBySeen.items); n != len(s.workers) {
		bad("index: the heaps by last heartbeat hold %d workers, the state %d", n, len(s.workers))
	}
}

// orgs checks every org's counts and bindings.
func (c *invariantCheck) orgs() {
	s, bad := c.s, c.bad
	for id, o := range s.orgs {
		if o.count != c.orgCount[id] {
			bad("org %s count %d, has %d mailboxes", id, o.count, c.orgCount[id])
		}
		if o.shared != c.orgShared[id] {
			bad("org %s shared count %d, has %d", id, o.shared, c.orgShared[id])
		}
		if len(o.bound) > o.dedicated || (len(o.bound) > 0 && o.class() != placementDedicated) {
			bad("org %s binds %d workers, plan %s × %d", id, len(o.bound), o.plan, o.dedicated)
		}
		for wid, w := range o.bound {
			if s.workers[wid] != w || w.org != id || w.tier != domain.TierDedicated || w.releasing {
				bad("org %s binds worker %s, which is not its dedicated worker", id, wid)
			}
		}
		if _, in := s.dedicatedOrgs[id]; in != (o.class() == placementDedicated) {
			bad("dedicated org set disagrees for %s", id)
		}
		if o.count == 0 && !o.recorded && len(o.bound) == 0 {
			bad("org %s is empty and was not collected", id)
		}
	}
}

// RefusalJustified checks, by brute force over before (the state
// just before d was folded), that a refusal or a degraded placement had no
// alternative: for a refusal, no eligible worker of the mailbox's tier and
// pool had headroom, no idle clean worker could be promoted into the pool,
// and (for a dedicated org) none of its dedicated workers had headroom and
// none could be bound; for a degraded placement, the dedicated part of that.
// Other decisions are justified by construction (nil).
func RefusalJustified(before *State, d domain.PlacementDecision) error {
	var orgID, from string
	var band domain.RiskPool
	var weight int64
	var sharedToo bool
	switch d := d.(type) {
	case *domain.PlacementRefused:
		orgID, band, weight, from, sharedToo = d.OrgID, d.Band, d.Weight, d.FromWorker, true
	case *domain.PlacementAssigned:
		if !d.Degraded {
			return nil
		}
		orgID, band, weight = d.OrgID, d.Band, d.Weight
	case *domain.PlacementMigrated:
		if !d.Degraded {
			return nil
		}
		orgID, band, weight, from = d.OrgID, d.ToBand, d.Weight, d.FromWorker
	default:
		return nil
	}
	o := before.orgs[orgID]
	cls := o.class()
	if !sharedToo && cls != placementDedicated {
		return fmt.Errorf("%s: degraded placement for org %s of a non-dedicated plan", d.EventType(), orgID)
	}
	eligible := func(w *placementWorker) bool {
		return w.live && !w.stopping && !w.releasing && (w.health == domain.HealthHealthy || w.health == domain.HealthWatch)
	}
	var ids []string
	for id := range before.workers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	tier := placementSharedTier(cls)
	for _, id := range ids {
		w := before.workers[id]
		if w.id == from || !eligible(w) {
			continue
		}
		room := w.capacity*1000-w.load >= weight
		switch {
		case cls == placementDedicated && w.tier == domain.TierDedicated && w.org == orgID && room:
			return fmt.Errorf("%s for mailbox %s: own dedicated worker %s had room", d.EventType(), d.AggregateID(), id)
		case cls == placementDedicated && o.shortfall() > 0 && w.tier == domain.TierSharedPremium && w.count == 0 && w.pool == domain.RiskClean:
			return fmt.Errorf("%s for mailbox %s: org %s short of dedicated workers while idle worker %s could be promoted", d.EventType(), d.AggregateID(), orgID, id)
		case !sharedToo || w.tier != tier:
		case w.pool == band && room:
			return fmt.Errorf("%s for mailbox %s: worker %s (%s/%s) had room", d.EventType(), d.AggregateID(), id, w.tier, w.pool)
		case band != domain.RiskClean && w.pool == domain.RiskClean && w.count == 0:
			return fmt.Errorf("%s for mailbox %s: idle clean worker %s could be promoted into %s", d.EventType(), d.AggregateID(), id, band)
		}
	}
	if cls == placementDedicated && o.shortfall() > 0 {
		for _, id := range ids {
			w := before.workers[id]
			if w.tier == domain.TierDedicated && w.releasing && w.live && !w.stopping && TakesNew(w.health) &&
				w.baseTier == domain.TierSharedPremium && (w.count == 0 || w.org == orgID) {
				return fmt.Errorf("%s for mailbox %s: released worker %s could be bound to org %s", d.EventType(), d.AggregateID(), id, orgID)
			}
		}
	}
	return nil
}

// DecisionJustified checks any decision against before, the state
// just before it was folded, by brute force over every worker: refusals and
// degraded placements as RefusalJustified does; a placement or move
// went to an eligible worker that fits (invariant 3), has headroom for the
// weight and has the lowest utilisation among the candidates the rules
// allow (ties by id); a promotion took the idle eligible clean worker with
// the lowest id and, to dedicated, for an org short of workers that had no
// released worker of its own to take back; a binding was for an org short
// of workers.
func DecisionJustified(before *State, d domain.PlacementDecision) error {
	if err := RefusalJustified(before, d); err != nil {
		return err
	}
	switch d := d.(type) {
	case *domain.PlacementAssigned:
		return placementTargetJustified(before, d, d.OrgID, d.Band, d.Weight, "", d.WorkerID, d.Degraded)
	case *domain.PlacementMigrated:
		return placementTargetJustified(before, d, d.OrgID, d.ToBand, d.Weight, d.FromWorker, d.ToWorker, d.Degraded)
	case *domain.PlacementWorkerPromoted:
		w := before.workers[d.WorkerID]
		if w == nil || w.count != 0 || w.tier == domain.TierDedicated || w.pool != domain.RiskClean || !placementEligibleBrute(w) {
			return fmt.Errorf("promotion of %s: not an idle eligible clean shared worker", d.WorkerID)
		}
		for _, o := range before.workers {
			if o.tier == w.tier && o.count == 0 && o.pool == domain.RiskClean && placementEligibleBrute(o) && o.id < w.id {
				return fmt.Errorf("promotion of %s: idle worker %s has a lower id", d.WorkerID, o.id)
			}
		}
		if d.ToTier == domain.TierDedicated {
			org := before.orgs[d.OrgID]
			if org.shortfall() == 0 || w.tier != domain.TierSharedPremium {
				return fmt.Errorf("promotion of %s to dedicated for org %s, which is not short", d.WorkerID, d.OrgID)
			}
			for _, o := range before.workers {
				if o.tier == domain.TierDedicated && o.releasing && o.org == d.OrgID && o.live && !o.stopping && TakesNew(o.health) && o.baseTier == domain.TierSharedPremium {
					return fmt.Errorf("promotion of %s: org %s's released worker %s could be taken back", d.WorkerID, d.OrgID, o.id)
				}
			}
		}
	case *domain.PlacementWorkerForgotten:
		w := before.workers[d.WorkerID]
		switch {
		case w == nil || w.live || w.count != 0:
			return fmt.Errorf("forgetting %s: not a dead idle worker", d.WorkerID)
		case !d.At.Add(-before.cfg.WorkerRetention).After(w.lastSeen):
			return fmt.Errorf("forgetting %s at %s: last seen %s, within the retention %s", d.WorkerID, d.At, w.lastSeen, before.cfg.WorkerRetention)
		case d.RetentionSeconds != int64(before.cfg.WorkerRetention/time.Second):
			return fmt.Errorf("forgetting %s: retention %d s recorded, %s applied", d.WorkerID, d.RetentionSeconds, before.cfg.WorkerRetention)
		}
	case *domain.PlacementDedicatedBound:
		if org := before.orgs[d.OrgID]; org.shortfall() == 0 {
			return fmt.Errorf("binding %s to org %s, which is not short", d.WorkerID, d.OrgID)
		}
	case *domain.PlacementWorkerDied:
		if before.liveness.Holding {
			return fmt.Errorf("worker %s died while liveness is held", d.WorkerID)
		}
	case *domain.PlacementWorkerChanged:
		if w := before.workers[d.WorkerID]; w != nil && w.live && d.Tier != w.baseTier && d.At.Before(w.tierHeldUntil) {
			return fmt.Errorf("worker %s changed tier at %s, within its dwell (until %s)", d.WorkerID, d.At, w.tierHeldUntil)
		}
	case *domain.PlacementLivenessHeld:
		live := int64(0)
		for _, w := range before.workers {
			if w.live {
				live++
			}
		}
		switch {
		case before.liveness.Holding:
			return errors.New("liveness held twice")
		case d.Live != live || d.Live < d.MinWorkers || d.Silent*1000 < d.ThresholdPermille*d.Live:
			return fmt.Errorf("liveness held with %d of %d silent (%d live, threshold %d, minimum %d)", d.Silent, d.Live, live, d.ThresholdPermille, d.MinWorkers)
		}
	case *domain.PlacementLivenessResumed:
		if !before.liveness.Holding || d.Reason == domain.ReasonHeartbeatsResumed && d.Silent*1000 >= d.ThresholdPermille*d.Live {
			return fmt.Errorf("liveness resumed with %d of %d silent (threshold %d)", d.Silent, d.Live, d.ThresholdPermille)
		}
	}
	return nil
}

func placementEligibleBrute(w *placementWorker) bool {
	return w.live && !w.stopping && !w.releasing && (w.health == domain.HealthHealthy || w.health == domain.HealthWatch)
}

func placementTargetJustified(before *State, d domain.PlacementDecision, orgID string, band domain.RiskPool, weight int64, from, to string, degraded bool) error {
	w := before.workers[to]
	if w == nil {
		return fmt.Errorf("%s for %s: unknown worker %s", d.EventType(), d.AggregateID(), to)
	}
	o := before.orgs[orgID]
	cls := o.class()
	switch {
	case !placementEligibleBrute(w):
		return fmt.Errorf("%s for %s: worker %s is not eligible", d.EventType(), d.AggregateID(), to)
	case w.capacity*1000-w.load < weight:
		return fmt.Errorf("%s for %s: worker %s has headroom %d < %d", d.EventType(), d.AggregateID(), to, w.capacity*1000-w.load, weight)
	case degraded != (cls == placementDedicated && w.tier != domain.TierDedicated):
		return fmt.Errorf("%s for %s: degraded flag %v wrong", d.EventType(), d.AggregateID(), degraded)
	}
	if err := placementFitsBrute(cls, orgID, band, w); err != nil {
		return fmt.Errorf("%s for %s: %v", d.EventType(), d.AggregateID(), err)
	}
	for _, c := range before.workers {
		if c == w || c.id == from || !placementEligibleBrute(c) || c.capacity*1000-c.load < weight || c.tier != w.tier {
			continue
		}
		if w.tier == domain.TierDedicated && c.org != orgID || w.tier != domain.TierDedicated && c.pool != band {
			continue
		}
		if c.load*w.capacity < w.load*c.capacity || (c.load*w.capacity == w.load*c.capacity && c.id < w.id) {
			return fmt.Errorf("%s for %s: worker %s (%d/%d) beats %s (%d/%d)", d.EventType(), d.AggregateID(), c.id, c.load, c.capacity, w.id, w.load, w.capacity)
		}
	}
	return nil
}
