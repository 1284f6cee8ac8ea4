package placement

// This file holds the placement engine's pure decider: the placement rules
// as one deterministic function of (state, input). Where it sits among the
// engine, the projection and replay: docs/architecture.md §6.
//
// # Model
//
// A State is the engine's whole memory: sending workers, mailboxes,
// orgs. Apply takes one input (a domain event with the time the log
// appended it, or a tick), decides, and returns the decisions. Every decision is folded into
// the state through ApplyDecision, which is the only place the state
// changes; Apply is "decide, fold each decision as it is made, return them".
// Because the decisions also record the accepted facts the engine relies on
// (a worker registered, changed or died, a plan recorded, a band changed or
// held), folding the decision log alone into a fresh state restores the
// engine exactly: the decision log is the engine's changelog.
//
// Decisions are a pure function of (state, input): no wall clock (the clock
// is the input's time), no randomness, no map-order dependence (every
// enumeration is sorted, every tie broken by id).
//
// Invariants 3 and 4 of docs/architecture.md §8 hold between inputs (at the boundaries of
// Apply, which the engine writes as one transaction). Inside one Apply a fact
// may be recorded first and its consequences right after it (a plan change
// is recorded, then every mailbox of the org moves), so a prefix of one
// input's decisions can show a mailbox that is about to move.
//
// # Rules and the choices made where the design leaves room
//
// Tiers. An org's class is free when its plan is free, when no plan was ever
// recorded, or when it is not paid (subscription ended); dedicated when its
// plan is dedicated with at least one worker; premium otherwise. Free orgs'
// mailboxes sit only on shared_free workers; premium and dedicated orgs' only
// on shared_premium workers or on dedicated workers bound to that org. A
// heartbeat asking for tier dedicated is ignored (validation refuses it with
// tier_not_allowed before it reaches the log); a blank tier is shared premium.
//
// Dedicated. An org of class dedicated with N workers gets N bound workers:
// first one of its own released workers that is still draining (re-bound,
// cancelling the release), else an idle released worker of another org (when
// a released worker becomes idle it is handed to the longest-waiting org
// short of dedicated workers before it would revert), else an idle, live,
// healthy-or-watch shared premium clean worker, promoted. When none is
// available the org is short: its mailboxes are placed on shared premium
// (degraded, a pending entry with reason no_dedicated_capacity) and moved to
// dedicated workers when capacity appears (a new, revived, resumed or
// recovered worker, a revert, or a tick). A dedicated worker serves exactly
// one org (one org field per worker, bound only when unbound or released).
// A worker is released when its org no longer needs it (plan reduced or
// changed, the least loaded first), when it stops, dies, or changes its own
// tier; a released worker takes no new mailboxes, its mailboxes move away
// (they may stay, still sending, while nowhere else fits), and once idle it
// reverts to its heartbeat tier. Dedicated workers carry no risk-pool
// semantics (one customer per worker, no cross-tenant contamination): a
// dedicated org's mailbox of any band may sit on the org's own dedicated
// workers; band and pool segregation apply on shared workers only,
// including a dedicated org's degraded mailboxes on shared premium.
//
// Risk. band(healthy) = clean, band(watch, throttled) = risky,
// band(quarantined, blocked) = quarantine. A mailbox sits on a shared worker
// only when the worker's pool equals its band, both ways. When a band's pool
// has no eligible worker with headroom, an idle eligible clean worker of the
// same tier is promoted into the pool; with nothing idle the placement is
// refused and the mailbox waits in pending (retried on capacity or tick). A
// pool worker that becomes idle reverts to clean in the same input.
//
// Hysteresis. A worse band is adopted at once (a risky mailbox must leave the
// clean pool now). A better band is adopted only after every score for at
// least BandDwell (default 1 h, and so at least two consecutive scores) has
// mapped to a better band than the current one; the band adopted is the
// worst of those scores' bands. A score mapping to the current band (or
// worse) cancels a pending recovery. A score hovering on a threshold
// therefore moves a mailbox at most once (to the worse band) and back only
// once it has stayed good for the dwell time. The recovery in progress is
// state, recorded by band_held decisions. The scored event's until field does
// not affect placement.
//
// Weight (thousandths): an OAuth provider (gmail, outlook) weighs 0.05 even
// with warmup, since it never uses the worker's SMTP egress whatever its
// volume; otherwise warmup weighs 0.4; otherwise 1.0. Weights and loads are
// int64 thousandths, so a worker's load is exactly the sum of its mailboxes'
// weights at all times.
//
// Capacity. effective capacity = max(1, floor(base × health × age)) with base
// 16 (cold_smtp), 400 (oauth_api), 25 (warmup_only); health multiplier
// healthy 1, watch 0.75, throttled 0.5, quarantined 0.25, blocked 0; age
// multiplier 0.25 on the first day rising linearly by whole days to 1 after
// 14 days (0.25 + 0.75 × min(days, 14) / 14), days counted from the worker's
// first recorded heartbeat to the input's time. Capacity is recomputed on the
// worker's heartbeats and health samples and recorded in the decision.
//
// Worker health, from each worker.health_sampled: no sends in the window is
// healthy (multiplier 1); fewer than HealthMinSends sends leaves the state as
// it was (too little evidence); otherwise the worst state whose complaint
// rate or hard-bounce rate threshold is reached (defaults: complaints 0.1 %,
// 0.3 %, 0.5 %, 1 %; hard bounces 2 %, 5 %, 8 %, 10 % for watch, throttled,
// quarantined, blocked). Only healthy and watch workers take new mailboxes;
// worker health alone does not move mailboxes already placed.
//
// Placement. Among eligible workers (live, not stopping, not released,
// healthy or watch) of the right tier and pool with headroom
// (capacity − load ≥ weight), the lowest utilisation load/capacity wins
// (exact rational comparison), ties broken by the lower worker id. Shared
// workers are indexed per (tier, pool, weight class) in heaps ordered by
// utilisation, so a placement costs O(log workers).
//
// Liveness. A worker is live while its last heartbeat is no older than
// LivenessWindow (default 3 × HeartbeatInterval) at the tick's time. The
// log records transitions, not time passing: a worker's registration,
// every heartbeat that changes something (tier, egress, address, stopping,
// capacity), a revival and its death. A heartbeat that changes nothing is
// heard, not recorded: it moves the worker's heard time, which only the
// live state holds (not the fold of the log, not Snapshot). The death
// records the last heartbeat heard (last_seen; the start of the grace
// below when that is later), so the fold learns it then.
// A state restored from the log has heard only what the log recorded, so
// the engine that restores it calls GrantLiveness with its clock: no worker
// dies before a whole window has passed on the new engine, time for every
// live worker to be heard again (a grace period after failover, as Kafka's
// controller and Temporal's membership grant). What is decided stays a
// function of the inputs and the time granted; the fold of the log never
// needs the heard times. A dead worker's mailboxes
// are re-placed under the same rules (refused into pending when nothing
// fits). A stopping heartbeat drains the worker: it takes no new mailboxes
// and its mailboxes move where they fit (the rest stay and are retried).
// A heartbeat changing a shared worker's tier moves its mailboxes off at
// once (refusing those that fit nowhere); older heartbeats are ignored.
// A live worker's tier changes at most once per TierDwell (default 5
// minutes): the decision that changes it records until when
// (tier_held_until), and a heartbeat asking for another tier before then
// is heard, not recorded (its other changes are), so a worker flipping its
// tier on every heartbeat moves its mailboxes at most once per dwell.
//
// Liveness hold. When a worker's window runs out while at least
// LivenessHoldPermille (default 550) of at least LivenessHoldMinWorkers
// (default 3) live workers have not been heard for half a window, the
// engine is more likely blind (the API, Postgres or the network between
// them down) than the fleet dead: it records liveness_held and declares
// no death for silence until heartbeats flow again, the silent share
// (workers not heard since the hold began, or since the engine took over)
// below the threshold, or until the hold has lasted LivenessHoldMax
// (default 10 minutes); liveness_resumed ends it. Its fold grants every
// live worker a whole window from then; the workers silent through the
// hold then die without holding again. The threshold is above half so
// that losing exactly one of two equal halves (zones, racks) fails over
// at once, and the minimum keeps one- and two-worker fleets failing over.
// Explicit events still act while holding (a stopping heartbeat drains,
// a removal removes). Fewer silent workers die at the end of their
// window, as always. The decisions record the counts and the threshold;
// the fold reads no heard time and no configuration, and an engine that
// takes over mid-hold keeps holding (it counts as heard only what it
// heard itself).
//
// Retention. A dead worker (holding nothing, as every dead worker does)
// last seen (as its death recorded) longer ago than WorkerRetention (default
// 7 days) at a tick's time is forgotten by a worker_forgotten decision:
// the fold deletes it from the state and every index, so the state is
// bounded by the workers heard from within the retention, whatever ids
// were ever sent. The decision carries the fact (worker, last seen, the
// retention applied); the fold does not read the configuration, so
// replaying the log is deterministic whatever the configuration is then.
// A forgotten worker that heartbeats again registers as a new worker (age
// ramp from the start). Ticks find expiring and forgettable workers in
// heaps ordered by last heartbeat, so a tick costs what it decides, not
// the size of the fleet; one tick forgets at most MaxForgetPerTick
// workers (the longest silent first), so a burst is spread over ticks.
//
// Migrations. A band change moves the mailbox when its worker's pool no
// longer matches. A plan change records the plan, releases surplus dedicated
// workers, binds missing ones, then walks every mailbox of the org in id
// order: mailboxes that no longer fit move (or are refused into pending),
// mailboxes that fit but are not where the plan wants them (on a released
// or stopping worker, or a dedicated org's mailbox on shared premium while
// its own worker has room) move when a better place exists.
import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// BandFromHealth maps a mailbox health state to its band.
func BandFromHealth(h domain.HealthState) domain.RiskPool {
	switch h {
	case domain.HealthWatch, domain.HealthThrottled:
		return domain.RiskRisky
	case domain.HealthQuarantined, domain.HealthBlocked:
		return domain.RiskQuarantine
	default:
		return domain.RiskClean
	}
}

