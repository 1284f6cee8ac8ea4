package domain

import (
	"bytes"
	"encoding/json"
	"time"
)

// Placement decision types, as carried in ce_type on placement.decisions.
// Besides decisions proper (assigned, refused, migrated, unassigned,
// promoted, reverted, bound, released, band changed) the log records the
// accepted facts the engine relies on (worker registered, changed, health
// changed, died; plan recorded; band held), so that folding it alone
// restores the engine.
const (
	TypePlacementWorkerRegistered    = "mailplane.placement.worker_registered.v1"
	TypePlacementWorkerChanged       = "mailplane.placement.worker_changed.v1"
	TypePlacementWorkerHealthChanged = "mailplane.placement.worker_health_changed.v1"
	TypePlacementWorkerDied          = "mailplane.placement.worker_died.v1"
	TypePlacementWorkerForgotten     = "mailplane.placement.worker_forgotten.v1"
	TypePlacementWorkerPromoted      = "mailplane.placement.worker_promoted.v1"
	TypePlacementWorkerReverted      = "mailplane.placement.worker_reverted.v1"
	TypePlacementDedicatedBound      = "mailplane.placement.dedicated_bound.v1"
	TypePlacementDedicatedReleased   = "mailplane.placement.dedicated_released.v1"
	TypePlacementPlanRecorded        = "mailplane.placement.plan_recorded.v1"
	TypePlacementAssigned            = "mailplane.placement.assigned.v1"
	TypePlacementRefused             = "mailplane.placement.refused.v1"
	TypePlacementMigrated            = "mailplane.placement.migrated.v1"
	TypePlacementUnassigned          = "mailplane.placement.unassigned.v1"
	TypePlacementBandChanged         = "mailplane.placement.band_changed.v1"
	TypePlacementBandHeld            = "mailplane.placement.band_held.v1"
	TypePlacementLivenessHeld        = "mailplane.placement.liveness_held.v1"
	TypePlacementLivenessResumed     = "mailplane.placement.liveness_resumed.v1"
)

var placementDecisionRegistry = map[string]func() PlacementDecision{
	TypePlacementWorkerRegistered:    func() PlacementDecision { return new(PlacementWorkerRegistered) },
	TypePlacementWorkerChanged:       func() PlacementDecision { return new(PlacementWorkerChanged) },
	TypePlacementWorkerHealthChanged: func() PlacementDecision { return new(PlacementWorkerHealthChanged) },
	TypePlacementWorkerDied:          func() PlacementDecision { return new(PlacementWorkerDied) },
	TypePlacementWorkerForgotten:     func() PlacementDecision { return new(PlacementWorkerForgotten) },
	TypePlacementWorkerPromoted:      func() PlacementDecision { return new(PlacementWorkerPromoted) },
	TypePlacementWorkerReverted:      func() PlacementDecision { return new(PlacementWorkerReverted) },
	TypePlacementDedicatedBound:      func() PlacementDecision { return new(PlacementDedicatedBound) },
	TypePlacementDedicatedReleased:   func() PlacementDecision { return new(PlacementDedicatedReleased) },
	TypePlacementPlanRecorded:        func() PlacementDecision { return new(PlacementPlanRecorded) },
	TypePlacementAssigned:            func() PlacementDecision { return new(PlacementAssigned) },
	TypePlacementRefused:             func() PlacementDecision { return new(PlacementRefused) },
	TypePlacementMigrated:            func() PlacementDecision { return new(PlacementMigrated) },
	TypePlacementUnassigned:          func() PlacementDecision { return new(PlacementUnassigned) },
	TypePlacementBandChanged:         func() PlacementDecision { return new(PlacementBandChanged) },
	TypePlacementBandHeld:            func() PlacementDecision { return new(PlacementBandHeld) },
	TypePlacementLivenessHeld:        func() PlacementDecision { return new(PlacementLivenessHeld) },
	TypePlacementLivenessResumed:     func() PlacementDecision { return new(PlacementLivenessResumed) },
}

// PlacementDecisionTypes returns every placement decision type, sorted.
func PlacementDecisionTypes() []string {
	return []string{
		TypePlacementAssigned, TypePlacementBandChanged, TypePlacementBandHeld,
		TypePlacementDedicatedBound, TypePlacementDedicatedReleased, TypePlacementLivenessHeld,
		TypePlacementLivenessResumed, TypePlacementMigrated, TypePlacementPlanRecorded, TypePlacementRefused, TypePlacementUnassigned,
		TypePlacementWorkerChanged, TypePlacementWorkerDied, TypePlacementWorkerForgotten, TypePlacementWorkerHealthChanged,
		TypePlacementWorkerPromoted, TypePlacementWorkerRegistered, TypePlacementWorkerReverted,
	}
}

