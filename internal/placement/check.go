package placement

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// WorkerView is a worker as the state holds it.
type WorkerView struct {
	ID           string             `json:"worker_id"`
	BaseTier     domain.Tier        `json:"base_tier"`
	Tier         domain.Tier        `json:"tier"`
	Egress       domain.Egress      `json:"egress"`
	Address      string             `json:"address"`
	Pool         domain.RiskPool    `json:"pool"`
	DedicatedOrg string             `json:"dedicated_org,omitempty"`
	Releasing    bool               `json:"releasing"`
	Health       domain.HealthState `json:"health"`
	FirstSeen    time.Time          `json:"first_seen"`
	LastSeen     time.Time          `json:"last_seen"`
	Live         bool               `json:"live"`
	Stopping     bool               `json:"stopping"`
	Load         int64              `json:"load_milli"`
	Capacity     int64              `json:"capacity"`
	Mailboxes    int                `json:"mailboxes"`
	// TierHeldUntil: the worker's tier does not change before it (the
	// tier dwell its last tier change recorded).
	TierHeldUntil time.Time `json:"tier_held_until,omitzero"`
}

// LivenessView is the liveness hold as the liveness decisions recorded
// it: Holding since HeldSince; or, once a hold ended (ResumedAt), the
// last hold's HeldSince and end. The counts are those of the last
// liveness decision.
type LivenessView struct {
	Holding           bool      `json:"holding"`
	HeldSince         time.Time `json:"held_since,omitzero"`
	ResumedAt         time.Time `json:"resumed_at,omitzero"`
	Silent            int64     `json:"silent_workers"`
	Live              int64     `json:"live_workers"`
	SharePermille     int64     `json:"share_permille"`
	ThresholdPermille int64     `json:"threshold_permille"`
}

// MailboxView is a mailbox as the state holds it. WorkerID is empty
// for a refused (pending) mailbox; Degraded marks a dedicated org's mailbox
// on shared premium (also pending, with reason no_dedicated_capacity).
type MailboxView struct {
	ID             string                 `json:"mailbox_id"`
	OrgID          string                 `json:"org_id"`
	Weight         int64                  `json:"weight_milli"`
	Band           domain.RiskPool        `json:"band"`
	Candidate      domain.RiskPool        `json:"candidate,omitempty"`
	CandidateSince time.Time              `json:"candidate_since,omitzero"`
	WorkerID       string                 `json:"worker_id,omitempty"`
	Degraded       bool                   `json:"degraded"`
	PendingReason  domain.PlacementReason `json:"pending_reason,omitempty"`
	PendingSince   time.Time              `json:"pending_since,omitzero"`
}

// OrgView is an org as the state holds it.
type OrgView struct {
	ID               string      `json:"org_id"`
	Recorded         bool        `json:"recorded"`
	Plan             domain.Plan `json:"plan,omitempty"`
	DedicatedWorkers int         `json:"dedicated_workers"`
	Paid             bool        `json:"paid"`
	PlanSince        time.Time   `json:"plan_since,omitzero"`
	Bound            []string    `json:"bound,omitempty"`
	Shortfall        int         `json:"shortfall"`
	Mailboxes        int         `json:"mailboxes"`
}

// Snapshot is the whole state, sorted by id: what a projection of
// the decision log holds, and what NewStateFromSnapshot restores.
type Snapshot struct {
	Workers   []WorkerView  `json:"workers"`
	Mailboxes []MailboxView `json:"mailboxes"`
	Orgs      []OrgView     `json:"orgs"`
	Liveness  LivenessView  `json:"liveness"`
}

func (w *placementWorker) view() WorkerView {
	return WorkerView{
		ID: w.id, BaseTier: w.baseTier, Tier: w.tier, Egress: w.egress, Address: w.address, Pool: w.pool,
		DedicatedOrg: w.org, Releasing: w.releasing, Health: w.health, FirstSeen: w.firstSeen, LastSeen: w.lastSeen,
		Live: w.live, Stopping: w.stopping, Load: w.load, Capacity: w.capacity, Mailboxes: w.count, TierHeldUntil: w.tierHeldUntil,
	}
}