func placementPoolIndex(p domain.RiskPool) int {
	switch p {
	case domain.RiskRisky:
		return 1
	case domain.RiskQuarantine:
		return 2
	default:
		return 0
	}
}

// placementClassWeights are the weight classes the shared-worker index keeps
// a heap for: a worker is in class c's heap when its headroom is at least
// placementClassWeights[c]. Every mailbox weight is one of them.
var placementClassWeights = domain.PlacementWeights()

const placementClasses = len(placementClassWeights)

func placementClassOf(weight int64) int {
	for c, w := range placementClassWeights {
		if weight <= w {
			return c
		}
	}
	return placementClasses - 1
}

// Weight is a mailbox's weight in thousandths. OAuth providers take
// precedence over warmup (see the package comment).
func Weight(p domain.Provider, warmup bool) int64 {
	switch {
	case p.IsOAuth():
		return domain.PlacementWeightOAuth
	case warmup:
		return domain.PlacementWeightWarmup
	default:
		return domain.PlacementWeightFull
	}
}

// BaseCapacity is an egress kind's base capacity, in mailboxes of
// weight 1.
func BaseCapacity(e domain.Egress) int64 {
	switch e {
	case domain.EgressOAuthAPI:
		return 400
	case domain.EgressWarmupOnly:
		return 25
	default:
		return 16
	}
}

