package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/placement/engine"
)

// TxBeginner begins transactions; *pgxpool.Pool and *pgx.Conn are ones.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Snapshotter is the placement engine's production
// engine.Snapshotter: it loads the placement projection (workers,
// mailboxes, recorded plans) and its checkpoint in one repeatable-read
// snapshot, so the engine restores from Postgres and reads only the
// decision log's tail after the checkpoint.
type Snapshotter struct {
	db TxBeginner
}

// NewSnapshotter returns a snapshotter reading the projection
// through db (whose search_path selects the projection's schema).
func NewSnapshotter(db TxBeginner) *Snapshotter {
	return &Snapshotter{db: db}
}

// Load implements engine.Snapshotter. An empty projection is the empty
// state at offset 0.
func (s *Snapshotter) Load(ctx context.Context) (ck engine.Checkpoint, err error) {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return engine.Checkpoint{}, fmt.Errorf("placement snapshot: begin: %w", err)
	}
	defer func() {
		if rerr := tx.Rollback(ctx); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) && err == nil {
			err = fmt.Errorf("placement snapshot: end read: %w", rerr)
		}
	}()
	return LoadSnapshot(ctx, tx)
}

// LoadSnapshot reads the projection in tx (which should be a
// repeatable-read snapshot) as a checkpoint: the state as
// placement.NewStateFromSnapshot restores it, and the offset and last
// decision id it stands at. Fields the restore derives (a mailbox's
// degraded flag, an org's bindings, shortfall and counts, and orgs never
// recorded, which exist only through their mailboxes) are left zero.
// Workers and orgs are sorted by id (the uuid, not its text: no collation
// to apply); mailboxes come in the table's order (the state does not
// depend on it, and sorting a million rows costs Postgres seconds:
// docs/capacity.md).
func LoadSnapshot(ctx context.Context, tx pgx.Tx) (engine.Checkpoint, error) {
	c, err := ReadCheckpoint(ctx, tx)
	if err != nil {
		return engine.Checkpoint{}, err
	}
	ck := engine.Checkpoint{NextOffset: c.NextOffset, LastDecisionID: c.LastDecisionID}

	rows, _ := tx.Query(ctx, `SELECT worker_id::text, base_tier, tier, egress, address, pool, dedicated_org::text, releasing, health,
    first_seen_ns, last_seen_ns, live, stopping, load_milli, capacity, mailboxes, COALESCE(tier_held_until_ns, 0)
FROM placement_workers w ORDER BY w.worker_id`)
	var (
		v        placement.WorkerView
		org      *string
		fs, ls   int64
		held     int64
		tier     string
		baseTier string
	)
	_, err = pgx.ForEachRow(rows, []any{&v.ID, &baseTier, &tier, &v.Egress, &v.Address, &v.Pool, &org, &v.Releasing, &v.Health,
		&fs, &ls, &v.Live, &v.Stopping, &v.Load, &v.Capacity, &v.Mailboxes, &held}, func() error {
		w := v
		w.BaseTier, w.Tier = domain.Tier(baseTier), domain.Tier(tier)
		if org != nil {
			w.DedicatedOrg = *org
		}
		w.FirstSeen, w.LastSeen = fromNanos(fs), fromNanos(ls)
		if held != 0 {
			w.TierHeldUntil = fromNanos(held)
		}
		ck.State.Workers = append(ck.State.Workers, w)
		return nil
	})
	if err != nil {
		return engine.Checkpoint{}, fmt.Errorf("placement snapshot: workers: %w", err)
	}

	// Placed mailboxes are counted on their workers: the slice is sized
	// once (pending ones, rare, may grow it).
	placed := 0
	for _, w := range ck.State.Workers {
		placed += w.Mailboxes
	}
	if ck.State.Mailboxes, err = loadMailboxes(ctx, tx, placed); err != nil {
		return engine.Checkpoint{}, fmt.Errorf("placement snapshot: mailboxes: %w", err)
	}

	rows, _ = tx.Query(ctx, `SELECT org_id::text, plan, dedicated_workers, paid, plan_since_ns FROM placement_orgs o ORDER BY o.org_id`)
	var (
		o     placement.OrgView
		since int64
		plan  string
	)
	_, err = pgx.ForEachRow(rows, []any{&o.ID, &plan, &o.DedicatedWorkers, &o.Paid, &since}, func() error {
		ov := o
		ov.Recorded, ov.Plan, ov.PlanSince = true, domain.Plan(plan), fromNanos(since)
		ck.State.Orgs = append(ck.State.Orgs, ov)
		return nil
	})
	if err != nil {
		return engine.Checkpoint{}, fmt.Errorf("placement snapshot: orgs: %w", err)
	}
	if ck.State.Liveness, err = ReadLiveness(ctx, tx); err != nil {
		return engine.Checkpoint{}, fmt.Errorf("placement snapshot: %w", err)
	}
	return ck, nil
}

