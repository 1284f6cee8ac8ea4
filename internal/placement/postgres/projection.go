// Package postgres is the placement projection in Postgres (named after
// its technology, as internal/projections holds the projector of the
// registry and health projections): the decision log folded
// into Postgres through the decider's own fold (placement.State.ApplyDecision
// over the rows a batch names), its runner, the rebuild builder, the
// engine's snapshotter, and Store, the one reader of its tables (the worker
// API and placement show). See docs/architecture.md §6.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/applyonce"
	"github.com/mailplane/mailplane/topics"
)

// Projection is the placement projection: the decision log
// (topics.PlacementDecisions, one partition) folded into the tables of
// migration 0005_placement — placement_workers, placement_orgs,
// placement_mailboxes (with the views placement_assignments,
// placement_pending, placement_mailbox_status,
// placement_dedicated_bindings, placement_org_classes and
// placement_pool_summary), placement_assignment_changes,
// placement_history — and placement_checkpoint, the decision-log offset
// the rows stand at.
//
// Unlike Registry it is not a Projection run by Projector: its rows need
// each decision's log offset (change tokens, the checkpoint the engine
// restores from, history), which Projection.Apply does not give, and the
// runtime's decoder (topics.Decode) knows domain events, not decisions. It
// has its own runner, Projector, with the same guarantees: rows,
// checkpoint and the projector_offsets row written in one transaction;
// batches applied with set-based SQL (COPY, COPY into staging tables and
// one UPDATE per table, unnest upserts); the fold a function of the log
// alone, so a rebuild reproduces the rows (Builder, or
// ApplyDecisions over placement.ReadDecisions in batches of any size).
type Projection struct {
	log string // the decision log's name, in the namespace
}

// New returns the placement projection of the decision log in namespace ns.
func New(ns topics.Namespace) *Projection {
	return &Projection{log: ns.Topic(topics.PlacementDecisions)}
}

// Name is the placement projection's name: its projector_offsets
// rows and its runner's client id use it, and projection.Name
// reads its position under it.
const Name = "placement"

// Name returns Name.
func (*Projection) Name() string { return Name }

// Topics returns the decision log.
func (p *Projection) Topics() []string { return []string{p.log} }

// Record is one decision with its decision-log offset.
type Record struct {
	Offset   int64
	Decision topics.Decision
	// Appended is the record's append time on the broker.
	Appended time.Time
}

// ApplyDecisions folds recs (in log order, offsets increasing, every one at
// or above the checkpoint) into the rows in tx and moves
// placement_checkpoint to next (past the last record, and past any
// transaction markers after it), and the projection's projector_offsets
// row (projector "placement") with it. recs may be empty: the checkpoint then
// only moves. It does not check where the checkpoint was; callers that
// may race lock it first (LockCheckpoint). It must not be called
// twice with the same decisions.
func (p *Projection) ApplyDecisions(ctx context.Context, tx pgx.Tx, recs []Record, next int64) error {
	lastID := ""
	if len(recs) > 0 {
		if last := recs[len(recs)-1].Offset; next <= last {
			return fmt.Errorf("placement: next offset %d is not past the last decision's %d", next, last)
		}
		f := newFold()
		if err := f.load(ctx, tx, recs); err != nil {
			return err
		}
		prev := int64(-1)
		for _, r := range recs {
			if r.Offset <= prev {
				return fmt.Errorf("placement: offsets out of order: %d after %d", r.Offset, prev)
			}
			prev = r.Offset
			if r.Decision.Data == nil {
				return applyonce.Permanent(domain.CodeRequired, fmt.Errorf("placement: decision at offset %d has no data", r.Offset))
			}
			if err := f.apply(r.Offset, r.Decision.ID, r.Decision.Data); err != nil {
				return err
			}
		}
		if err := f.write(ctx, tx); err != nil {
			return err
		}
		lastID = f.lastID
	}
	return setPlacementCheckpoint(ctx, tx, p.log, next, lastID)
}

const (
	readCheckpointSQL = `SELECT next_offset, last_decision_id::text FROM placement_checkpoint`
	lockCheckpointSQL = `SELECT next_offset FROM placement_checkpoint FOR UPDATE`
	// The row exists from the first batch on; a first batch inserts it,
	// and two first batches racing collide on the key (one fails).
	setCheckpointSQL = `INSERT INTO placement_checkpoint (singleton, next_offset, last_decision_id)
VALUES (true, $1, $2::uuid)
ON CONFLICT (singleton) DO UPDATE SET next_offset = EXCLUDED.next_offset,
    last_decision_id = COALESCE(EXCLUDED.last_decision_id, placement_checkpoint.last_decision_id)`
)