// HealthPermille is the capacity multiplier of a worker health
// state, in thousandths.
func HealthPermille(h domain.HealthState) int64 {
	switch h {
	case domain.HealthWatch:
		return 750
	case domain.HealthThrottled:
		return 500
	case domain.HealthQuarantined:
		return 250
	case domain.HealthBlocked:
		return 0
	default:
		return 1000
	}
}

// Age ramp: a new worker starts at AgeRampStartPermille and reaches
// full capacity after AgeRampDays whole days.
const (
	AgeRampDays          = 14
	AgeRampStartPermille = 250
)

// AgePermille is the age multiplier, in thousandths, of a worker
// first seen age ago.
func AgePermille(age time.Duration) int64 {
	days := int64(0)
	if age > 0 {
		days = int64(age / (24 * time.Hour))
	}
	if days > AgeRampDays {
		days = AgeRampDays
	}
	return AgeRampStartPermille + (1000-AgeRampStartPermille)*days/AgeRampDays
}

// Capacity is a worker's effective capacity in mailboxes of weight
// 1: floor(base × health × age), at least 1.
func Capacity(e domain.Egress, h domain.HealthState, firstSeen, at time.Time) int64 {
	c := BaseCapacity(e) * HealthPermille(h) * AgePermille(at.Sub(firstSeen)) / 1_000_000
	if c < 1 {
		c = 1
	}
	return c
}