// NewPlacementDecision returns an empty decision of eventType.
func NewPlacementDecision(eventType string) (PlacementDecision, bool) {
	f, ok := placementDecisionRegistry[eventType]
	if !ok {
		return nil, false
	}
	return f(), true
}

// DecodePlacementDecision decodes a decision's JSON data. Unknown fields
// are tolerated (a newer engine may add some); the decision is validated.
//
// Free text (a worker's address, a plan's source, a detail) that a
// decision written before TextPattern holds is read with CleanText: the
// decision log is the engine's changelog and cannot skip a record, and
// Postgres text cannot hold NUL, so such a record would stall the placement
// projection and the engine's restore forever. Every reader of the log
// (engine restore, projection, replay) reads the same cleaned value, so
// they stay in agreement; the engine writes no such text any more
// (EncodeDecision validates, and its inputs are validated alike).
func DecodePlacementDecision(eventType string, raw []byte) (PlacementDecision, error) {
	d, ok := NewPlacementDecision(eventType)
	if !ok {
		return nil, Errorf(CodeUnknownType, "unknown placement decision type %q", eventType)
	}
	if err := json.NewDecoder(bytes.NewReader(raw)).Decode(d); err != nil {
		return nil, Errorf(CodeMalformedJSON, "%s: %v", eventType, err)
	}
	if c, ok := d.(interface{ cleanText() }); ok {
		c.cleanText()
	}
	if ps := d.Validate(); len(ps) > 0 {
		return nil, ps.Err()
	}
	return d, nil
}

// PlacementReason says why a decision was made. Reasons are stable codes.
type PlacementReason string

// Placement reasons.
const (
	ReasonMailboxAdded          PlacementReason = "mailbox_added"
	ReasonMailboxRemoved        PlacementReason = "mailbox_removed"
	ReasonBandWorsened          PlacementReason = "band_worsened"
	ReasonBandImproved          PlacementReason = "band_improved"
	ReasonBandChanged           PlacementReason = "band_changed"
	ReasonBandRecoveryStarted   PlacementReason = "band_recovery_started"
	ReasonBandRecoveryUpdated   PlacementReason = "band_recovery_updated"
	ReasonBandRecoveryCancelled PlacementReason = "band_recovery_cancelled"
	ReasonWorkerRegistered      PlacementReason = "worker_registered"
	// ReasonHeartbeat: a renewal that changed nothing. No longer decided
	// (liveness is heard, not recorded); older logs hold it and it folds.
	ReasonHeartbeat           PlacementReason = "heartbeat"
	ReasonWorkerRevived       PlacementReason = "worker_revived"
	ReasonWorkerTierChanged   PlacementReason = "worker_tier_changed"
	ReasonWorkerStopping      PlacementReason = "worker_stopping"
	ReasonWorkerResumed       PlacementReason = "worker_resumed"
	ReasonWorkerChanged       PlacementReason = "worker_changed"
	ReasonCapacityRamp        PlacementReason = "capacity_ramp"
	ReasonHealthSampled       PlacementReason = "health_sampled"
	ReasonHeartbeatExpired    PlacementReason = "heartbeat_expired"
	ReasonWorkerDied          PlacementReason = "worker_died"
	ReasonRetentionExpired    PlacementReason = "retention_expired"
	ReasonPlanChanged         PlacementReason = "plan_changed"
	ReasonPoolNeeded          PlacementReason = "pool_needed"
	ReasonDedicatedNeeded     PlacementReason = "dedicated_needed"
	ReasonDedicatedAvailable  PlacementReason = "dedicated_available"
	ReasonIdle                PlacementReason = "idle"
	ReasonRetry               PlacementReason = "retry"
	ReasonNoEligibleWorker    PlacementReason = "no_eligible_worker"
	ReasonNoDedicatedCapacity PlacementReason = "no_dedicated_capacity"
	// ReasonFleetSilent: liveness is held, too large a share of the live
	// workers went silent at once (the observer is more likely blind than
	// the fleet dead).
	ReasonFleetSilent PlacementReason = "fleet_silent"
	// ReasonHeartbeatsResumed: the hold ends, heartbeats flow again.
	ReasonHeartbeatsResumed PlacementReason = "heartbeats_resumed"
	// ReasonLivenessHoldExpired: the hold ends, it lasted the engine's
	// longest hold while too many workers stayed silent.
	ReasonLivenessHoldExpired PlacementReason = "liveness_hold_expired"
)