// Checkpoint is where the placement projection stands.
type Checkpoint struct {
	// NextOffset is the first decision-log offset not folded into the rows.
	NextOffset int64
	// LastDecisionID is the ce_id of the last decision folded, "" if none.
	LastDecisionID string
}

// ReadCheckpoint reads the checkpoint (offset 0 when the
// projection is empty).
func ReadCheckpoint(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (Checkpoint, error) {
	var c Checkpoint
	var id *string
	err := q.QueryRow(ctx, readCheckpointSQL).Scan(&c.NextOffset, &id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Checkpoint{}, nil
	case err != nil:
		return Checkpoint{}, fmt.Errorf("placement: read checkpoint: %w", err)
	}
	if id != nil {
		c.LastDecisionID = *id
	}
	return c, nil
}

// LockCheckpoint locks the checkpoint row in tx and returns its
// offset (0 when there is no row yet: nothing to lock, and the first
// batch's insert is what two racing writers collide on).
func LockCheckpoint(ctx context.Context, tx pgx.Tx) (int64, error) {
	var next int64
	err := tx.QueryRow(ctx, lockCheckpointSQL).Scan(&next)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("placement: lock checkpoint: %w", err)
	}
	return next, nil
}

// setPlacementCheckpoint moves placement_checkpoint and, with it, the
// projection's projector_offsets row: the position the worker API hands
// out as change token and lag dashboards read. The row names the decision
// log (log) as the broker does, in the deployment's namespace.
func setPlacementCheckpoint(ctx context.Context, tx pgx.Tx, log string, next int64, lastID string) error {
	var id any
	if lastID != "" {
		id = lastID
	}
	b := &pgx.Batch{}
	b.Queue(setCheckpointSQL, next, id)
	// The checkpoint is the fence (LockCheckpoint); the position row
	// follows it, written by the one writer of positions.
	var m applyonce.Moves
	m.Add(log, 0, -1, next)
	applyonce.QueueSet(b, Name, m, time.Now())
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("placement: set checkpoint: %w", err)
	}
	return nil
}

// ---- loading the rows a batch names ----

const (
	loadWorkersSQL = `SELECT worker_id, base_tier, tier, egress, address, pool, dedicated_org, releasing, health,
    first_seen_ns, last_seen_ns, live, stopping, load_milli, capacity, mailboxes, decision_offset, COALESCE(tier_held_until_ns, 0)
FROM placement_workers
WHERE worker_id = ANY($1)
   OR worker_id IN (SELECT worker_id FROM placement_mailboxes WHERE mailbox_id = ANY($2) AND worker_id IS NOT NULL)`
	loadMailboxesSQL = `SELECT mailbox_id, org_id, worker_id, band, weight_milli, candidate, candidate_since_ns,
    pending_reason, pending_since_ns, assigned_at, decision_offset
FROM placement_mailboxes WHERE mailbox_id = ANY($1)`
	loadLivenessSQL = `SELECT holding, held_since_ns, COALESCE(resumed_at_ns, 0), silent_workers, live_workers,
    share_permille, threshold_permille, decision_offset
FROM placement_liveness WHERE scope = 'fleet'`
)

// touchedKeys returns the workers and mailboxes a batch's decisions
// name, and whether one of them is a liveness decision.
func touchedKeys(recs []Record) (wids, mids [][16]byte, liveness bool, err error) {
	wset := map[uuidKey]struct{}{}
	mset := map[uuidKey]struct{}{}
	add := func(set map[uuidKey]struct{}, field string) func(string) {
		return func(s string) {
			k, kerr := parseKey(field, s)
			if kerr != nil {
				if err == nil {
					err = kerr
				}
				return
			}
			set[k] = struct{}{}
		}
	}
	for _, r := range recs {
		if r.Decision.Data != nil {
			touched(r.Decision.Data, add(wset, "worker_id"), add(mset, "mailbox_id"))
			liveness = liveness || isLiveness(r.Decision.Data)
		}
	}
	if err != nil {
		return nil, nil, false, err
	}
	wids = make([][16]byte, 0, len(wset))
	for k := range wset {
		wids = append(wids, k)
	}
	mids = make([][16]byte, 0, len(mset))
	for k := range mset {
		mids = append(mids, k)
	}
	return wids, mids, liveness, nil
}

