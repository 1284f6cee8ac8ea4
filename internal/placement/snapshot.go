package placement

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// This file is the state seen from outside and restored: the views of
// workers, mailboxes and orgs, the Snapshot the engine checkpoints and the
// projection loads (NewStateFromSnapshot, NewPartialState), and Clone.

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