var placementReasons = []PlacementReason{
	ReasonMailboxAdded, ReasonMailboxRemoved, ReasonBandWorsened, ReasonBandImproved, ReasonBandChanged,
	ReasonBandRecoveryStarted, ReasonBandRecoveryUpdated, ReasonBandRecoveryCancelled,
	ReasonWorkerRegistered, ReasonHeartbeat, ReasonWorkerRevived, ReasonWorkerTierChanged,
	ReasonWorkerStopping, ReasonWorkerResumed, ReasonWorkerChanged, ReasonCapacityRamp,
	ReasonHealthSampled, ReasonHeartbeatExpired, ReasonWorkerDied, ReasonRetentionExpired, ReasonPlanChanged,
	ReasonPoolNeeded, ReasonDedicatedNeeded, ReasonDedicatedAvailable, ReasonIdle, ReasonRetry,
	ReasonNoEligibleWorker, ReasonNoDedicatedCapacity, ReasonFleetSilent, ReasonHeartbeatsResumed,
	ReasonLivenessHoldExpired,
}

// RiskPool is a shared worker's risk pool, and a mailbox's risk band (a
// mailbox's band names the pool it must sit in).
type RiskPool string

// Risk pools and bands, from best to worst.
const (
	RiskClean      RiskPool = "clean"
	RiskRisky      RiskPool = "risky"
	RiskQuarantine RiskPool = "quarantine"
)

// Mailbox weights, in thousandths.
const (
	PlacementWeightFull   int64 = 1000
	PlacementWeightWarmup int64 = 400
	PlacementWeightOAuth  int64 = 50
)

// placementWeights are the mailbox weights a decision may carry, lightest
// first.
var placementWeights = [...]int64{PlacementWeightOAuth, PlacementWeightWarmup, PlacementWeightFull}

// PlacementWeights returns the mailbox weights a decision may carry,
// lightest first (a copy: validation's list cannot be changed from outside).
func PlacementWeights() [3]int64 { return placementWeights }

// PlacementDecision is one decision (or recorded fact) of the placement
// engine. It is the data of a CloudEvent on placement.decisions.
type PlacementDecision interface {
	Data
	// Meta returns the decision's time and reason.
	Meta() PlacementMeta
	// placementDecision seals the interface: decisions are the catalog's
	// types (their effect on the state is internal/placement's fold).
	placementDecision()
}

// PlacementMeta is common to every decision: when (the input's time, the
// decider's clock) and why.
type PlacementMeta struct {
	At     time.Time       `json:"at"`
	Reason PlacementReason `json:"reason"`
}

// Meta returns m.
func (m PlacementMeta) Meta() PlacementMeta { return m }

func (PlacementMeta) placementDecision() {}

func (m PlacementMeta) validate(ps *Problems) {
	if m.At.IsZero() {
		ps.Add("at", CodeRequired, "is required")
	}
	checkEnum(ps, "reason", m.Reason, true, placementReasons...)
}

func checkPool(ps *Problems, field string, p RiskPool, required bool) {
	checkEnum(ps, field, p, required, RiskClean, RiskRisky, RiskQuarantine)
}

func checkWeight(ps *Problems, field string, w int64) {
	for _, cw := range placementWeights {
		if w == cw {
			return
		}
	}
	ps.Add(field, CodeInvalid, "must be one of %v", placementWeights)
}

func checkOptUUID(ps *Problems, field, v string) {
	if v != "" {
		checkUUID(ps, field, v)
	}
}

var placementTiers = []Tier{TierSharedFree, TierSharedPremium, TierDedicated}
var placementEgresses = []Egress{EgressColdSMTP, EgressOAuthAPI, EgressWarmupOnly}
var placementHealths = []HealthState{HealthHealthy, HealthWatch, HealthThrottled, HealthQuarantined, HealthBlocked}

// ---- worker facts ----

// PlacementWorkerRegistered records a worker's first heartbeat.
type PlacementWorkerRegistered struct {
	PlacementMeta
	WorkerID string `json:"worker_id"`
	Tier     Tier   `json:"tier"`
	Egress   Egress `json:"egress"`
	Address  string `json:"address"`
	Stopping bool   `json:"stopping"`
	Capacity int64  `json:"capacity"`
}

func (*PlacementWorkerRegistered) EventType() string     { return TypePlacementWorkerRegistered }
func (d *PlacementWorkerRegistered) AggregateID() string { return d.WorkerID }

