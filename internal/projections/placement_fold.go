package projections

import (
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/mailplane/mailplane/domain"
)

// This file is the placement projection's fold: what each decision does to
// the rows it names. It mirrors domain's ApplyDecision rule for rule, over
// rows instead of the engine's linked state: a batch loads the current
// rows of every worker and mailbox its decisions name, folds the decisions
// over them in log order, and writes back the final rows (see
// placement_sql.go). The fold is a function of the decisions and the rows
// alone, so where a batch starts and ends changes nothing: a replay in
// batches of any size writes the same rows.
//
// Decisions carry what the fold needs: weights on every mailbox decision
// (so a worker's load moves by exact deltas, invariant 4), from/to workers
// on moves, full worker attributes on registrations and changes, the
// capacity recomputed on heartbeats and samples. Where a decision relies
// on the state (a worker's tier surviving a heartbeat while it is
// dedicated, a mailbox's pending-since surviving another refusal), the
// loaded row supplies it. A decision that contradicts the rows (a
// migration from a worker the mailbox is not on, an unknown worker) means
// the projection and the log have parted: the batch fails with a
// permanent error rather than write rows the engine would not have.

type plKey = [16]byte

// plWorker is a placement_workers row.
type plWorker struct {
	id              plKey
	baseTier, tier  string
	egress, address string
	pool, health    string
	org             plKey // zero: none
	hasOrg          bool
	releasing       bool
	firstSeen       int64 // Unix ns
	lastSeen        int64
	live, stopping  bool
	load, capacity  int64
	count           int64
	offset          int64
	inDB, dirty     bool
	seen            bool // registered and not forgotten since
}

// plMailbox is a placement_mailboxes row; present is false once removed.
type plMailbox struct {
	id             plKey
	org            plKey
	worker         plKey
	hasWorker      bool
	band           string
	weight         int64
	candidate      string // "" none
	candidateSince int64
	pendingReason  string // "" none: then the mailbox has a worker
	pendingSince   int64
	assignedAt     time.Time
	offset         int64
	present        bool
	inDB, dirty    bool
}

// plOrg is a placement_orgs row (orgs whose plan was recorded).
type plOrg struct {
	id        plKey
	plan      string
	dedicated int32
	paid      bool
	source    string
	since     int64
	offset    int64
}

// plHistory is a placement_history row.
type plHistory struct {
	mailbox          plKey
	offset           int64
	id               plKey
	typ, reason      string
	at               time.Time
	from, to         plKey
	hasFrom, hasTo   bool
	fromBand, toBand string
	cause, detail    string
	health           string
}

// plChange is a placement_assignment_changes row.
type plChange struct {
	worker  plKey
	offset  int64
	mailbox plKey
	added   bool
}

// plFold is one batch's fold.
type plFold struct {
	workers   map[plKey]*plWorker
	mailboxes map[plKey]*plMailbox
	orgs      map[plKey]*plOrg
	history   []plHistory
	changes   []plChange
	lastID    string
}

func newPlFold() *plFold {
	return &plFold{workers: map[plKey]*plWorker{}, mailboxes: map[plKey]*plMailbox{}, orgs: map[plKey]*plOrg{}}
}

// plID parses a decision's id field. Decisions are validated on decode,
// so a failure is the record's fault.
func plID(field, s string) (plKey, error) {
	u, err := uuid.Parse(s)
	if err != nil {
		return plKey{}, Permanent(domain.CodeInvalid, fmt.Errorf("placement: %s %q is not a UUID", field, s))
	}
	return u, nil
}

func plKeyString(k plKey) string { return uuid.UUID(k).String() }