// TakesNew reports whether a worker in health state h takes new
// mailboxes.
func TakesNew(h domain.HealthState) bool {
	return h == domain.HealthHealthy || h == domain.HealthWatch
}

var placementHealthByRank = [...]domain.HealthState{domain.HealthHealthy, domain.HealthWatch, domain.HealthThrottled, domain.HealthQuarantined, domain.HealthBlocked}

// Config tunes the decider. Zero fields take their defaults.
type Config struct {
	// HeartbeatInterval is how often workers heartbeat (default 10 s).
	HeartbeatInterval time.Duration
	// LivenessWindow is how long a worker stays live after its last
	// heartbeat (default 3 × HeartbeatInterval).
	LivenessWindow time.Duration
	// BandDwell is how long a mailbox's scores must stay better than its band
	// before the band improves (default 1 h).
	BandDwell time.Duration
	// HealthMinSends: a worker sample with fewer sends (but some) leaves the
	// worker's health state unchanged (default 100).
	HealthMinSends int64
	// WorkerRetention: a dead worker last seen (as its death recorded)
	// longer ago than this is forgotten at the next tick (default 7 days; at least
	// LivenessWindow and a second, at most ten years).
	WorkerRetention time.Duration
	// MaxForgetPerTick bounds the workers one tick forgets, oldest first,
	// so that a burst of made-up ids expiring together is forgotten over
	// several ticks rather than in one huge transaction (default 5000).
	MaxForgetPerTick int
	// ComplaintPPM and HardBouncePPM are the rate thresholds, in parts per
	// million of sends, for watch, throttled, quarantined and blocked.
	ComplaintPPM  [4]int64
	HardBouncePPM [4]int64
	// LivenessHoldPermille is the share of live workers, in thousandths,
	// silent at once at or above which the engine holds liveness rather
	// than declare them dead (default 550, at most 1000; see the package
	// comment, Liveness).
	LivenessHoldPermille int64
	// LivenessHoldMinWorkers: with fewer live workers liveness is never
	// held, so a one- or two-worker fleet still fails over (default 3).
	LivenessHoldMinWorkers int
	// LivenessHoldMax is the longest a hold lasts: then liveness resumes
	// whatever the share, and the workers not heard during the hold die a
	// window later (default 10 minutes; negative: no bound).
	LivenessHoldMax time.Duration
	// TierDwell is how long a live worker's tier stays as it was last
	// changed: a heartbeat asking for another tier within it is heard, not
	// recorded (default 5 minutes; negative: no dwell).
	TierDwell time.Duration
}

// Defaults of the liveness hold and the tier dwell.
const (
	DefaultLivenessHoldPermille   = 550
	DefaultLivenessHoldMinWorkers = 3
	DefaultLivenessHoldMax        = 10 * time.Minute
	DefaultTierDwell              = 5 * time.Minute
)

// DefaultWorkerRetention is how long a dead worker is remembered by default.
const DefaultWorkerRetention = 7 * 24 * time.Hour

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{}.withDefaults()
}