// Validate checks the decision.
func (d *PlacementWorkerRegistered) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "worker_id", d.WorkerID)
	checkEnum(&ps, "tier", d.Tier, true, TierSharedFree, TierSharedPremium)
	checkEnum(&ps, "egress", d.Egress, true, placementEgresses...)
	checkText(&ps, "address", d.Address, false, 255)
	checkRange(&ps, "capacity", d.Capacity, 1, 1<<31)
	return ps
}

func (d *PlacementWorkerRegistered) cleanText() { d.Address = CleanText(d.Address) }

// PlacementWorkerChanged records a heartbeat that changed the worker or
// renewed its liveness: the heartbeat's attributes (tier as the worker
// asks; a promoted worker stays dedicated), the capacity recomputed at its
// time, and live from then. TierHeldUntil, set when the decision changes
// the worker's tier, is when its next tier change may be honoured (the
// engine's tier dwell, recorded so that the fold reads no configuration);
// absent, the worker's tier may change at its next heartbeat.
type PlacementWorkerChanged struct {
	PlacementMeta
	WorkerID      string    `json:"worker_id"`
	Tier          Tier      `json:"tier"`
	Egress        Egress    `json:"egress"`
	Address       string    `json:"address"`
	Stopping      bool      `json:"stopping"`
	Capacity      int64     `json:"capacity"`
	TierHeldUntil time.Time `json:"tier_held_until,omitzero"`
}

func (*PlacementWorkerChanged) EventType() string     { return TypePlacementWorkerChanged }
func (d *PlacementWorkerChanged) AggregateID() string { return d.WorkerID }

// Validate checks the decision.
func (d *PlacementWorkerChanged) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "worker_id", d.WorkerID)
	checkEnum(&ps, "tier", d.Tier, true, TierSharedFree, TierSharedPremium)
	checkEnum(&ps, "egress", d.Egress, true, placementEgresses...)
	checkText(&ps, "address", d.Address, false, 255)
	checkRange(&ps, "capacity", d.Capacity, 1, 1<<31)
	if !d.TierHeldUntil.IsZero() && d.TierHeldUntil.Before(d.At) {
		ps.Add("tier_held_until", CodeInvalid, "must not be before at")
	}
	return ps
}

func (d *PlacementWorkerChanged) cleanText() { d.Address = CleanText(d.Address) }

// PlacementWorkerHealthChanged records a worker's health state from a
// sample, with the capacity recomputed at the sample's time.
type PlacementWorkerHealthChanged struct {
	PlacementMeta
	WorkerID      string      `json:"worker_id"`
	FromHealth    HealthState `json:"from_health"`
	Health        HealthState `json:"health"`
	Capacity      int64       `json:"capacity"`
	WindowSeconds int64       `json:"window_seconds"`
	Sends         int64       `json:"sends"`
	HardBounces   int64       `json:"hard_bounces"`
	Complaints    int64       `json:"complaints"`
}

func (*PlacementWorkerHealthChanged) EventType() string     { return TypePlacementWorkerHealthChanged }
func (d *PlacementWorkerHealthChanged) AggregateID() string { return d.WorkerID }

// Validate checks the decision.
func (d *PlacementWorkerHealthChanged) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "worker_id", d.WorkerID)
	checkEnum(&ps, "from_health", d.FromHealth, true, placementHealths...)
	checkEnum(&ps, "health", d.Health, true, placementHealths...)
	checkRange(&ps, "capacity", d.Capacity, 1, 1<<31)
	checkRange(&ps, "window_seconds", d.WindowSeconds, 0, 30*24*3600)
	checkRange(&ps, "sends", d.Sends, 0, MaxCount)
	checkRange(&ps, "hard_bounces", d.HardBounces, 0, MaxCount)
	checkRange(&ps, "complaints", d.Complaints, 0, MaxCount)
	return ps
}

// PlacementWorkerDied records that a worker's heartbeats stopped.
type PlacementWorkerDied struct {
	PlacementMeta
	WorkerID string    `json:"worker_id"`
	LastSeen time.Time `json:"last_seen"`
}

func (*PlacementWorkerDied) EventType() string     { return TypePlacementWorkerDied }
func (d *PlacementWorkerDied) AggregateID() string { return d.WorkerID }

// Validate checks the decision.
func (d *PlacementWorkerDied) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "worker_id", d.WorkerID)
	if d.LastSeen.IsZero() {
		ps.Add("last_seen", CodeRequired, "is required")
	}
	return ps
}

// PlacementWorkerForgotten forgets a dead worker last seen (as its death
// recorded) longer ago than the retention the engine applied
// (RetentionSeconds, recorded for the reader: the fold does not need it).
// The worker holds nothing; it leaves the state and every index, and a
// later heartbeat of the same id registers a new worker.
type PlacementWorkerForgotten struct {
	PlacementMeta
	WorkerID         string    `json:"worker_id"`
	LastSeen         time.Time `json:"last_seen"`
	RetentionSeconds int64     `json:"retention_seconds"`
}

