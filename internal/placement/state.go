package placement

import (
	"slices"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// This file is the state the decider decides on: workers, mailboxes and
// orgs, the links between them and the indexes the folds keep, and the
// fit of a mailbox on a worker (invariant 3).

type placementClass int

const (
	placementFree placementClass = iota
	placementPremium
	placementDedicated
)

type placementWorker struct {
	id        string
	baseTier  domain.Tier // as the worker's heartbeats say
	tier      domain.Tier // baseTier, or dedicated after promotion
	egress    domain.Egress
	address   string
	pool      domain.RiskPool
	org       string // dedicated: the bound org, or the releasing one
	releasing bool   // dedicated and released, draining
	health    domain.HealthState
	firstSeen time.Time
	// tierHeldUntil: a tier change asked for before it is not honoured
	// (recorded by the decision that last changed the tier).
	tierHeldUntil time.Time
	lastSeen      time.Time // recorded: the last decision that heard it (registration, change, death)
	heard         time.Time // its last heartbeat heard (≥ lastSeen): live state only, orders the heaps by seen
	live          bool
	stopping      bool
	load          int64 // thousandths, the exact sum of its mailboxes' weights
	capacity      int64 // effective capacity, in mailboxes of weight 1
	head          *placementMailbox
	count         int
	bucket        int
	pos           [placementClasses]int
	seenPos       int // position in liveBySeen or deadBySeen (seenDead), -1 when in neither
	seenDead      bool
}

type placementMailbox struct {
	id             string
	org            *placementOrg
	weight         int64
	band           domain.RiskPool
	candidate      domain.RiskPool // better band being observed, "" when none
	candidateSince time.Time
	worker         *placementWorker
	pendingReason  domain.PlacementReason // when refused (no worker)
	pendingSince   time.Time
	wPrev, wNext   *placementMailbox
	oPrev, oNext   *placementMailbox
}

type placementOrg struct {
	id        string
	plan      domain.Plan
	dedicated int
	paid      bool
	planSince time.Time
	recorded  bool
	bound     map[string]*placementWorker
	head      *placementMailbox
	count     int
	shared    int // mailboxes on non-dedicated workers
}

func (o *placementOrg) class() placementClass {
	switch {
	case o == nil || !o.recorded || !o.paid || o.plan == domain.PlanFree:
		return placementFree
	case o.plan == domain.PlanDedicated && o.dedicated > 0:
		return placementDedicated
	default:
		return placementPremium
	}
}

func (o *placementOrg) shortfall() int {
	if o.class() != placementDedicated {
		return 0
	}
	return max(0, o.dedicated-len(o.bound))
}

func placementSharedTier(c placementClass) domain.Tier {
	if c == placementFree {
		return domain.TierSharedFree
	}
	return domain.TierSharedPremium
}

// State is the placement engine's in-memory state. It is not safe
// for concurrent use; the engine is a single writer.
type State struct {
	cfg       Config
	workers   map[string]*placementWorker
	mailboxes map[string]*placementMailbox
	orgs      map[string]*placementOrg
	// Derived indexes, maintained by the folds.
	heaps         [6][placementClasses]placementHeap // (tier, pool) × weight class
	pending       map[string]*placementMailbox       // refused: no worker
	draining      map[string]*placementWorker        // live, stopping or released, with mailboxes
	dedicatedOrgs map[string]*placementOrg           // orgs of class dedicated
	liveBySeen    placementSeenHeap                  // live workers, oldest heartbeat first
	deadBySeen    placementSeenHeap                  // dead workers, oldest heartbeat first
	// graceFrom: no worker dies before LivenessWindow has passed since it
	// (GrantLiveness, or a hold's end), whatever its heard time says.
	graceFrom time.Time
	// takeover is the last time GrantLiveness was called (an engine taking
	// over): live state only, like graceFrom.
	takeover time.Time
	// liveness is the hold, as the liveness decisions recorded it.
	liveness LivenessView
	// Decider scratch, reset on every Apply.
	out              []domain.PlacementDecision
	capacityAppeared bool
}

// NewState returns an empty state.
func NewState(cfg Config) *State {
	s := &State{
		cfg:           cfg.withDefaults(),
		workers:       map[string]*placementWorker{},
		mailboxes:     map[string]*placementMailbox{},
		orgs:          map[string]*placementOrg{},
		pending:       map[string]*placementMailbox{},
		draining:      map[string]*placementWorker{},
		dedicatedOrgs: map[string]*placementOrg{},
	}
	for b := range s.heaps {
		for c := range s.heaps[b] {
			s.heaps[b][c].class = c
		}
	}
	return s
}

// Config returns the state's configuration, defaults applied.
func (s *State) Config() Config { return s.cfg }

func placementBucket(t domain.Tier, p domain.RiskPool) int {
	b := placementPoolIndex(p)
	if t == domain.TierSharedPremium {
		b += 3
	}
	return b
}

func (w *placementWorker) eligible() bool {
	return w.live && !w.stopping && !w.releasing && TakesNew(w.health)
}

func (w *placementWorker) headroom() int64 { return w.capacity*1000 - w.load }

// offer is the capacity a worker offers to new mailboxes.
func (w *placementWorker) offer() int64 {
	if !w.eligible() {
		return 0
	}
	return w.capacity
}

// reindex puts w in the heaps it belongs to after a change.
func (s *State) reindex(w *placementWorker) {
	nb := -1
	if w.tier != domain.TierDedicated && w.eligible() {
		nb = placementBucket(w.tier, w.pool)
	}
	head := w.headroom()
	for c, cw := range placementClassWeights {
		want := nb >= 0 && head >= cw
		if w.pos[c] >= 0 {
			h := &s.heaps[w.bucket][c]
			if want && w.bucket == nb {
				h.fix(w.pos[c])
				continue
			}
			h.remove(w.pos[c])
		}
		if want {
			s.heaps[nb][c].push(w)
		}
	}
	w.bucket = nb
	s.reindexSeen(w)
	if w.live && (w.stopping || w.releasing) && w.count > 0 {
		s.draining[w.id] = w
	} else {
		delete(s.draining, w.id)
	}
}

func (s *State) org(id string) *placementOrg {
	o := s.orgs[id]
	if o == nil {
		o = &placementOrg{id: id, bound: map[string]*placementWorker{}}
		s.orgs[id] = o
	}
	return o
}

func (s *State) gcOrg(o *placementOrg) {
	if o.count == 0 && !o.recorded && len(o.bound) == 0 {
		delete(s.orgs, o.id)
	}
}

func (s *State) refreshOrgClass(o *placementOrg) {
	if o.class() == placementDedicated {
		s.dedicatedOrgs[o.id] = o
	} else {
		delete(s.dedicatedOrgs, o.id)
	}
}

func (s *State) attach(m *placementMailbox, w *placementWorker) {
	link(m, w)
	delete(s.pending, m.id)
	m.pendingReason, m.pendingSince = "", time.Time{}
	s.reindex(w)
}

// link puts m on w's list and counts it, leaving the indexes to the
// caller: attach reindexes w at once, a restore once per worker after
// its last mailbox.
func link(m *placementMailbox, w *placementWorker) {
	m.worker = w
	m.wPrev, m.wNext = nil, w.head
	if w.head != nil {
		w.head.wPrev = m
	}
	w.head = m
	w.count++
	w.load += m.weight
	if w.tier != domain.TierDedicated {
		m.org.shared++
	}
}

func (s *State) detach(m *placementMailbox) {
	w := m.worker
	if w == nil {
		return
	}
	if m.wPrev != nil {
		m.wPrev.wNext = m.wNext
	} else {
		w.head = m.wNext
	}
	if m.wNext != nil {
		m.wNext.wPrev = m.wPrev
	}
	m.wPrev, m.wNext, m.worker = nil, nil, nil
	w.count--
	w.load -= m.weight
	if w.tier != domain.TierDedicated {
		m.org.shared--
	}
	s.reindex(w)
}

func (s *State) linkOrg(m *placementMailbox) {
	o := m.org
	m.oPrev, m.oNext = nil, o.head
	if o.head != nil {
		o.head.oPrev = m
	}
	o.head = m
	o.count++
}

func (s *State) unlinkOrg(m *placementMailbox) {
	o := m.org
	if m.oPrev != nil {
		m.oPrev.oNext = m.oNext
	} else {
		o.head = m.oNext
	}
	if m.oNext != nil {
		m.oNext.oPrev = m.oPrev
	}
	m.oPrev, m.oNext = nil, nil
	o.count--
}

// workerMailboxes returns w's mailboxes in id order.
func (w *placementWorker) mailboxesSorted() []*placementMailbox {
	out := make([]*placementMailbox, 0, w.count)
	for m := w.head; m != nil; m = m.wNext {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b *placementMailbox) int { return strings.Compare(a.id, b.id) })
	return out
}

func (o *placementOrg) mailboxesSorted() []*placementMailbox {
	out := make([]*placementMailbox, 0, o.count)
	for m := o.head; m != nil; m = m.oNext {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b *placementMailbox) int { return strings.Compare(a.id, b.id) })
	return out
}

// fits reports whether m may sit on w (invariant 3).
func (s *State) fits(m *placementMailbox, w *placementWorker) bool {
	cls := m.org.class()
	switch w.tier {
	case domain.TierSharedFree:
		return cls == placementFree && w.pool == m.band
	case domain.TierSharedPremium:
		return cls != placementFree && w.pool == m.band
	case domain.TierDedicated:
		return cls != placementFree && w.org == m.org.id
	}
	return false
}

// preferred reports whether m, fitting on w, is where its plan wants it.
func (s *State) preferred(m *placementMailbox, w *placementWorker) bool {
	if !w.live || w.stopping || w.releasing {
		return false
	}
	return m.org.class() != placementDedicated || w.tier == domain.TierDedicated
}