func (c Config) withDefaults() Config {
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 10 * time.Second
	}
	if c.LivenessWindow <= 0 {
		c.LivenessWindow = 3 * c.HeartbeatInterval
	}
	if c.BandDwell <= 0 {
		c.BandDwell = time.Hour
	}
	if c.HealthMinSends <= 0 {
		c.HealthMinSends = 100
	}
	if c.WorkerRetention <= 0 {
		c.WorkerRetention = DefaultWorkerRetention
	}
	// Within what a worker_forgotten decision can record (whole seconds,
	// at most ten years), and never shorter than liveness.
	c.WorkerRetention = min(max(c.WorkerRetention, c.LivenessWindow, time.Second), domain.MaxWorkerRetentionSeconds*time.Second)
	if c.MaxForgetPerTick <= 0 {
		c.MaxForgetPerTick = 5000
	}
	if c.ComplaintPPM == [4]int64{} {
		c.ComplaintPPM = [4]int64{1000, 3000, 5000, 10000}
	}
	if c.HardBouncePPM == [4]int64{} {
		c.HardBouncePPM = [4]int64{20000, 50000, 80000, 100000}
	}
	if c.LivenessHoldPermille <= 0 {
		c.LivenessHoldPermille = DefaultLivenessHoldPermille
	}
	c.LivenessHoldPermille = min(c.LivenessHoldPermille, 1000)
	if c.LivenessHoldMinWorkers <= 0 {
		c.LivenessHoldMinWorkers = DefaultLivenessHoldMinWorkers
	}
	c.LivenessHoldMinWorkers = min(c.LivenessHoldMinWorkers, domain.MaxLivenessWorkers)
	if c.LivenessHoldMax == 0 {
		c.LivenessHoldMax = DefaultLivenessHoldMax
	}
	if c.TierDwell == 0 {
		c.TierDwell = DefaultTierDwell
	}
	return c
}

// WorkerHealth returns a worker's health state after a sample, given its
// state before.
func (c Config) WorkerHealth(prev domain.HealthState, s *domain.WorkerHealthSampled) domain.HealthState {
	c = c.withDefaults()
	if s.Sends <= 0 {
		return domain.HealthHealthy
	}
	if s.Sends < c.HealthMinSends {
		return prev
	}
	for i := 3; i >= 0; i-- {
		if s.Complaints*1_000_000 >= s.Sends*c.ComplaintPPM[i] || s.HardBounces*1_000_000 >= s.Sends*c.HardBouncePPM[i] {
			return placementHealthByRank[i+1]
		}
	}
	return domain.HealthHealthy
}

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

// ---- Apply: the decider ----

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
				FromWorker: from.id, FromBand: fromBand, Cause: reason,
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
		FromBand: fromBand, ToBand: m.band, Degraded: t.degraded,
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

func placementWorse(a, b domain.RiskPool) domain.RiskPool {
	if placementPoolIndex(a) >= placementPoolIndex(b) {
		return a
	}
	return b
}

func (s *State) healthScored(e *domain.MailboxHealthScored, at time.Time) {
	m := s.mailboxes[e.MailboxID]
	if m == nil {
		return
	}
	mapped := BandFromHealth(e.State)
	cur := placementPoolIndex(m.band)
	switch idx := placementPoolIndex(mapped); {
	case idx > cur:
		s.changeBand(m, mapped, e, domain.ReasonBandWorsened, at)
	case idx == cur:
		if m.candidate != "" {
			s.emit(&domain.PlacementBandHeld{
				PlacementMeta: placementMeta(at, domain.ReasonBandRecoveryCancelled),
				MailboxID:     m.id, Band: m.band, Health: e.State,
			})
		}
	default:
		switch {
		case m.candidate == "":
			s.emit(&domain.PlacementBandHeld{
				PlacementMeta: placementMeta(at, domain.ReasonBandRecoveryStarted),
				MailboxID:     m.id, Band: m.band, Candidate: mapped, Since: at, Health: e.State,
			})
		case at.Sub(m.candidateSince) >= s.cfg.BandDwell:
			s.changeBand(m, placementWorse(m.candidate, mapped), e, domain.ReasonBandImproved, at)
		case placementWorse(m.candidate, mapped) != m.candidate:
			s.emit(&domain.PlacementBandHeld{
				PlacementMeta: placementMeta(at, domain.ReasonBandRecoveryUpdated),
				MailboxID:     m.id, Band: m.band, Candidate: mapped, Since: m.candidateSince, Health: e.State,
			})
		}
	}
}

