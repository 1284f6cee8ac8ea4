package postgres

import (
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/applyonce"
	"github.com/mailplane/mailplane/internal/placement"
)

// This file turns decisions into the placement projection's rows. What a
// decision does to the state is not written here: it is the decider's own
// fold (placement.State.ApplyDecision), the one the engine and a restore
// run. A batch loads the rows of every worker and mailbox its decisions
// name (and the workers those mailboxes sit on) into a partial state
// (placement.NewPartialState), folds the decisions through ApplyDecision in
// log order, and reads the named rows back out of the state (see
// placement.go for the SQL); a rebuild (Builder) folds the whole
// log into one state. The fold is a function of the decisions and the rows
// alone, so where a batch starts and ends changes nothing: a rebuild in
// batches of any size writes the same rows.
//
// What is the projection's own is what the state does not hold: each
// row's decision offset (the last decision naming it), a mailbox's
// assigned_at (the time of the decision that put it on its worker), the
// history rows and the assignment-change rows, all read off the decisions.
// A decision the fold refuses (a migration from a worker the mailbox is
// not on, an unknown worker) means the projection and the log have parted:
// the batch fails with a permanent error rather than write rows the engine
// would not have.

type uuidKey = [16]byte

// worker is a placement_workers row.
type worker struct {
	id              uuidKey
	baseTier, tier  string
	egress, address string
	pool, health    string
	org             uuidKey // zero: none
	hasOrg          bool
	releasing       bool
	firstSeen       int64 // Unix ns
	lastSeen        int64
	tierHeldUntil   int64 // Unix ns, 0: none
	live, stopping  bool
	load, capacity  int64
	count           int64
	offset          int64
	inDB, dirty     bool
	seen            bool // registered and not forgotten since
}