// plTouched calls worker and mailbox for every id a decision names, so
// their rows can be loaded before the fold.
func plTouched(d domain.PlacementDecision, worker, mailbox func(string)) {
	switch d := d.(type) {
	case *domain.PlacementWorkerRegistered:
		worker(d.WorkerID)
	case *domain.PlacementWorkerChanged:
		worker(d.WorkerID)
	case *domain.PlacementWorkerHealthChanged:
		worker(d.WorkerID)
	case *domain.PlacementWorkerDied:
		worker(d.WorkerID)
	case *domain.PlacementWorkerForgotten:
		worker(d.WorkerID)
	case *domain.PlacementWorkerPromoted:
		worker(d.WorkerID)
	case *domain.PlacementWorkerReverted:
		worker(d.WorkerID)
	case *domain.PlacementDedicatedBound:
		worker(d.WorkerID)
	case *domain.PlacementDedicatedReleased:
		worker(d.WorkerID)
	case *domain.PlacementAssigned:
		mailbox(d.MailboxID)
		worker(d.WorkerID)
	case *domain.PlacementRefused:
		mailbox(d.MailboxID)
		if d.FromWorker != "" {
			worker(d.FromWorker)
		}
	case *domain.PlacementMigrated:
		mailbox(d.MailboxID)
		worker(d.FromWorker)
		worker(d.ToWorker)
	case *domain.PlacementUnassigned:
		mailbox(d.MailboxID)
		if d.WorkerID != "" {
			worker(d.WorkerID)
		}
	case *domain.PlacementBandChanged:
		mailbox(d.MailboxID)
	case *domain.PlacementBandHeld:
		mailbox(d.MailboxID)
	}
}

// plShortType is a decision type without "mailplane.placement." and the
// version: "assigned".
func plShortType(t string) string {
	return strings.TrimPrefix(domain.ShortType(t), "placement.")
}

func (f *plFold) worker(id string) (*plWorker, error) {
	k, err := plID("worker_id", id)
	if err != nil {
		return nil, err
	}
	w := f.workers[k]
	if w == nil || !w.seen {
		return nil, Permanent(domain.CodeInvalid, fmt.Errorf("placement: unknown worker %s", id))
	}
	return w, nil
}

func (f *plFold) mailbox(id string) (*plMailbox, plKey, error) {
	k, err := plID("mailbox_id", id)
	if err != nil {
		return nil, k, err
	}
	m := f.mailboxes[k]
	if m != nil && !m.present {
		m = nil
	}
	return m, k, nil
}

// mailboxFor returns the mailbox a decision names, creating it when it is
// new; it must agree with what is known (domain's mailboxFor).
func (f *plFold) mailboxFor(id, orgID string, weight int64, band domain.RiskPool) (*plMailbox, error) {
	m, k, err := f.mailbox(id)
	if err != nil {
		return nil, err
	}
	org, err := plID("org_id", orgID)
	if err != nil {
		return nil, err
	}
	if m != nil {
		if m.org != org || m.weight != weight || m.band != string(band) {
			return nil, Permanent(domain.CodeInvalid, fmt.Errorf("placement: mailbox %s is org %s weight %d band %s, not %s %d %s",
				id, plKeyString(m.org), m.weight, m.band, orgID, weight, band))
		}
		return m, nil
	}
	m = f.mailboxes[k]
	if m == nil {
		m = &plMailbox{id: k}
		f.mailboxes[k] = m
	}
	// A removed mailbox added again keeps only its row's identity.
	*m = plMailbox{id: k, org: org, band: string(band), weight: weight, present: true, inDB: m.inDB}
	return m, nil
}

func (f *plFold) attach(m *plMailbox, w *plWorker, at time.Time, off int64) {
	m.worker, m.hasWorker = w.id, true
	m.pendingReason, m.pendingSince = "", 0
	m.assignedAt = at
	w.load += m.weight
	w.count++
	w.offset, w.dirty = off, true
	f.changes = append(f.changes, plChange{worker: w.id, offset: off, mailbox: m.id, added: true})
}