func (s *State) changeBand(m *placementMailbox, to domain.RiskPool, e *domain.MailboxHealthScored, reason domain.PlacementReason, at time.Time) {
	from := m.band
	s.emit(&domain.PlacementBandChanged{
		PlacementMeta: placementMeta(at, reason),
		MailboxID:     m.id, OrgID: m.org.id, FromBand: from, ToBand: to, Health: e.State, Score: e.Score,
	})
	switch w := m.worker; {
	case w == nil:
		s.ensureDedicated(m.org, at)
		s.place(m.id, m.org, m.weight, m.band, domain.ReasonRetry, false, at)
	case !s.fits(m, w):
		s.relocate(m, moveMust, from, domain.ReasonBandChanged, at)
	}
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

// retry places what waits for capacity: dedicated shortfalls and degraded
// mailboxes first (moving those frees shared premium room), then refused
// mailboxes (oldest first), then mailboxes on draining workers; repeated
// while a round decides something (a drain can free a released worker).
func (s *State) retry(at time.Time) {
	for range 8 {
		n := len(s.out)
		for _, o := range s.shortOrgs() {
			s.ensureDedicated(o, at)
		}
		s.upgradeDegraded(at)
		s.retryPending(at)
		s.retryDrains(at)
		if len(s.out) == n {
			return
		}
	}
}

func (s *State) upgradeDegraded(at time.Time) {
	var orgs []*placementOrg
	for _, o := range s.dedicatedOrgs {
		if o.shared > 0 && len(o.bound) > 0 {
			orgs = append(orgs, o)
		}
	}
	slices.SortFunc(orgs, func(a, b *placementOrg) int { return strings.Compare(a.id, b.id) })
	for _, o := range orgs {
		if s.bestDedicated(o, placementClassWeights[0], nil) == nil {
			continue
		}
		failed := int64(1 << 62)
		for _, m := range o.mailboxesSorted() {
			if m.worker == nil || m.worker.tier == domain.TierDedicated || m.weight >= failed {
				continue
			}
			if !s.relocate(m, moveUpgrade, m.band, domain.ReasonDedicatedAvailable, at) {
				failed = m.weight
			}
		}
	}
}

type placementFailKey struct {
	org    string // dedicated orgs only
	tier   domain.Tier
	band   domain.RiskPool
	weight int64
}

func (s *State) retryPending(at time.Time) {
	if len(s.pending) == 0 {
		return
	}
	ms := make([]*placementMailbox, 0, len(s.pending))
	for _, m := range s.pending {
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b *placementMailbox) int {
		if c := a.pendingSince.Compare(b.pendingSince); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	failed := map[placementFailKey]bool{}
	for _, m := range ms {
		if m.worker != nil {
			continue
		}
		k := placementFailKey{tier: placementWantedTier(m.org), band: m.band, weight: m.weight}
		if k.tier == domain.TierDedicated {
			k.org = m.org.id
		}
		if failed[k] {
			continue
		}
		if !s.place(m.id, m.org, m.weight, m.band, domain.ReasonRetry, false, at) {
			failed[k] = true
		}
	}
}

func (s *State) retryDrains(at time.Time) {
	if len(s.draining) == 0 {
		return
	}
	ws := make([]*placementWorker, 0, len(s.draining))
	for _, w := range s.draining {
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b *placementWorker) int { return strings.Compare(a.id, b.id) })
	for _, w := range ws {
		if s.draining[w.id] != nil {
			s.drain(w, domain.ReasonRetry, at)
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