func (f *fold) load(ctx context.Context, tx pgx.Tx, recs []Record) error {
	wids, mids, liveness, err := touchedKeys(recs)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	b.Queue(loadWorkersSQL, wids, mids)
	b.Queue(loadMailboxesSQL, mids)
	if liveness {
		b.Queue(loadLivenessSQL)
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()

	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("placement: load workers: %w", err)
	}
	var (
		w   worker
		org pgtype.UUID
	)
	_, err = pgx.ForEachRow(rows, []any{&w.id, &w.baseTier, &w.tier, &w.egress, &w.address, &w.pool, &org, &w.releasing, &w.health,
		&w.firstSeen, &w.lastSeen, &w.live, &w.stopping, &w.load, &w.capacity, &w.count, &w.offset, &w.tierHeldUntil}, func() error {
		row := w
		row.org, row.hasOrg = org.Bytes, org.Valid
		row.inDB, row.seen = true, true
		f.workers[row.id] = &row
		return nil
	})
	if err != nil {
		return fmt.Errorf("placement: load workers: %w", err)
	}

	rows, err = br.Query()
	if err != nil {
		return fmt.Errorf("placement: load mailboxes: %w", err)
	}
	var (
		m                       mailbox
		worker                  pgtype.UUID
		candidate, pending      *string
		candSince, pendingSince *int64
		assignedAt              *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&m.id, &m.org, &worker, &m.band, &m.weight, &candidate, &candSince,
		&pending, &pendingSince, &assignedAt, &m.offset}, func() error {
		row := m
		row.worker, row.hasWorker = worker.Bytes, worker.Valid
		if candidate != nil && candSince != nil {
			row.candidate, row.candidateSince = *candidate, *candSince
		}
		if pending != nil && pendingSince != nil {
			row.pendingReason, row.pendingSince = *pending, *pendingSince
		}
		if assignedAt != nil {
			row.assignedAt = assignedAt.UTC()
		}
		row.present, row.inDB = true, true
		f.mailboxes[row.id] = &row
		return nil
	})
	if err != nil {
		return fmt.Errorf("placement: load mailboxes: %w", err)
	}
	if liveness {
		if err := f.loadLiveness(br); err != nil {
			return err
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("placement: load: %w", err)
	}
	return f.loadState()
}

// loadLiveness reads the placement_liveness row, if any.
func (f *fold) loadLiveness(br pgx.BatchResults) error {
	l, ok, err := scanLiveness(br.QueryRow())
	if err != nil {
		return fmt.Errorf("placement: load %w", err)
	}
	if ok {
		l.inDB = true
		f.liveness = &l
	}
	return nil
}

// scanLiveness scans a loadLivenessSQL row; ok is false when there is none.
func scanLiveness(row pgx.Row) (l liveness, ok bool, err error) {
	var (
		held, resumed    int64
		share, threshold int32
	)
	err = row.Scan(&l.v.Holding, &held, &resumed, &l.v.Silent, &l.v.Live, &share, &threshold, &l.offset)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return liveness{}, false, nil
	case err != nil:
		return liveness{}, false, fmt.Errorf("liveness: %w", err)
	}
	l.v.HeldSince, l.v.SharePermille, l.v.ThresholdPermille = fromNanos(held), int64(share), int64(threshold)
	if resumed != 0 {
		l.v.ResumedAt = fromNanos(resumed)
	}
	return l, true, nil
}

// ---- writing the fold back ----

var (
	workerColumns = []string{"worker_id", "base_tier", "tier", "egress", "address", "pool", "dedicated_org", "releasing", "health",
		"first_seen_ns", "last_seen_ns", "live", "stopping", "load_milli", "capacity", "mailboxes", "decision_offset", "tier_held_until_ns"}
	mailboxColumns = []string{"mailbox_id", "org_id", "worker_id", "band", "weight_milli", "candidate", "candidate_since_ns",
		"pending_reason", "pending_since_ns", "assigned_at", "decision_offset"}
	historyColumns = []string{"mailbox_id", "decision_offset", "decision_id", "type", "reason", "at",
		"from_worker", "to_worker", "from_band", "to_band", "cause", "detail", "health"}
	changeColumns = []string{"worker_id", "decision_offset", "mailbox_id", "change"}
)

// Staging tables for rows that exist already, created once per session
// and emptied at every commit. LIKE copies the column types (generated
// columns come over as plain ones, never written).
const (
	stageWorkers   = `CREATE TEMP TABLE IF NOT EXISTS placement_stage_workers (LIKE placement_workers) ON COMMIT DELETE ROWS`
	stageMailboxes = `CREATE TEMP TABLE IF NOT EXISTS placement_stage_mailboxes (LIKE placement_mailboxes) ON COMMIT DELETE ROWS`
)

func setList(cols []string) string {
	var b strings.Builder
	for i, c := range cols[1:] {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(c + " = s." + c)
	}
	return b.String()
}