// ReadLiveness reads the liveness hold (the zero view when liveness was
// never held).
func ReadLiveness(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (placement.LivenessView, error) {
	l, _, err := scanLiveness(q.QueryRow(ctx, loadLivenessSQL))
	return l.v, err
}

// sqlSnapshotMailboxes reads every mailbox in one sequential scan: the
// uuids in their binary form (16 bytes, turned into text here, each org's
// and worker's once), no ORDER BY.
const sqlSnapshotMailboxes = `SELECT mailbox_id, org_id, worker_id, band, weight_milli, candidate, candidate_since_ns,
    pending_reason, pending_since_ns
FROM placement_mailboxes`

// loadMailboxes reads the mailboxes of the snapshot from their rows' raw
// values: at a million rows, scanning each column into its own new value
// (a string per uuid, a pointer per nullable column) was most of the
// load's allocations. Org and worker ids, bands and reasons are shared
// strings, one per distinct value.
func loadMailboxes(ctx context.Context, tx pgx.Tx, sizeHint int) ([]placement.MailboxView, error) {
	rows, err := tx.Query(ctx, sqlSnapshotMailboxes)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var dec rawDecoder
	for _, fd := range rows.FieldDescriptions() {
		dec.formats = append(dec.formats, fd.Format)
	}
	if len(dec.formats) != 9 {
		return nil, fmt.Errorf("%d columns, want 9", len(dec.formats))
	}
	ids, words := map[string]string{}, map[string]string{}
	out := make([]placement.MailboxView, 0, sizeHint)
	for rows.Next() {
		raw := rows.RawValues()
		var m placement.MailboxView
		m.ID = dec.uuid(raw, 0, nil)
		m.OrgID = dec.uuid(raw, 1, ids)
		if raw[2] != nil {
			m.WorkerID = dec.uuid(raw, 2, ids)
		}
		m.Band = domain.RiskPool(dec.word(raw, 3, words))
		m.Weight = dec.int8(raw, 4)
		if raw[5] != nil && raw[6] != nil {
			m.Candidate, m.CandidateSince = domain.RiskPool(dec.word(raw, 5, words)), fromNanos(dec.int8(raw, 6))
		}
		if raw[7] != nil && raw[8] != nil {
			m.PendingReason, m.PendingSince = domain.PlacementReason(dec.word(raw, 7, words)), fromNanos(dec.int8(raw, 8))
		}
		if dec.err != nil {
			return nil, fmt.Errorf("mailbox %s: %w", m.ID, dec.err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// rawDecoder decodes raw column values in either wire format (pgx asks
// for binary uuids and bigints; a simple-protocol connection answers
// text). Its first error sticks.
type rawDecoder struct {
	formats []int16
	err     error
}

// uuid returns column i, a non-null uuid, as text; with in, through in
// (keyed by the raw value), so each distinct id is one string.
func (d *rawDecoder) uuid(raw [][]byte, i int, in map[string]string) string {
	b := raw[i]
	if in != nil {
		if s, ok := in[string(b)]; ok {
			return s
		}
	}
	var s string
	switch {
	case d.formats[i] == pgx.BinaryFormatCode && len(b) == 16:
		s = domain.FormatUUID([16]byte(b))
	case d.formats[i] == pgx.TextFormatCode && len(b) == 36:
		s = string(b)
	default:
		d.fail(fmt.Errorf("column %d: not a uuid (%d bytes, format %d)", i, len(b), d.formats[i]))
		return ""
	}
	if in != nil {
		in[string(b)] = s
	}
	return s
}

// word returns column i, text, through in.
func (d *rawDecoder) word(raw [][]byte, i int, in map[string]string) string {
	if s, ok := in[string(raw[i])]; ok {
		return s
	}
	s := string(raw[i])
	in[s] = s
	return s
}

// int8 returns column i, a non-null bigint.
func (d *rawDecoder) int8(raw [][]byte, i int) int64 {
	b := raw[i]
	if d.formats[i] == pgx.BinaryFormatCode {
		if len(b) != 8 {
			d.fail(fmt.Errorf("column %d: not a bigint (%d bytes)", i, len(b)))
			return 0
		}
		return int64(binary.BigEndian.Uint64(b))
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		d.fail(fmt.Errorf("column %d: %w", i, err))
	}
	return n
}

func (d *rawDecoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

// fromNanos is a stored Unix-nanosecond time as the decider holds it (UTC).
func fromNanos(ns int64) time.Time { return time.Unix(0, ns).UTC() }

var _ engine.Snapshotter = (*Snapshotter)(nil)