func (f *plFold) detach(m *plMailbox, off int64) error {
	if !m.hasWorker {
		return nil
	}
	w := f.workers[m.worker]
	if w == nil || !w.seen {
		return Permanent(domain.CodeInvalid, fmt.Errorf("placement: mailbox %s on unknown worker %s", plKeyString(m.id), plKeyString(m.worker)))
	}
	w.load -= m.weight
	w.count--
	if w.load < 0 || w.count < 0 {
		return Permanent(domain.CodeInvalid, fmt.Errorf("placement: worker %s load would fall below zero", plKeyString(w.id)))
	}
	w.offset, w.dirty = off, true
	m.hasWorker, m.worker = false, plKey{}
	m.assignedAt = time.Time{}
	f.changes = append(f.changes, plChange{worker: w.id, offset: off, mailbox: m.id, added: false})
	return nil
}

func (f *plFold) workerOn(m *plMailbox) string {
	if !m.hasWorker {
		return ""
	}
	return plKeyString(m.worker)
}

func (f *plFold) record(m plKey, off int64, id plKey, d domain.PlacementDecision) *plHistory {
	meta := d.Meta()
	f.history = append(f.history, plHistory{mailbox: m, offset: off, id: id, typ: plShortType(d.EventType()), reason: string(meta.Reason), at: meta.At})
	return &f.history[len(f.history)-1]
}