func (m *placementMailbox) view() MailboxView {
	v := MailboxView{
		ID: m.id, OrgID: m.org.id, Weight: m.weight, Band: m.band, Candidate: m.candidate,
		CandidateSince: m.candidateSince, PendingReason: m.pendingReason, PendingSince: m.pendingSince,
	}
	if m.worker != nil {
		v.WorkerID = m.worker.id
		v.Degraded = m.org.class() == placementDedicated && m.worker.tier != domain.TierDedicated
	}
	return v
}

func (o *placementOrg) view() OrgView {
	v := OrgView{
		ID: o.id, Recorded: o.recorded, Plan: o.plan, DedicatedWorkers: o.dedicated, Paid: o.paid,
		PlanSince: o.planSince, Shortfall: o.shortfall(), Mailboxes: o.count,
	}
	for id := range o.bound {
		v.Bound = append(v.Bound, id)
	}
	slices.Sort(v.Bound)
	return v
}

// Snapshot returns the whole state.
func (s *State) Snapshot() Snapshot {
	snap := Snapshot{Liveness: s.liveness}
	for _, w := range s.workers {
		snap.Workers = append(snap.Workers, w.view())
	}
	for _, m := range s.mailboxes {
		snap.Mailboxes = append(snap.Mailboxes, m.view())
	}
	for _, o := range s.orgs {
		snap.Orgs = append(snap.Orgs, o.view())
	}
	slices.SortFunc(snap.Workers, func(a, b WorkerView) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(snap.Mailboxes, func(a, b MailboxView) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(snap.Orgs, func(a, b OrgView) int { return strings.Compare(a.ID, b.ID) })
	return snap
}

// Liveness returns the liveness hold.
func (s *State) Liveness() LivenessView { return s.liveness }

// Worker returns one worker.
func (s *State) Worker(id string) (WorkerView, bool) {
	w := s.workers[id]
	if w == nil {
		return WorkerView{}, false
	}
	return w.view(), true
}

// Mailbox returns one mailbox.
func (s *State) Mailbox(id string) (MailboxView, bool) {
	m := s.mailboxes[id]
	if m == nil {
		return MailboxView{}, false
	}
	return m.view(), true
}

// Org returns one org.
func (s *State) Org(id string) (OrgView, bool) {
	o := s.orgs[id]
	if o == nil {
		return OrgView{}, false
	}
	return o.view(), true
}

// WorkerMailboxes returns the ids of a worker's mailboxes, sorted.
func (s *State) WorkerMailboxes(id string) []string {
	w := s.workers[id]
	if w == nil {
		return nil
	}
	var out []string
	for _, m := range w.mailboxesSorted() {
		out = append(out, m.id)
	}
	return out
}

// Pending returns the pending placements: refused mailboxes (no worker) and
// degraded ones (a dedicated org's mailbox on shared premium), by id.
func (s *State) Pending() []MailboxView {
	var out []MailboxView
	for _, m := range s.pending {
		out = append(out, m.view())
	}
	for _, o := range s.dedicatedOrgs {
		if o.shared == 0 {
			continue
		}
		for m := o.head; m != nil; m = m.oNext {
			if m.worker != nil && m.worker.tier != domain.TierDedicated {
				v := m.view()
				v.PendingReason, v.PendingSince = domain.ReasonNoDedicatedCapacity, o.planSince
				out = append(out, v)
			}
		}
	}
	slices.SortFunc(out, func(a, b MailboxView) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Counts returns the number of workers, mailboxes and refused mailboxes.
func (s *State) Counts() (workers, mailboxes, refused int) {
	return len(s.workers), len(s.mailboxes), len(s.pending)
}

// NewStateFromSnapshot rebuilds a state from a snapshot (e.g. the
// projection of the decision log at a recorded offset). Loads are recomputed
// from the mailboxes and must agree with the snapshot's. The views may come
// in any order: the state is the same.
func NewStateFromSnapshot(cfg Config, snap Snapshot) (*State, error) {
	return newStateFrom(cfg, snap, false)
}

// NewPartialState loads part of a state: some workers, some mailboxes (each
// on a worker of the snapshot, or pending) and some orgs, as the placement
// projection reads the rows one batch of decisions names. Workers keep the
// load and mailbox count of their views (their other mailboxes are not
// loaded), so ApplyDecision folds a decision about the loaded rows exactly
// as it would on the whole state. Such a state is for folding decisions,
// not for deciding: its indexes see only what was loaded.
func NewPartialState(cfg Config, snap Snapshot) (*State, error) {
	return newStateFrom(cfg, snap, true)
}

func newStateFrom(cfg Config, snap Snapshot, partial bool) (*State, error) {
	s := NewState(cfg)
	// Sized once: a million-mailbox map grown from empty rehashes ~20 times.
	s.workers = make(map[string]*placementWorker, len(snap.Workers))
	s.mailboxes = make(map[string]*placementMailbox, len(snap.Mailboxes))
	s.orgs = make(map[string]*placementOrg, len(snap.Orgs))
	s.liveness = snap.Liveness
	for _, v := range snap.Orgs {
		o := s.org(v.ID)
		o.recorded, o.plan, o.dedicated, o.paid, o.planSince = v.Recorded, v.Plan, v.DedicatedWorkers, v.Paid, v.PlanSince
		s.refreshOrgClass(o)
	}
	for _, v := range snap.Workers {
		if err := s.loadWorker(v); err != nil {
			return nil, err
		}
	}
	// One allocation for every mailbox rather than one each: at a million
	// mailboxes, a million fewer objects to allocate and for the collector
	// to mark. The block lives while any of its mailboxes does, so the
	// mailboxes removed after a restore keep their ~170 bytes until the
	// next restore (at most the restored count).
	slab := make([]placementMailbox, len(snap.Mailboxes))
	for i, v := range snap.Mailboxes {
		if err := s.loadMailbox(&slab[i], v); err != nil {
			return nil, err
		}
	}
	for _, v := range snap.Workers {
		w := s.workers[v.ID]
		switch {
		case partial:
			w.load, w.count = v.Load, v.Mailboxes
		case w.load != v.Load:
			return nil, fmt.Errorf("worker %s: load %d in the snapshot, %d from its mailboxes", v.ID, v.Load, w.load)
		}
		s.reindex(w)
	}
	return s, nil
}

func (s *State) loadWorker(v WorkerView) error {
	if s.workers[v.ID] != nil {
		return fmt.Errorf("worker %s twice", v.ID)
	}
	w := &placementWorker{
		id: v.ID, baseTier: v.BaseTier, tier: v.Tier, egress: v.Egress, address: v.Address, pool: v.Pool,
		org: v.DedicatedOrg, releasing: v.Releasing, health: v.Health, firstSeen: v.FirstSeen, lastSeen: v.LastSeen, heard: v.LastSeen,
		live: v.Live, stopping: v.Stopping, capacity: v.Capacity, bucket: -1, tierHeldUntil: v.TierHeldUntil,
	}
	for c := range w.pos {
		w.pos[c] = -1
	}
	w.seenPos = -1
	s.workers[w.id] = w
	if w.tier == domain.TierDedicated && w.org != "" && !w.releasing {
		s.org(w.org).bound[w.id] = w
		s.refreshOrgClass(s.orgs[w.org])
	}
	return nil
}

// loadMailbox loads v into m, which is zero.
func (s *State) loadMailbox(m *placementMailbox, v MailboxView) error {
	// One probe of the big map, not a lookup and then an insert: a
	// duplicate leaves the count unchanged (and fails the whole load).
	n := len(s.mailboxes)
	s.mailboxes[v.ID] = m
	if len(s.mailboxes) == n {
		return fmt.Errorf("mailbox %s twice", v.ID)
	}
	*m = placementMailbox{
		id: v.ID, org: s.org(v.OrgID), weight: v.Weight, band: v.Band, candidate: v.Candidate,
		candidateSince: v.CandidateSince,
	}
	s.linkOrg(m)
	if v.WorkerID == "" {
		m.pendingReason, m.pendingSince = v.PendingReason, v.PendingSince
		s.pending[m.id] = m
		return nil
	}
	w := s.workers[v.WorkerID]
	if w == nil {
		return fmt.Errorf("mailbox %s on unknown worker %s", v.ID, v.WorkerID)
	}
	link(m, w) // newStateFrom reindexes every worker once, after its mailboxes
	return nil
}

// Clone returns a deep copy of s, the heard times and the grace granted
// included.
func (s *State) Clone() *State {
	c, err := NewStateFromSnapshot(s.cfg, s.Snapshot())
	if err != nil {
		panic("placement: clone: " + err.Error())
	}
	for id, w := range s.workers {
		cw := c.workers[id]
		cw.heard = w.heard
		c.reindexSeen(cw)
	}
	c.graceFrom, c.takeover = s.graceFrom, s.takeover
	return c
}

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