func (*PlacementWorkerForgotten) EventType() string     { return TypePlacementWorkerForgotten }
func (d *PlacementWorkerForgotten) AggregateID() string { return d.WorkerID }

// MaxWorkerRetentionSeconds bounds retention_seconds (ten years).
const MaxWorkerRetentionSeconds = 10 * 366 * 24 * 3600

// Validate checks the decision.
func (d *PlacementWorkerForgotten) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "worker_id", d.WorkerID)
	if d.LastSeen.IsZero() {
		ps.Add("last_seen", CodeRequired, "is required")
	}
	checkRange(&ps, "retention_seconds", d.RetentionSeconds, 1, MaxWorkerRetentionSeconds)
	return ps
}

// PlacementWorkerPromoted records an idle worker promoted into a risk pool
// (ToPool) or to dedicated (ToTier, for OrgID; a dedicated_bound follows).
type PlacementWorkerPromoted struct {
	PlacementMeta
	WorkerID string   `json:"worker_id"`
	FromTier Tier     `json:"from_tier"`
	ToTier   Tier     `json:"to_tier"`
	FromPool RiskPool `json:"from_pool"`
	ToPool   RiskPool `json:"to_pool"`
	OrgID    string   `json:"org_id,omitempty"`
}

func (*PlacementWorkerPromoted) EventType() string     { return TypePlacementWorkerPromoted }
func (d *PlacementWorkerPromoted) AggregateID() string { return d.WorkerID }

// Validate checks the decision.
func (d *PlacementWorkerPromoted) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "worker_id", d.WorkerID)
	checkEnum(&ps, "from_tier", d.FromTier, true, placementTiers...)
	checkEnum(&ps, "to_tier", d.ToTier, true, placementTiers...)
	checkPool(&ps, "from_pool", d.FromPool, true)
	checkPool(&ps, "to_pool", d.ToPool, true)
	checkOptUUID(&ps, "org_id", d.OrgID)
	return ps
}

// PlacementWorkerReverted records an idle worker returning to the clean
// pool, or a released dedicated worker returning to its heartbeat tier.
type PlacementWorkerReverted struct {
	PlacementMeta
	WorkerID string   `json:"worker_id"`
	FromTier Tier     `json:"from_tier"`
	ToTier   Tier     `json:"to_tier"`
	FromPool RiskPool `json:"from_pool"`
	ToPool   RiskPool `json:"to_pool"`
	OrgID    string   `json:"org_id,omitempty"`
}

func (*PlacementWorkerReverted) EventType() string     { return TypePlacementWorkerReverted }
func (d *PlacementWorkerReverted) AggregateID() string { return d.WorkerID }

// Validate checks the decision.
func (d *PlacementWorkerReverted) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "worker_id", d.WorkerID)
	checkEnum(&ps, "from_tier", d.FromTier, true, placementTiers...)
	checkEnum(&ps, "to_tier", d.ToTier, true, TierSharedFree, TierSharedPremium)
	checkPool(&ps, "from_pool", d.FromPool, true)
	checkPool(&ps, "to_pool", d.ToPool, true)
	checkOptUUID(&ps, "org_id", d.OrgID)
	return ps
}

// PlacementDedicatedBound binds a dedicated worker to an org.
type PlacementDedicatedBound struct {
	PlacementMeta
	WorkerID string `json:"worker_id"`
	OrgID    string `json:"org_id"`
}

func (*PlacementDedicatedBound) EventType() string     { return TypePlacementDedicatedBound }
func (d *PlacementDedicatedBound) AggregateID() string { return d.WorkerID }

// Validate checks the decision.
func (d *PlacementDedicatedBound) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "worker_id", d.WorkerID)
	checkUUID(&ps, "org_id", d.OrgID)
	return ps
}

// PlacementDedicatedReleased releases a dedicated worker from its org; its
// mailboxes move away and, once idle, it reverts.
type PlacementDedicatedReleased struct {
	PlacementMeta
	WorkerID string `json:"worker_id"`
	OrgID    string `json:"org_id"`
}

func (*PlacementDedicatedReleased) EventType() string     { return TypePlacementDedicatedReleased }
func (d *PlacementDedicatedReleased) AggregateID() string { return d.WorkerID }

// Validate checks the decision.
func (d *PlacementDedicatedReleased) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "worker_id", d.WorkerID)
	checkUUID(&ps, "org_id", d.OrgID)
	return ps
}

