package placement

import (
	"fmt"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// This file is the one fold of the decision log: what each decision does
// to the state. The engine folds every decision it makes through it, a
// restore folds the log through it, and the placement projection folds
// each batch through it over a State loaded from the rows the batch names
// (NewPartialState), so a rule is written once.

func applyWorkerRegistered(s *State, d *domain.PlacementWorkerRegistered) error {
	if s.workers[d.WorkerID] != nil {
		return fmt.Errorf("worker %s already registered", d.WorkerID)
	}
	w := &placementWorker{
		id: d.WorkerID, baseTier: d.Tier, tier: d.Tier, egress: d.Egress, address: d.Address,
		pool: domain.RiskClean, health: domain.HealthHealthy, firstSeen: d.At, lastSeen: d.At, heard: d.At,
		live: true, stopping: d.Stopping, capacity: d.Capacity, bucket: -1,
	}
	for c := range w.pos {
		w.pos[c] = -1
	}
	w.seenPos = -1
	s.workers[w.id] = w
	s.reindex(w)
	return nil
}

func applyWorkerChanged(s *State, d *domain.PlacementWorkerChanged) error {
	w := s.workers[d.WorkerID]
	if w == nil {
		return fmt.Errorf("unknown worker %s", d.WorkerID)
	}
	w.baseTier = d.Tier
	if w.tier != domain.TierDedicated {
		w.tier = d.Tier
	}
	w.egress, w.address, w.stopping, w.capacity = d.Egress, d.Address, d.Stopping, d.Capacity
	if !d.TierHeldUntil.IsZero() {
		w.tierHeldUntil = d.TierHeldUntil
	}
	w.live, w.lastSeen = true, d.At
	if d.At.After(w.heard) {
		w.heard = d.At
	}
	s.reindex(w)
	return nil
}

func applyWorkerHealthChanged(s *State, d *domain.PlacementWorkerHealthChanged) error {
	w := s.workers[d.WorkerID]
	if w == nil {
		return fmt.Errorf("unknown worker %s", d.WorkerID)
	}
	w.health, w.capacity = d.Health, d.Capacity
	s.reindex(w)
	return nil
}

func applyWorkerDied(s *State, d *domain.PlacementWorkerDied) error {
	w := s.workers[d.WorkerID]
	switch {
	case w == nil || !w.live:
		return fmt.Errorf("worker %s unknown or not live", d.WorkerID)
	case d.LastSeen.Before(w.lastSeen) || d.LastSeen.After(d.At):
		// The last heartbeat heard lies between the last one recorded and
		// the death (older logs: it is the last one recorded).
		return fmt.Errorf("worker %s dies at %s last seen at %s, before its last recorded heartbeat %s or after its death", d.WorkerID, d.At, d.LastSeen, w.lastSeen)
	}
	w.live, w.lastSeen, w.heard = false, d.LastSeen, d.LastSeen
	s.reindex(w)
	return nil
}

func applyWorkerForgotten(s *State, d *domain.PlacementWorkerForgotten) error {
	w := s.workers[d.WorkerID]
	switch {
	case w == nil || w.live:
		return fmt.Errorf("worker %s unknown or live", d.WorkerID)
	case w.count != 0 || w.tier == domain.TierDedicated || w.org != "" || w.releasing || w.pool != domain.RiskClean:
		return fmt.Errorf("worker %s still holds mailboxes, an org or a pool", d.WorkerID)
	case !w.lastSeen.Equal(d.LastSeen):
		return fmt.Errorf("worker %s was last seen at %s, not %s", d.WorkerID, w.lastSeen, d.LastSeen)
	}
	s.unindexSeen(w) // a dead worker is in no placement heap: reindex keeps it out
	delete(s.draining, w.id)
	delete(s.workers, w.id)
	return nil
}

func applyWorkerPromoted(s *State, d *domain.PlacementWorkerPromoted) error {
	w := s.workers[d.WorkerID]
	switch {
	case w == nil:
		return fmt.Errorf("unknown worker %s", d.WorkerID)
	case w.count != 0:
		return fmt.Errorf("worker %s is not idle", d.WorkerID)
	case w.tier != d.FromTier || w.pool != d.FromPool || w.tier == domain.TierDedicated:
		return fmt.Errorf("worker %s is %s/%s, not %s/%s", d.WorkerID, w.tier, w.pool, d.FromTier, d.FromPool)
	case d.ToTier != w.tier && (d.ToTier != domain.TierDedicated || w.tier != domain.TierSharedPremium || d.ToPool != domain.RiskClean):
		return fmt.Errorf("worker %s: cannot promote %s to %s", d.WorkerID, w.tier, d.ToTier)
	}
	w.tier, w.pool = d.ToTier, d.ToPool
	s.reindex(w)
	return nil
}

func applyWorkerReverted(s *State, d *domain.PlacementWorkerReverted) error {
	w := s.workers[d.WorkerID]
	switch {
	case w == nil:
		return fmt.Errorf("unknown worker %s", d.WorkerID)
	case w.count != 0:
		return fmt.Errorf("worker %s is not idle", d.WorkerID)
	case w.tier != d.FromTier || w.pool != d.FromPool:
		return fmt.Errorf("worker %s is %s/%s, not %s/%s", d.WorkerID, w.tier, w.pool, d.FromTier, d.FromPool)
	case w.tier == domain.TierDedicated && (!w.releasing || d.ToTier != w.baseTier):
		return fmt.Errorf("worker %s: a dedicated worker reverts to its heartbeat tier once released", d.WorkerID)
	case w.tier != domain.TierDedicated && d.ToTier != w.tier:
		return fmt.Errorf("worker %s: a shared worker keeps its tier", d.WorkerID)
	case d.ToPool != domain.RiskClean:
		return fmt.Errorf("worker %s: reverts to clean only", d.WorkerID)
	}
	w.tier, w.pool, w.org, w.releasing = d.ToTier, domain.RiskClean, "", false
	s.reindex(w)
	return nil
}

func applyDedicatedBound(s *State, d *domain.PlacementDedicatedBound) error {
	w := s.workers[d.WorkerID]
	switch {
	case w == nil || w.tier != domain.TierDedicated:
		return fmt.Errorf("worker %s is not dedicated", d.WorkerID)
	case w.org != "" && !w.releasing:
		return fmt.Errorf("worker %s is bound to org %s", d.WorkerID, w.org)
	case w.releasing && w.count > 0 && w.org != d.OrgID:
		return fmt.Errorf("worker %s still carries org %s's mailboxes", d.WorkerID, w.org)
	}
	o := s.org(d.OrgID)
	w.org, w.releasing = d.OrgID, false
	o.bound[w.id] = w
	s.reindex(w)
	return nil
}

func applyDedicatedReleased(s *State, d *domain.PlacementDedicatedReleased) error {
	w := s.workers[d.WorkerID]
	if w == nil || w.tier != domain.TierDedicated || w.releasing || w.org != d.OrgID {
		return fmt.Errorf("worker %s is not bound to org %s", d.WorkerID, d.OrgID)
	}
	w.releasing = true
	if o := s.orgs[d.OrgID]; o != nil {
		delete(o.bound, w.id)
	}
	s.reindex(w)
	return nil
}

func applyPlanRecorded(s *State, d *domain.PlacementPlanRecorded) error {
	o := s.org(d.OrgID)
	o.plan, o.dedicated, o.paid, o.planSince, o.recorded = d.Plan, d.DedicatedWorkers, d.Paid, d.At, true
	s.refreshOrgClass(o)
	return nil
}

// mailboxFor returns the mailbox a decision names, creating it when it is
// new; it checks the decision agrees with what is known.
func (s *State) mailboxFor(id, orgID string, weight int64, band domain.RiskPool) (*placementMailbox, error) {
	m := s.mailboxes[id]
	if m != nil {
		if m.org.id != orgID || m.weight != weight || m.band != band {
			return nil, fmt.Errorf("mailbox %s is org %s weight %d band %s, not %s %d %s", id, m.org.id, m.weight, m.band, orgID, weight, band)
		}
		return m, nil
	}
	m = &placementMailbox{id: id, org: s.org(orgID), weight: weight, band: band}
	s.mailboxes[id] = m
	s.linkOrg(m)
	return m, nil
}

func applyAssigned(s *State, d *domain.PlacementAssigned) error {
	w := s.workers[d.WorkerID]
	if w == nil {
		return fmt.Errorf("unknown worker %s", d.WorkerID)
	}
	if m := s.mailboxes[d.MailboxID]; m != nil && m.worker != nil {
		return fmt.Errorf("mailbox %s is already on worker %s", d.MailboxID, m.worker.id)
	}
	m, err := s.mailboxFor(d.MailboxID, d.OrgID, d.Weight, d.Band)
	if err != nil {
		return err
	}
	s.attach(m, w)
	return nil
}

func applyRefused(s *State, d *domain.PlacementRefused) error {
	m := s.mailboxes[d.MailboxID]
	if m != nil {
		from := ""
		if m.worker != nil {
			from = m.worker.id
		}
		if from != d.FromWorker {
			return fmt.Errorf("mailbox %s is on %q, not %q", d.MailboxID, from, d.FromWorker)
		}
	} else if d.FromWorker != "" {
		return fmt.Errorf("unknown mailbox %s", d.MailboxID)
	}
	m, err := s.mailboxFor(d.MailboxID, d.OrgID, d.Weight, d.Band)
	if err != nil {
		return err
	}
	s.detach(m)
	if s.pending[m.id] == nil {
		m.pendingSince = d.At
	}
	m.pendingReason = d.Reason
	s.pending[m.id] = m
	return nil
}

func applyMigrated(s *State, d *domain.PlacementMigrated) error {
	m := s.mailboxes[d.MailboxID]
	to := s.workers[d.ToWorker]
	switch {
	case m == nil || m.worker == nil || m.worker.id != d.FromWorker:
		return fmt.Errorf("mailbox %s is not on worker %s", d.MailboxID, d.FromWorker)
	case to == nil:
		return fmt.Errorf("unknown worker %s", d.ToWorker)
	case m.org.id != d.OrgID || m.weight != d.Weight || m.band != d.ToBand:
		return fmt.Errorf("mailbox %s does not match the migration", d.MailboxID)
	}
	s.detach(m)
	s.attach(m, to)
	return nil
}

func applyUnassigned(s *State, d *domain.PlacementUnassigned) error {
	m := s.mailboxes[d.MailboxID]
	if m == nil {
		return fmt.Errorf("unknown mailbox %s", d.MailboxID)
	}
	from := ""
	if m.worker != nil {
		from = m.worker.id
	}
	if from != d.WorkerID || m.org.id != d.OrgID || m.weight != d.Weight {
		return fmt.Errorf("mailbox %s does not match the removal", d.MailboxID)
	}
	s.detach(m)
	s.unlinkOrg(m)
	delete(s.pending, m.id)
	delete(s.mailboxes, m.id)
	s.gcOrg(m.org)
	return nil
}

func applyBandChanged(s *State, d *domain.PlacementBandChanged) error {
	m := s.mailboxes[d.MailboxID]
	if m == nil || m.band != d.FromBand {
		return fmt.Errorf("mailbox %s unknown or not in band %s", d.MailboxID, d.FromBand)
	}
	m.band, m.candidate, m.candidateSince = d.ToBand, "", time.Time{}
	return nil
}

func applyBandHeld(s *State, d *domain.PlacementBandHeld) error {
	m := s.mailboxes[d.MailboxID]
	if m == nil || m.band != d.Band {
		return fmt.Errorf("mailbox %s unknown or not in band %s", d.MailboxID, d.Band)
	}
	if d.Candidate == "" {
		m.candidate, m.candidateSince = "", time.Time{}
	} else {
		m.candidate, m.candidateSince = d.Candidate, d.Since
	}
	return nil
}

func applyLivenessHeld(s *State, d *domain.PlacementLivenessHeld) error {
	if s.liveness.Holding {
		return fmt.Errorf("liveness already held since %s", s.liveness.HeldSince)
	}
	s.liveness = LivenessView{Holding: true, HeldSince: d.At, Silent: d.Silent, Live: d.Live, SharePermille: d.SharePermille, ThresholdPermille: d.ThresholdPermille}
	return nil
}

// applyLivenessResumed ends the hold and grants every live worker a whole
// window from the decision's time (as GrantLiveness does): a worker still silent
// dies a window later.
func applyLivenessResumed(s *State, d *domain.PlacementLivenessResumed) error {
	if !s.liveness.Holding || !s.liveness.HeldSince.Equal(d.HeldSince) {
		return fmt.Errorf("liveness is not held since %s", d.HeldSince)
	}
	s.liveness = LivenessView{HeldSince: d.HeldSince, ResumedAt: d.At, Silent: d.Silent, Live: d.Live, SharePermille: d.SharePermille, ThresholdPermille: d.ThresholdPermille}
	s.grant(d.At)
	return nil
}

// ApplyDecision folds one decision into s: the only place the state
// changes. A decision inconsistent with the state is refused with an error
// and changes nothing.
func (s *State) ApplyDecision(d domain.PlacementDecision) error {
	switch d := d.(type) {
	case *domain.PlacementWorkerRegistered:
		return applyWorkerRegistered(s, d)
	case *domain.PlacementWorkerChanged:
		return applyWorkerChanged(s, d)
	case *domain.PlacementWorkerHealthChanged:
		return applyWorkerHealthChanged(s, d)
	case *domain.PlacementWorkerDied:
		return applyWorkerDied(s, d)
	case *domain.PlacementWorkerForgotten:
		return applyWorkerForgotten(s, d)
	case *domain.PlacementWorkerPromoted:
		return applyWorkerPromoted(s, d)
	case *domain.PlacementWorkerReverted:
		return applyWorkerReverted(s, d)
	case *domain.PlacementDedicatedBound:
		return applyDedicatedBound(s, d)
	case *domain.PlacementDedicatedReleased:
		return applyDedicatedReleased(s, d)
	case *domain.PlacementPlanRecorded:
		return applyPlanRecorded(s, d)
	case *domain.PlacementAssigned:
		return applyAssigned(s, d)
	case *domain.PlacementRefused:
		return applyRefused(s, d)
	case *domain.PlacementMigrated:
		return applyMigrated(s, d)
	case *domain.PlacementUnassigned:
		return applyUnassigned(s, d)
	case *domain.PlacementBandChanged:
		return applyBandChanged(s, d)
	case *domain.PlacementBandHeld:
		return applyBandHeld(s, d)
	case *domain.PlacementLivenessHeld:
		return applyLivenessHeld(s, d)
	case *domain.PlacementLivenessResumed:
		return applyLivenessResumed(s, d)
	}
	return fmt.Errorf("placement: unknown decision %T", d)
}