var (
	mergeWorkersSQL = `UPDATE placement_workers AS t SET ` + setList(workerColumns) +
		` FROM placement_stage_workers AS s WHERE t.worker_id = s.worker_id`
	mergeMailboxesSQL = `UPDATE placement_mailboxes AS t SET ` + setList(mailboxColumns) +
		` FROM placement_stage_mailboxes AS s WHERE t.mailbox_id = s.mailbox_id`
)

const (
	deleteMailboxesSQL = `DELETE FROM placement_mailboxes WHERE mailbox_id = ANY($1)`
	deleteWorkersSQL   = `DELETE FROM placement_workers WHERE worker_id = ANY($1)`
	upsertLivenessSQL  = `INSERT INTO placement_liveness (scope, holding, held_since_ns, resumed_at_ns, silent_workers, live_workers,
    share_permille, threshold_permille, decision_offset)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (scope) DO UPDATE SET holding = EXCLUDED.holding, held_since_ns = EXCLUDED.held_since_ns,
    resumed_at_ns = EXCLUDED.resumed_at_ns, silent_workers = EXCLUDED.silent_workers, live_workers = EXCLUDED.live_workers,
    share_permille = EXCLUDED.share_permille, threshold_permille = EXCLUDED.threshold_permille,
    decision_offset = EXCLUDED.decision_offset`
	upsertOrgsSQL = `INSERT INTO placement_orgs (org_id, plan, dedicated_workers, paid, source, plan_since_ns, decision_offset)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::int4[], $4::bool[], $5::text[], $6::int8[], $7::int8[])
ON CONFLICT (org_id) DO UPDATE SET plan = EXCLUDED.plan, dedicated_workers = EXCLUDED.dedicated_workers,
    paid = EXCLUDED.paid, source = EXCLUDED.source, plan_since_ns = EXCLUDED.plan_since_ns,
    decision_offset = EXCLUDED.decision_offset`
)

func nullUUID(k uuidKey, ok bool) any {
	if !ok {
		return nil
	}
	return pgtype.UUID{Bytes: k, Valid: true}
}