// ---- org facts ----

// PlacementPlanRecorded records an org's plan as the engine uses it.
type PlacementPlanRecorded struct {
	PlacementMeta
	OrgID            string `json:"org_id"`
	Plan             Plan   `json:"plan"`
	DedicatedWorkers int    `json:"dedicated_workers"`
	Paid             bool   `json:"paid"`
	Source           string `json:"source"`
}

func (*PlacementPlanRecorded) EventType() string     { return TypePlacementPlanRecorded }
func (d *PlacementPlanRecorded) AggregateID() string { return d.OrgID }

// Validate checks the decision.
func (d *PlacementPlanRecorded) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "org_id", d.OrgID)
	checkEnum(&ps, "plan", d.Plan, true, PlanFree, PlanPremium, PlanDedicated)
	checkRange(&ps, "dedicated_workers", int64(d.DedicatedWorkers), 0, MaxDedicatedWorkers)
	checkText(&ps, "source", d.Source, false, 200)
	return ps
}

func (d *PlacementPlanRecorded) cleanText() { d.Source = CleanText(d.Source) }

// ---- mailbox decisions ----

// PlacementAssigned places a new or pending mailbox on a worker. Degraded
// marks a dedicated org's mailbox placed on shared premium for want of
// dedicated capacity.
type PlacementAssigned struct {
	PlacementMeta
	MailboxID string   `json:"mailbox_id"`
	OrgID     string   `json:"org_id"`
	WorkerID  string   `json:"worker_id"`
	Tier      Tier     `json:"tier"`
	Band      RiskPool `json:"band"`
	Weight    int64    `json:"weight_milli"`
	Degraded  bool     `json:"degraded"`
}

func (*PlacementAssigned) EventType() string     { return TypePlacementAssigned }
func (d *PlacementAssigned) AggregateID() string { return d.MailboxID }

// Validate checks the decision.
func (d *PlacementAssigned) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "mailbox_id", d.MailboxID)
	checkUUID(&ps, "org_id", d.OrgID)
	checkUUID(&ps, "worker_id", d.WorkerID)
	checkEnum(&ps, "tier", d.Tier, true, placementTiers...)
	checkPool(&ps, "band", d.Band, true)
	checkWeight(&ps, "weight_milli", d.Weight)
	return ps
}

// PlacementRefused says no eligible worker exists for a mailbox: it waits in
// pending (without a worker) and is retried when capacity appears. When the
// mailbox had to leave a worker (FromWorker), it left it. Cause is what
// asked for the placement.
type PlacementRefused struct {
	PlacementMeta
	MailboxID  string          `json:"mailbox_id"`
	OrgID      string          `json:"org_id"`
	Tier       Tier            `json:"tier"`
	Band       RiskPool        `json:"band"`
	Weight     int64           `json:"weight_milli"`
	FromWorker string          `json:"from_worker,omitempty"`
	FromBand   RiskPool        `json:"from_band,omitempty"`
	Cause      PlacementReason `json:"cause"`
	// Evidence is, for a refusal a band change caused (cause
	// band_changed), the evidence of the health_scored behind it, as the
	// band_changed before it carries it; absent otherwise.
	Evidence *HealthEvidence `json:"evidence,omitempty"`
}

func (*PlacementRefused) EventType() string     { return TypePlacementRefused }
func (d *PlacementRefused) AggregateID() string { return d.MailboxID }

// Validate checks the decision.
func (d *PlacementRefused) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "mailbox_id", d.MailboxID)
	checkUUID(&ps, "org_id", d.OrgID)
	checkEnum(&ps, "tier", d.Tier, true, placementTiers...)
	checkPool(&ps, "band", d.Band, true)
	checkWeight(&ps, "weight_milli", d.Weight)
	checkOptUUID(&ps, "from_worker", d.FromWorker)
	checkPool(&ps, "from_band", d.FromBand, d.FromWorker != "")
	checkEnum(&ps, "cause", d.Cause, true, placementReasons...)
	if d.Evidence != nil {
		ps = append(ps, d.Evidence.Validate().Prefixed("evidence")...)
	}
	return ps
}

// PlacementMigrated moves a mailbox between workers.
type PlacementMigrated struct {
	PlacementMeta
	MailboxID  string   `json:"mailbox_id"`
	OrgID      string   `json:"org_id"`
	Weight     int64    `json:"weight_milli"`
	FromWorker string   `json:"from_worker"`
	ToWorker   string   `json:"to_worker"`
	FromTier   Tier     `json:"from_tier"`
	ToTier     Tier     `json:"to_tier"`
	FromBand   RiskPool `json:"from_band"`
	ToBand     RiskPool `json:"to_band"`
	Degraded   bool     `json:"degraded"`
	// Evidence is, for a move a band change caused (reason band_changed),
	// the evidence of the health_scored behind it, as the band_changed
	// before it carries it; absent otherwise.
	Evidence *HealthEvidence `json:"evidence,omitempty"`
}

