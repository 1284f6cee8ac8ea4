package projection

import (
	"context"
	"errors"
	"fmt"
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
func LoadSnapshot(ctx context.Context, tx pgx.Tx) (engine.Checkpoint, error) {
	c, err := ReadCheckpoint(ctx, tx)
	if err != nil {
		return engine.Checkpoint{}, err
	}
	ck := engine.Checkpoint{NextOffset: c.NextOffset, LastDecisionID: c.LastDecisionID}

	rows, _ := tx.Query(ctx, `SELECT worker_id::text, base_tier, tier, egress, address, pool, dedicated_org::text, releasing, health,
    first_seen_ns, last_seen_ns, live, stopping, load_milli, capacity, mailboxes
FROM placement_workers ORDER BY worker_id`)
	var (
		v        placement.WorkerView
		org      *string
		fs, ls   int64
		tier     string
		baseTier string
	)
	_, err = pgx.ForEachRow(rows, []any{&v.ID, &baseTier, &tier, &v.Egress, &v.Address, &v.Pool, &org, &v.Releasing, &v.Health,
		&fs, &ls, &v.Live, &v.Stopping, &v.Load, &v.Capacity, &v.Mailboxes}, func() error {
		w := v
		w.BaseTier, w.Tier = domain.Tier(baseTier), domain.Tier(tier)
		if org != nil {
			w.DedicatedOrg = *org
		}
		w.FirstSeen, w.LastSeen = plTime(fs), plTime(ls)
		ck.State.Workers = append(ck.State.Workers, w)
		return nil
	})
	if err != nil {
		return engine.Checkpoint{}, fmt.Errorf("placement snapshot: workers: %w", err)
	}

	rows, _ = tx.Query(ctx, `SELECT mailbox_id::text, org_id::text, worker_id::text, band, weight_milli, candidate, candidate_since_ns,
    pending_reason, pending_since_ns
FROM placement_mailboxes ORDER BY mailbox_id`)
	var (
		m                    placement.MailboxView
		worker, cand, reason *string
		candSince, pendSince *int64
	)
	_, err = pgx.ForEachRow(rows, []any{&m.ID, &m.OrgID, &worker, &m.Band, &m.Weight, &cand, &candSince, &reason, &pendSince}, func() error {
		mv := m
		if worker != nil {
			mv.WorkerID = *worker
		}
		if cand != nil && candSince != nil {
			mv.Candidate, mv.CandidateSince = domain.RiskPool(*cand), plTime(*candSince)
		}
		if reason != nil && pendSince != nil {
			mv.PendingReason, mv.PendingSince = domain.PlacementReason(*reason), plTime(*pendSince)
		}
		ck.State.Mailboxes = append(ck.State.Mailboxes, mv)
		return nil
	})
	if err != nil {
		return engine.Checkpoint{}, fmt.Errorf("placement snapshot: mailboxes: %w", err)
	}

	rows, _ = tx.Query(ctx, `SELECT org_id::text, plan, dedicated_workers, paid, plan_since_ns FROM placement_orgs ORDER BY org_id`)
	var (
		o     placement.OrgView
		since int64
		plan  string
	)
	_, err = pgx.ForEachRow(rows, []any{&o.ID, &plan, &o.DedicatedWorkers, &o.Paid, &since}, func() error {
		ov := o
		ov.Recorded, ov.Plan, ov.PlanSince = true, domain.Plan(plan), plTime(since)
		ck.State.Orgs = append(ck.State.Orgs, ov)
		return nil
	})
	if err != nil {
		return engine.Checkpoint{}, fmt.Errorf("placement snapshot: orgs: %w", err)
	}
	return ck, nil
}

// plTime is a stored Unix-nanosecond time as the decider holds it (UTC).
func plTime(ns int64) time.Time { return time.Unix(0, ns).UTC() }

var _ engine.Snapshotter = (*Snapshotter)(nil)