// mailbox is a placement_mailboxes row; present is false once removed.
type mailbox struct {
	id             uuidKey
	org            uuidKey
	worker         uuidKey
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

// org is a placement_orgs row (orgs whose plan was recorded).
type org struct {
	id        uuidKey
	plan      string
	dedicated int32
	paid      bool
	source    string
	since     int64
	offset    int64
}

// liveness is the placement_liveness row.
type liveness struct {
	v      placement.LivenessView
	offset int64
	inDB   bool
	dirty  bool
}

// history is a placement_history row.
type history struct {
	mailbox          uuidKey
	offset           int64
	id               uuidKey
	typ, reason      string
	at               time.Time
	from, to         uuidKey
	hasFrom, hasTo   bool
	fromBand, toBand string
	cause, detail    string
	health           string
}

// change is a placement_assignment_changes row.
type change struct {
	worker  uuidKey
	offset  int64
	mailbox uuidKey
	added   bool
}

// fold is one batch's fold (or, in a rebuild, the whole log's).
type fold struct {
	st        *placement.State
	workers   map[uuidKey]*worker
	mailboxes map[uuidKey]*mailbox
	orgs      map[uuidKey]*org
	liveness  *liveness // nil: not loaded (the batch names no liveness decision) or no row
	history   []history
	changes   []change
	lastID    string
}

func newFold() *fold {
	return &fold{
		st:      placement.NewState(placement.DefaultConfig()),
		workers: map[uuidKey]*worker{}, mailboxes: map[uuidKey]*mailbox{}, orgs: map[uuidKey]*org{},
	}
}

// parseKey parses a decision's id field. Decisions are validated on decode,
// so a failure is the record's fault.
func parseKey(field, s string) (uuidKey, error) {
	u, err := uuid.Parse(s)
	if err != nil {
		return uuidKey{}, applyonce.Permanent(domain.CodeInvalid, fmt.Errorf("placement: %s %q is not a UUID", field, s))
	}
	return u, nil
}

func keyString(k uuidKey) string { return uuid.UUID(k).String() }

// unixNanos is a time as stored, in Unix nanoseconds; the zero time is 0.
func unixNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// touched calls worker and mailbox for every id a decision names: the
// rows it may change.
func touched(d domain.PlacementDecision, worker, mailbox func(string)) {
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

// isLiveness reports whether d is a liveness decision (the
// placement_liveness row).
func isLiveness(d domain.PlacementDecision) bool {
	switch d.(type) {
	case *domain.PlacementLivenessHeld, *domain.PlacementLivenessResumed:
		return true
	}
	return false
}

// row is the placement_liveness row's values.
func (l *liveness) row() []any {
	var resumed any
	if !l.v.Holding {
		resumed = unixNanos(l.v.ResumedAt)
	}
	return []any{domain.LivenessScopeFleet, l.v.Holding, unixNanos(l.v.HeldSince), resumed, l.v.Silent, l.v.Live,
		int32(l.v.SharePermille), int32(l.v.ThresholdPermille), l.offset}
}

// shortType is a decision type without "mailplane.placement." and the
// version: "assigned".
func shortType(t string) string {
	return strings.TrimPrefix(domain.ShortType(t), "placement.")
}

// view is the row as the decider holds it.
func (w *worker) view() placement.WorkerView {
	v := placement.WorkerView{
		ID: keyString(w.id), BaseTier: domain.Tier(w.baseTier), Tier: domain.Tier(w.tier), Egress: domain.Egress(w.egress),
		Address: w.address, Pool: domain.RiskPool(w.pool), Releasing: w.releasing, Health: domain.HealthState(w.health),
		FirstSeen: fromNanos(w.firstSeen), LastSeen: fromNanos(w.lastSeen), Live: w.live, Stopping: w.stopping,
		Load: w.load, Capacity: w.capacity, Mailboxes: int(w.count),
	}
	if w.tierHeldUntil != 0 {
		v.TierHeldUntil = fromNanos(w.tierHeldUntil)
	}
	if w.hasOrg {
		v.DedicatedOrg = keyString(w.org)
	}
	return v
}

// set makes the row the decider's worker.
func (w *worker) set(v placement.WorkerView) error {
	w.baseTier, w.tier, w.egress, w.address = string(v.BaseTier), string(v.Tier), string(v.Egress), v.Address
	w.pool, w.health, w.releasing = string(v.Pool), string(v.Health), v.Releasing
	w.firstSeen, w.lastSeen, w.live, w.stopping = unixNanos(v.FirstSeen), unixNanos(v.LastSeen), v.Live, v.Stopping
	w.load, w.capacity, w.count = v.Load, v.Capacity, int64(v.Mailboxes)
	w.tierHeldUntil = unixNanos(v.TierHeldUntil)
	w.org, w.hasOrg = uuidKey{}, v.DedicatedOrg != ""
	if w.hasOrg {
		org, err := parseKey("dedicated_org", v.DedicatedOrg)
		if err != nil {
			return err
		}
		w.org = org
	}
	return nil
}

// view is the row as the decider holds it.
func (m *mailbox) view() placement.MailboxView {
	v := placement.MailboxView{
		ID: keyString(m.id), OrgID: keyString(m.org), Weight: m.weight, Band: domain.RiskPool(m.band),
		Candidate: domain.RiskPool(m.candidate), PendingReason: domain.PlacementReason(m.pendingReason),
	}
	if m.candidate != "" {
		v.CandidateSince = fromNanos(m.candidateSince)
	}
	if m.hasWorker {
		v.WorkerID = keyString(m.worker)
	} else if m.pendingReason != "" {
		v.PendingSince = fromNanos(m.pendingSince)
	}
	return v
}

// set makes the row the decider's mailbox.
func (m *mailbox) set(v placement.MailboxView) error {
	org, err := parseKey("org_id", v.OrgID)
	if err != nil {
		return err
	}
	m.org, m.band, m.weight = org, string(v.Band), v.Weight
	m.candidate, m.candidateSince = string(v.Candidate), unixNanos(v.CandidateSince)
	m.worker, m.hasWorker = uuidKey{}, v.WorkerID != ""
	m.pendingReason, m.pendingSince = "", 0
	if m.hasWorker {
		if m.worker, err = parseKey("worker_id", v.WorkerID); err != nil {
			return err
		}
	} else {
		m.pendingReason, m.pendingSince = string(v.PendingReason), unixNanos(v.PendingSince)
	}
	return nil
}

// loadState makes the batch's partial state from the loaded rows.
func (f *fold) loadState() error {
	var snap placement.Snapshot
	for _, w := range f.workers {
		snap.Workers = append(snap.Workers, w.view())
	}
	for _, m := range f.mailboxes {
		snap.Mailboxes = append(snap.Mailboxes, m.view())
	}
	if f.liveness != nil {
		snap.Liveness = f.liveness.v
	}
	st, err := placement.NewPartialState(placement.DefaultConfig(), snap)
	if err != nil {
		return applyonce.Permanent(domain.CodeInvalid, fmt.Errorf("placement: the rows do not load: %w", err))
	}
	f.st = st
	return nil
}

// refresh reads the rows a decision at offset off named back out of the
// state.
func (f *fold) refresh(d domain.PlacementDecision, off int64) error {
	var err error
	keep := func(e error) {
		if err == nil {
			err = e
		}
	}
	touched(d, func(id string) {
		k, e := parseKey("worker_id", id)
		if e != nil {
			keep(e)
			return
		}
		w := f.workers[k]
		if w == nil {
			w = &worker{id: k}
			f.workers[k] = w
		}
		v, ok := f.st.Worker(id)
		w.seen, w.offset, w.dirty = ok, off, true
		if ok {
			keep(w.set(v))
		}
	}, func(id string) {
		k, e := parseKey("mailbox_id", id)
		if e != nil {
			keep(e)
			return
		}
		m := f.mailboxes[k]
		if m == nil {
			m = &mailbox{id: k}
			f.mailboxes[k] = m
		}
		v, ok := f.st.Mailbox(id)
		m.present, m.offset, m.dirty = ok, off, true
		if ok {
			keep(m.set(v))
		}
	})
	return err
}

func (f *fold) change(worker, mailbox uuidKey, off int64, added bool) {
	f.changes = append(f.changes, change{worker: worker, offset: off, mailbox: mailbox, added: added})
}

func (f *fold) record(m uuidKey, off int64, id uuidKey, d domain.PlacementDecision) *history {
	meta := d.Meta()
	f.history = append(f.history, history{mailbox: m, offset: off, id: id, typ: shortType(d.EventType()), reason: string(meta.Reason), at: meta.At})
	return &f.history[len(f.history)-1]
}

// apply folds one decision at offset off with id id.
func (f *fold) apply(off int64, id string, d domain.PlacementDecision) error {
	did, err := parseKey("decision id", id)
	if err != nil {
		return err
	}
	// A band change keeps the mailbox where it is: its change row names
	// the worker it sits on.
	var bandWorker string
	if d, ok := d.(*domain.PlacementBandChanged); ok {
		if v, ok := f.st.Mailbox(d.MailboxID); ok {
			bandWorker = v.WorkerID
		}
	}
	if err := f.st.ApplyDecision(d); err != nil {
		return applyonce.Permanent(domain.CodeInvalid, fmt.Errorf("placement: decision at offset %d (%s): %w", off, shortType(d.EventType()), err))
	}
	if err := f.refresh(d, off); err != nil {
		return err
	}
	if isLiveness(d) {
		if f.liveness == nil {
			f.liveness = &liveness{}
		}
		f.liveness.v, f.liveness.offset, f.liveness.dirty = f.st.Liveness(), off, true
	}
	if err := f.note(off, did, d, bandWorker); err != nil {
		return err
	}
	f.lastID = id
	return nil
}

// note writes what the projection keeps of a decision beyond the state: a
// plan's row, assigned_at, history and assignment changes.
func (f *fold) note(off int64, did uuidKey, d domain.PlacementDecision, bandWorker string) error {
	at := d.Meta().At
	keys := func(ids ...string) ([]uuidKey, error) {
		out := make([]uuidKey, len(ids))
		for i, id := range ids {
			var err error
			if out[i], err = parseKey("id", id); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	switch d := d.(type) {
	case *domain.PlacementPlanRecorded:
		k, err := parseKey("org_id", d.OrgID)
		if err != nil {
			return err
		}
		f.orgs[k] = &org{id: k, plan: string(d.Plan), dedicated: int32(d.DedicatedWorkers), paid: d.Paid, source: d.Source, since: at.UnixNano(), offset: off}
	case *domain.PlacementAssigned:
		k, err := keys(d.MailboxID, d.WorkerID)
		if err != nil {
			return err
		}
		f.mailboxes[k[0]].assignedAt = at
		f.change(k[1], k[0], off, true)
		h := f.record(k[0], off, did, d)
		h.to, h.hasTo, h.toBand = k[1], true, string(d.Band)
	case *domain.PlacementRefused:
		k, err := keys(d.MailboxID)
		if err != nil {
			return err
		}
		f.mailboxes[k[0]].assignedAt = time.Time{}
		h := f.record(k[0], off, did, d)
		h.toBand, h.cause = string(d.Band), string(d.Cause)
		if d.FromWorker != "" {
			from, err := parseKey("from_worker", d.FromWorker)
			if err != nil {
				return err
			}
			f.change(from, k[0], off, false)
			h.from, h.hasFrom, h.fromBand = from, true, string(d.FromBand)
		}
	case *domain.PlacementMigrated:
		k, err := keys(d.MailboxID, d.FromWorker, d.ToWorker)
		if err != nil {
			return err
		}
		f.mailboxes[k[0]].assignedAt = at
		f.change(k[1], k[0], off, false)
		f.change(k[2], k[0], off, true)
		h := f.record(k[0], off, did, d)
		h.from, h.hasFrom, h.fromBand = k[1], true, string(d.FromBand)
		h.to, h.hasTo, h.toBand = k[2], true, string(d.ToBand)
	case *domain.PlacementUnassigned:
		k, err := keys(d.MailboxID)
		if err != nil {
			return err
		}
		h := f.record(k[0], off, did, d)
		h.fromBand, h.detail = string(d.Band), d.Detail
		if d.WorkerID != "" {
			from, err := parseKey("worker_id", d.WorkerID)
			if err != nil {
				return err
			}
			f.change(from, k[0], off, false)
			h.from, h.hasFrom = from, true
		}
	case *domain.PlacementBandChanged:
		k, err := keys(d.MailboxID)
		if err != nil {
			return err
		}
		if bandWorker != "" {
			// The assignment's details changed where it is: a change row
			// saying the mailbox was on the worker before it.
			w, err := parseKey("worker_id", bandWorker)
			if err != nil {
				return err
			}
			f.change(w, k[0], off, false)
		}
		h := f.record(k[0], off, did, d)
		h.fromBand, h.toBand, h.health = string(d.FromBand), string(d.ToBand), string(d.Health)
	case *domain.PlacementBandHeld:
		k, err := keys(d.MailboxID)
		if err != nil {
			return err
		}
		h := f.record(k[0], off, did, d)
		h.fromBand, h.toBand, h.health = string(d.Band), string(d.Candidate), string(d.Health)
	}
	return nil
}