func (*PlacementMigrated) EventType() string     { return TypePlacementMigrated }
func (d *PlacementMigrated) AggregateID() string { return d.MailboxID }

// Validate checks the decision.
func (d *PlacementMigrated) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "mailbox_id", d.MailboxID)
	checkUUID(&ps, "org_id", d.OrgID)
	checkWeight(&ps, "weight_milli", d.Weight)
	checkUUID(&ps, "from_worker", d.FromWorker)
	checkUUID(&ps, "to_worker", d.ToWorker)
	checkEnum(&ps, "from_tier", d.FromTier, true, placementTiers...)
	checkEnum(&ps, "to_tier", d.ToTier, true, placementTiers...)
	checkPool(&ps, "from_band", d.FromBand, true)
	checkPool(&ps, "to_band", d.ToBand, true)
	if d.FromWorker == d.ToWorker && d.FromWorker != "" {
		ps.Add("to_worker", CodeInvalid, "must differ from from_worker")
	}
	if d.Evidence != nil {
		ps = append(ps, d.Evidence.Validate().Prefixed("evidence")...)
	}
	return ps
}

// PlacementUnassigned removes a mailbox: it leaves its worker (named, so the
// worker learns of it) and the state; its load is freed at once.
type PlacementUnassigned struct {
	PlacementMeta
	MailboxID string   `json:"mailbox_id"`
	OrgID     string   `json:"org_id"`
	WorkerID  string   `json:"worker_id,omitempty"`
	Band      RiskPool `json:"band"`
	Weight    int64    `json:"weight_milli"`
	Detail    string   `json:"detail,omitempty"`
}

func (*PlacementUnassigned) EventType() string     { return TypePlacementUnassigned }
func (d *PlacementUnassigned) AggregateID() string { return d.MailboxID }

// Validate checks the decision.
func (d *PlacementUnassigned) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "mailbox_id", d.MailboxID)
	checkUUID(&ps, "org_id", d.OrgID)
	checkOptUUID(&ps, "worker_id", d.WorkerID)
	checkPool(&ps, "band", d.Band, true)
	checkWeight(&ps, "weight_milli", d.Weight)
	checkText(&ps, "detail", d.Detail, false, 500)
	return ps
}

func (d *PlacementUnassigned) cleanText() { d.Detail = CleanText(d.Detail) }

// PlacementBandChanged changes a mailbox's risk band.
type PlacementBandChanged struct {
	PlacementMeta
	MailboxID string      `json:"mailbox_id"`
	OrgID     string      `json:"org_id"`
	FromBand  RiskPool    `json:"from_band"`
	ToBand    RiskPool    `json:"to_band"`
	Health    HealthState `json:"health"`
	Score     float64     `json:"score"`
	// Evidence is the evidence of the health_scored that caused the change
	// (the input, named by the record's ce_causeid), copied as it came:
	// absent when that event carried none.
	Evidence *HealthEvidence `json:"evidence,omitempty"`
}

func (*PlacementBandChanged) EventType() string     { return TypePlacementBandChanged }
func (d *PlacementBandChanged) AggregateID() string { return d.MailboxID }

// Validate checks the decision.
func (d *PlacementBandChanged) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "mailbox_id", d.MailboxID)
	checkUUID(&ps, "org_id", d.OrgID)
	checkPool(&ps, "from_band", d.FromBand, true)
	checkPool(&ps, "to_band", d.ToBand, true)
	checkEnum(&ps, "health", d.Health, true, placementHealths...)
	if d.FromBand == d.ToBand && d.FromBand != "" {
		ps.Add("to_band", CodeInvalid, "must differ from from_band")
	}
	if d.Evidence != nil {
		ps = append(ps, d.Evidence.Validate().Prefixed("evidence")...)
	}
	return ps
}

// PlacementBandHeld records the hysteresis state of a mailbox whose scores
// are better than its band: the better band being observed (Candidate, the
// worst of the better scores' bands) since when, or none (recovery
// cancelled). The band itself does not change.
type PlacementBandHeld struct {
	PlacementMeta
	MailboxID string      `json:"mailbox_id"`
	Band      RiskPool    `json:"band"`
	Candidate RiskPool    `json:"candidate,omitempty"`
	Since     time.Time   `json:"since,omitzero"`
	Health    HealthState `json:"health"`
}