func nullText(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func (w *worker) row() []any {
	return []any{pgtype.UUID{Bytes: w.id, Valid: true}, w.baseTier, w.tier, w.egress, w.address, w.pool, nullUUID(w.org, w.hasOrg),
		w.releasing, w.health, w.firstSeen, w.lastSeen, w.live, w.stopping, w.load, w.capacity, int32(w.count), w.offset, nullNs(w.tierHeldUntil)}
}

// nullNs is a stored time, NULL for none.
func nullNs(ns int64) any {
	if ns == 0 {
		return nil
	}
	return ns
}

func (m *mailbox) row() []any {
	var candSince, pendingSince, assignedAt any
	if m.candidate != "" {
		candSince = m.candidateSince
	}
	if m.pendingReason != "" {
		pendingSince = m.pendingSince
	}
	if m.hasWorker {
		assignedAt = m.assignedAt
	}
	return []any{pgtype.UUID{Bytes: m.id, Valid: true}, pgtype.UUID{Bytes: m.org, Valid: true}, nullUUID(m.worker, m.hasWorker),
		m.band, m.weight, nullText(m.candidate), candSince, nullText(m.pendingReason), pendingSince, assignedAt, m.offset}
}

// write writes the fold's rows: new rows COPYed straight into their
// tables, changed ones COPYed into staging tables and merged with one
// UPDATE each, removed mailboxes and forgotten workers deleted, plans upserted, history and
// assignment changes COPYed.
func (f *fold) write(ctx context.Context, tx pgx.Tx) error {
	r := f.rows()
	if err := r.copy(ctx, tx); err != nil {
		return err
	}
	if err := f.copyAppendOnly(ctx, tx); err != nil {
		return err
	}
	return r.merge(ctx, tx, f.orgs, f.liveness)
}

// rows are a batch's rows to write: fresh ones (COPYed into their
// tables), stale ones (COPYed into staging tables and merged), gone ones
// (deleted).
type rows struct {
	freshW, staleW, freshM, staleM [][]any
	goneW, goneM                   [][16]byte
}

func (f *fold) rows() rows {
	var r rows
	for _, w := range f.workers {
		switch {
		case !w.dirty:
		case !w.seen: // forgotten
			if w.inDB {
				r.goneW = append(r.goneW, w.id)
			}
		case w.inDB:
			r.staleW = append(r.staleW, w.row())
		default:
			r.freshW = append(r.freshW, w.row())
		}
	}
	for _, m := range f.mailboxes {
		switch {
		case !m.dirty:
		case !m.present:
			if m.inDB {
				r.goneM = append(r.goneM, m.id)
			}
		case m.inDB:
			r.staleM = append(r.staleM, m.row())
		default:
			r.freshM = append(r.freshM, m.row())
		}
	}
	return r
}

// copy makes the staging tables it needs and COPYs the rows.
func (r rows) copy(ctx context.Context, tx pgx.Tx) error {
	var stages []string
	if len(r.staleW) > 0 {
		stages = append(stages, stageWorkers)
	}
	if len(r.staleM) > 0 {
		stages = append(stages, stageMailboxes)
	}
	if len(stages) > 0 {
		if _, err := tx.Exec(ctx, strings.Join(stages, ";\n")); err != nil {
			return fmt.Errorf("placement: staging tables: %w", err)
		}
	}
	copies := []struct {
		table string
		cols  []string
		rows  [][]any
	}{
		{"placement_workers", workerColumns, r.freshW},
		{"placement_stage_workers", workerColumns, r.staleW},
		{"placement_mailboxes", mailboxColumns, r.freshM},
		{"placement_stage_mailboxes", mailboxColumns, r.staleM},
	}
	for _, c := range copies {
		if len(c.rows) == 0 {
			continue
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{c.table}, c.cols, pgx.CopyFromRows(c.rows)); err != nil {
			return fmt.Errorf("placement: copy into %s: %w", c.table, err)
		}
	}
	return nil
}

// copyAppendOnly COPYs the history and assignment-change rows.
func (f *fold) copyAppendOnly(ctx context.Context, tx pgx.Tx) error {
	return AppendOnly{history: f.history, changes: f.changes}.WriteAppendOnly(ctx, tx)
}

// merge merges the staged rows, deletes the gone ones and upserts the
// plans, in one round trip.
func (r rows) merge(ctx context.Context, tx pgx.Tx, orgs map[uuidKey]*org, liveness *liveness) error {
	b := &pgx.Batch{}
	if liveness != nil && liveness.dirty {
		b.Queue(upsertLivenessSQL, liveness.row()...)
	}
	if len(r.staleW) > 0 {
		b.Queue(mergeWorkersSQL)
	}
	if len(r.staleM) > 0 {
		b.Queue(mergeMailboxesSQL)
	}
	if len(r.goneM) > 0 {
		b.Queue(deleteMailboxesSQL, r.goneM)
	}
	if len(r.goneW) > 0 {
		b.Queue(deleteWorkersSQL, r.goneW)
	}
	if len(orgs) > 0 {
		n := len(orgs)
		ids, plans, ded, paid, src, since, offs := make([][16]byte, 0, n), make([]string, 0, n), make([]int32, 0, n),
			make([]bool, 0, n), make([]string, 0, n), make([]int64, 0, n), make([]int64, 0, n)
		for _, o := range orgs {
			ids, plans, ded = append(ids, o.id), append(plans, o.plan), append(ded, o.dedicated)
			paid, src, since, offs = append(paid, o.paid), append(src, o.source), append(since, o.since), append(offs, o.offset)
		}
		b.Queue(upsertOrgsSQL, ids, plans, ded, paid, src, since, offs)
	}
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("placement: merge: %w", err)
	}
	return nil
}

// historySource streams history rows to COPY without building [][]any.
type historySource struct {
	rows []history
	i    int
	buf  [13]any
}

func (s *historySource) Next() bool { s.i++; return s.i < len(s.rows) }
func (s *historySource) Err() error { return nil }
func (s *historySource) Values() ([]any, error) {
	h := &s.rows[s.i]
	s.buf = [13]any{pgtype.UUID{Bytes: h.mailbox, Valid: true}, h.offset, pgtype.UUID{Bytes: h.id, Valid: true}, h.typ, h.reason, h.at,
		nullUUID(h.from, h.hasFrom), nullUUID(h.to, h.hasTo), nullText(h.fromBand), nullText(h.toBand),
		nullText(h.cause), nullText(h.detail), nullText(h.health)}
	return s.buf[:], nil
}

// changeSource streams assignment changes to COPY.
type changeSource struct {
	rows []change
	i    int
	buf  [4]any
}

func (s *changeSource) Next() bool { s.i++; return s.i < len(s.rows) }
func (s *changeSource) Err() error { return nil }
func (s *changeSource) Values() ([]any, error) {
	c := &s.rows[s.i]
	kind := "removed"
	if c.added {
		kind = "added"
	}
	s.buf = [4]any{pgtype.UUID{Bytes: c.worker, Valid: true}, c.offset, pgtype.UUID{Bytes: c.mailbox, Valid: true}, kind}
	return s.buf[:], nil
}