// apply folds one decision at offset off with id id.
func (f *plFold) apply(off int64, id string, d domain.PlacementDecision) error {
	did, err := plID("decision id", id)
	if err != nil {
		return err
	}
	at := d.Meta().At
	bad := func(format string, args ...any) error {
		return Permanent(domain.CodeInvalid, fmt.Errorf("placement: decision at offset %d (%s): "+format,
			append([]any{off, plShortType(d.EventType())}, args...)...))
	}
	switch d := d.(type) {
	case *domain.PlacementWorkerRegistered:
		k, err := plID("worker_id", d.WorkerID)
		if err != nil {
			return err
		}
		w := f.workers[k]
		if w == nil {
			w = &plWorker{id: k}
			f.workers[k] = w
		}
		if w.seen {
			return bad("worker %s already registered", d.WorkerID)
		}
		*w = plWorker{
			id: k, baseTier: string(d.Tier), tier: string(d.Tier), egress: string(d.Egress), address: d.Address,
			pool: string(domain.RiskClean), health: string(domain.HealthHealthy), firstSeen: at.UnixNano(), lastSeen: at.UnixNano(),
			live: true, stopping: d.Stopping, capacity: d.Capacity, offset: off, inDB: w.inDB, dirty: true, seen: true,
		}
	case *domain.PlacementWorkerChanged:
		w, err := f.worker(d.WorkerID)
		if err != nil {
			return err
		}
		w.baseTier = string(d.Tier)
		if w.tier != string(domain.TierDedicated) {
			w.tier = string(d.Tier)
		}
		w.egress, w.address, w.stopping, w.capacity = string(d.Egress), d.Address, d.Stopping, d.Capacity
		w.live, w.lastSeen = true, at.UnixNano()
		w.offset, w.dirty = off, true
	case *domain.PlacementWorkerHealthChanged:
		w, err := f.worker(d.WorkerID)
		if err != nil {
			return err
		}
		w.health, w.capacity = string(d.Health), d.Capacity
		w.offset, w.dirty = off, true
	case *domain.PlacementWorkerDied:
		w, err := f.worker(d.WorkerID)
		if err != nil {
			return err
		}
		if !w.live {
			return bad("worker %s is not live", d.WorkerID)
		}
		w.live = false
		w.offset, w.dirty = off, true
	case *domain.PlacementWorkerForgotten:
		w, err := f.worker(d.WorkerID)
		if err != nil {
			return err
		}
		switch {
		case w.live:
			return bad("worker %s is live", d.WorkerID)
		case w.count != 0 || w.tier == string(domain.TierDedicated) || w.hasOrg || w.releasing || w.pool != string(domain.RiskClean):
			return bad("worker %s still holds mailboxes, an org or a pool", d.WorkerID)
		case w.lastSeen != d.LastSeen.UnixNano():
			return bad("worker %s was last seen at %d ns, not %s", d.WorkerID, w.lastSeen, d.LastSeen)
		}
		// Its row is deleted; a later registration of the id writes a
		// new one.
		w.seen, w.offset, w.dirty = false, off, true
	case *domain.PlacementWorkerPromoted:
		w, err := f.worker(d.WorkerID)
		if err != nil {
			return err
		}
		if w.count != 0 || w.tier != string(d.FromTier) || w.pool != string(d.FromPool) {
			return bad("worker %s is %s/%s with %d mailboxes, not idle %s/%s", d.WorkerID, w.tier, w.pool, w.count, d.FromTier, d.FromPool)
		}
		w.tier, w.pool = string(d.ToTier), string(d.ToPool)
		w.offset, w.dirty = off, true
	case *domain.PlacementWorkerReverted:
		w, err := f.worker(d.WorkerID)
		if err != nil {
			return err
		}
		if w.count != 0 || w.tier != string(d.FromTier) || w.pool != string(d.FromPool) {
			return bad("worker %s is %s/%s with %d mailboxes, not idle %s/%s", d.WorkerID, w.tier, w.pool, w.count, d.FromTier, d.FromPool)
		}
		w.tier, w.pool, w.org, w.hasOrg, w.releasing = string(d.ToTier), string(domain.RiskClean), plKey{}, false, false
		w.offset, w.dirty = off, true
	case *domain.PlacementDedicatedBound:
		w, err := f.worker(d.WorkerID)
		if err != nil {
			return err
		}
		org, err := plID("org_id", d.OrgID)
		if err != nil {
			return err
		}
		if w.tier != string(domain.TierDedicated) || (w.hasOrg && !w.releasing) {
			return bad("worker %s is %s, bound %v", d.WorkerID, w.tier, w.hasOrg)
		}
		w.org, w.hasOrg, w.releasing = org, true, false
		w.offset, w.dirty = off, true
	case *domain.PlacementDedicatedReleased:
		w, err := f.worker(d.WorkerID)
		if err != nil {
			return err
		}
		org, err := plID("org_id", d.OrgID)
		if err != nil {
			return err
		}
		if w.tier != string(domain.TierDedicated) || w.releasing || !w.hasOrg || w.org != org {
			return bad("worker %s is not bound to org %s", d.WorkerID, d.OrgID)
		}
		w.releasing = true
		w.offset, w.dirty = off, true
	case *domain.PlacementPlanRecorded:
		k, err := plID("org_id", d.OrgID)
		if err != nil {
			return err
		}
		f.orgs[k] = &plOrg{id: k, plan: string(d.Plan), dedicated: int32(d.DedicatedWorkers), paid: d.Paid, source: d.Source, since: at.UnixNano(), offset: off}
	case *domain.PlacementAssigned:
		w, err := f.worker(d.WorkerID)
		if err != nil {
			return err
		}
		if m, _, err := f.mailbox(d.MailboxID); err != nil {
			return err
		} else if m != nil && m.hasWorker {
			return bad("mailbox %s is already on worker %s", d.MailboxID, plKeyString(m.worker))
		}
		m, err := f.mailboxFor(d.MailboxID, d.OrgID, d.Weight, d.Band)
		if err != nil {
			return err
		}
		f.attach(m, w, at, off)
		m.offset, m.dirty = off, true
		h := f.record(m.id, off, did, d)
		h.to, h.hasTo, h.toBand = w.id, true, string(d.Band)
	case *domain.PlacementRefused:
		m, _, err := f.mailbox(d.MailboxID)
		if err != nil {
			return err
		}
		if m != nil {
			if on := f.workerOn(m); on != d.FromWorker {
				return bad("mailbox %s is on %q, not %q", d.MailboxID, on, d.FromWorker)
			}
		} else if d.FromWorker != "" {
			return bad("unknown mailbox %s", d.MailboxID)
		}
		m, err = f.mailboxFor(d.MailboxID, d.OrgID, d.Weight, d.Band)
		if err != nil {
			return err
		}
		if err := f.detach(m, off); err != nil {
			return err
		}
		if m.pendingReason == "" {
			m.pendingSince = at.UnixNano()
		}
		m.pendingReason = string(d.Reason)
		m.offset, m.dirty = off, true
		h := f.record(m.id, off, did, d)
		h.toBand, h.cause = string(d.Band), string(d.Cause)
		if d.FromWorker != "" {
			from, err := plID("from_worker", d.FromWorker)
			if err != nil {
				return err
			}
			h.from, h.hasFrom, h.fromBand = from, true, string(d.FromBand)
		}
	case *domain.PlacementMigrated:
		m, _, err := f.mailbox(d.MailboxID)
		if err != nil {
			return err
		}
		if m == nil || f.workerOn(m) != d.FromWorker {
			return bad("mailbox %s is not on worker %s", d.MailboxID, d.FromWorker)
		}
		to, err := f.worker(d.ToWorker)
		if err != nil {
			return err
		}
		if org, err := plID("org_id", d.OrgID); err != nil {
			return err
		} else if m.org != org || m.weight != d.Weight || m.band != string(d.ToBand) {
			return bad("mailbox %s does not match the migration", d.MailboxID)
		}
		from := m.worker
		if err := f.detach(m, off); err != nil {
			return err
		}
		f.attach(m, to, at, off)
		m.offset, m.dirty = off, true
		h := f.record(m.id, off, did, d)
		h.from, h.hasFrom, h.fromBand = from, true, string(d.FromBand)
		h.to, h.hasTo, h.toBand = to.id, true, string(d.ToBand)
	case *domain.PlacementUnassigned:
		m, _, err := f.mailbox(d.MailboxID)
		if err != nil {
			return err
		}
		if m == nil {
			return bad("unknown mailbox %s", d.MailboxID)
		}
		org, err := plID("org_id", d.OrgID)
		if err != nil {
			return err
		}
		if f.workerOn(m) != d.WorkerID || m.org != org || m.weight != d.Weight {
			return bad("mailbox %s does not match the removal", d.MailboxID)
		}
		from, had := m.worker, m.hasWorker
		if err := f.detach(m, off); err != nil {
			return err
		}
		m.present, m.dirty = false, true
		h := f.record(m.id, off, did, d)
		h.from, h.hasFrom, h.fromBand, h.detail = from, had, string(d.Band), d.Detail
	case *domain.PlacementBandChanged:
		m, _, err := f.mailbox(d.MailboxID)
		if err != nil {
			return err
		}
		if m == nil || m.band != string(d.FromBand) {
			return bad("mailbox %s unknown or not in band %s", d.MailboxID, d.FromBand)
		}
		m.band, m.candidate, m.candidateSince = string(d.ToBand), "", 0
		m.offset, m.dirty = off, true
		if m.hasWorker {
			// The assignment's details changed where it is: a change
			// row saying the mailbox was on the worker before it.
			f.changes = append(f.changes, plChange{worker: m.worker, offset: off, mailbox: m.id, added: false})
		}
		h := f.record(m.id, off, did, d)
		h.fromBand, h.toBand, h.health = string(d.FromBand), string(d.ToBand), string(d.Health)
	case *domain.PlacementBandHeld:
		m, _, err := f.mailbox(d.MailboxID)
		if err != nil {
			return err
		}
		if m == nil || m.band != string(d.Band) {
			return bad("mailbox %s unknown or not in band %s", d.MailboxID, d.Band)
		}
		if d.Candidate == "" {
			m.candidate, m.candidateSince = "", 0
		} else {
			m.candidate, m.candidateSince = string(d.Candidate), d.Since.UnixNano()
		}
		m.offset, m.dirty = off, true
		h := f.record(m.id, off, did, d)
		h.fromBand, h.toBand, h.health = string(d.Band), string(d.Candidate), string(d.Health)
	default:
		return Permanent(domain.CodeUnknownType, fmt.Errorf("placement: decision at offset %d: unknown type %T", off, d))
	}
	f.lastID = id
	return nil
}