func (*PlacementBandHeld) EventType() string     { return TypePlacementBandHeld }
func (d *PlacementBandHeld) AggregateID() string { return d.MailboxID }

// Validate checks the decision.
func (d *PlacementBandHeld) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkUUID(&ps, "mailbox_id", d.MailboxID)
	checkPool(&ps, "band", d.Band, true)
	checkPool(&ps, "candidate", d.Candidate, false)
	checkEnum(&ps, "health", d.Health, true, placementHealths...)
	if d.Candidate != "" && d.Since.IsZero() {
		ps.Add("since", CodeRequired, "is required with a candidate")
	}
	return ps
}

// ---- liveness ----

// LivenessScopeFleet is the scope of a liveness hold over the whole fleet
// of sending workers: the key of the liveness decisions.
const LivenessScopeFleet = "fleet"

// MaxLivenessWorkers bounds the worker counts a liveness decision records.
const MaxLivenessWorkers = 1 << 31

// PlacementLivenessHeld records that the engine stopped declaring workers
// dead: at a tick where a worker's liveness window ran out, Silent of the
// Live workers (at least MinWorkers of them) had not been heard for half a
// window, a share (SharePermille, rounded down) at or above
// ThresholdPermille. While the hold lasts no worker dies for silence;
// explicit events (a stopping heartbeat, a removal) still act.
type PlacementLivenessHeld struct {
	PlacementMeta
	Scope             string `json:"scope"`
	Silent            int64  `json:"silent_workers"`
	Live              int64  `json:"live_workers"`
	SharePermille     int64  `json:"share_permille"`
	ThresholdPermille int64  `json:"threshold_permille"`
	MinWorkers        int64  `json:"min_workers"`
}

func (*PlacementLivenessHeld) EventType() string     { return TypePlacementLivenessHeld }
func (d *PlacementLivenessHeld) AggregateID() string { return d.Scope }

// Validate checks the decision.
func (d *PlacementLivenessHeld) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkLiveness(&ps, d.Scope, d.Silent, d.Live, d.SharePermille, d.ThresholdPermille)
	checkRange(&ps, "min_workers", d.MinWorkers, 1, MaxLivenessWorkers)
	return ps
}

// PlacementLivenessResumed ends a hold (HeldSince, the hold's time) at a
// tick: fewer than ThresholdPermille of the Live workers were still silent
// (not heard since the hold began, or the engine's takeover when later,
// and within a window), reason heartbeats_resumed; or the hold lasted the
// engine's longest hold, reason liveness_hold_expired. Every live worker
// gets a whole liveness window from this decision's time before it can
// die, and the workers not heard during the hold die then without holding
// liveness again.
type PlacementLivenessResumed struct {
	PlacementMeta
	Scope             string    `json:"scope"`
	Silent            int64     `json:"silent_workers"`
	Live              int64     `json:"live_workers"`
	SharePermille     int64     `json:"share_permille"`
	ThresholdPermille int64     `json:"threshold_permille"`
	HeldSince         time.Time `json:"held_since"`
}

func (*PlacementLivenessResumed) EventType() string     { return TypePlacementLivenessResumed }
func (d *PlacementLivenessResumed) AggregateID() string { return d.Scope }

// Validate checks the decision.
func (d *PlacementLivenessResumed) Validate() Problems {
	var ps Problems
	d.validate(&ps)
	checkLiveness(&ps, d.Scope, d.Silent, d.Live, d.SharePermille, d.ThresholdPermille)
	switch {
	case d.HeldSince.IsZero():
		ps.Add("held_since", CodeRequired, "is required")
	case d.HeldSince.After(d.At):
		ps.Add("held_since", CodeInvalid, "must not be after at")
	}
	return ps
}

// checkLiveness checks what both liveness decisions record: the scope,
// the counts and the share they make.
func checkLiveness(ps *Problems, scope string, silent, live, share, threshold int64) {
	checkEnum(ps, "scope", scope, true, LivenessScopeFleet)
	checkRange(ps, "silent_workers", silent, 0, MaxLivenessWorkers)
	checkRange(ps, "live_workers", live, 1, MaxLivenessWorkers)
	checkRange(ps, "share_permille", share, 0, 1000)
	checkRange(ps, "threshold_permille", threshold, 1, 1000)
	switch {
	case silent > live:
		ps.Add("silent_workers", CodeInvalid, "must not exceed live_workers")
	case live > 0 && share != silent*1000/live:
		ps.Add("share_permille", CodeInvalid, "must be silent_workers × 1000 / live_workers, rounded down")
	}
}
