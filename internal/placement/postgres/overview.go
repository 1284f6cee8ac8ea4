package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/internal/placement"
)

// Overview is the placement projection as an operator reads it, from one
// snapshot: pools, workers, dedicated shortfalls and pending placements.
// Its JSON form is what `placement show --format json` prints.
type Overview struct {
	// NextOffset is the decision-log offset the rows stand at.
	NextOffset int64     `json:"next_offset"`
	Pools      []PoolRow `json:"pools"`
	// DeadWorkers are listed until the engine forgets them; OldestDead is
	// the oldest one's last heartbeat.
	DeadWorkers int64     `json:"dead_workers"`
	OldestDead  time.Time `json:"oldest_dead"`
	// Liveness is the engine's liveness hold (placement_liveness): while
	// Holding, no worker is declared dead for silence.
	Liveness placement.LivenessView `json:"liveness"`
	// Workers is filled when asked for, by tier, pool and id.
	Workers    []WorkerRow `json:"workers"`
	Shortfalls []Shortfall `json:"dedicated_shortfalls"`
	// Refused have no worker; Degraded wait on shared premium for
	// dedicated capacity. Pending lists the oldest of both.
	Refused  int64        `json:"refused"`
	Degraded int64        `json:"degraded"`
	Pending  []PendingRow `json:"pending"`
}

// PoolRow is one (tier, pool) of placement_pool_summary.
type PoolRow struct {
	Tier            string `json:"tier"`
	Pool            string `json:"pool"`
	Workers         int64  `json:"workers"`
	LiveWorkers     int64  `json:"live_workers"`
	EligibleWorkers int64  `json:"eligible_workers"`
	LoadMilli       int64  `json:"load_milli"`
	Capacity        int64  `json:"capacity"`
	LiveCapacity    int64  `json:"live_capacity"`
	Count           int64  `json:"mailboxes"`
}

// WorkerRow is one worker.
type WorkerRow struct {
	Tier         string    `json:"tier"`
	Pool         string    `json:"pool"`
	ID           string    `json:"worker_id"`
	Egress       string    `json:"egress"`
	Health       string    `json:"health"`
	Live         bool      `json:"live"`
	Stopping     bool      `json:"stopping"`
	Releasing    bool      `json:"releasing"`
	LoadMilli    int64     `json:"load_milli"`
	Capacity     int64     `json:"capacity"`
	Mailboxes    int64     `json:"mailboxes"`
	DedicatedOrg string    `json:"dedicated_org,omitempty"`
	LastSeen     time.Time `json:"last_seen"`
}

// Shortfall is a dedicated org with fewer bound workers than its plan.
type Shortfall struct {
	OrgID string `json:"org_id"`
	Want  int64  `json:"want"`
	Have  int64  `json:"have"`
}

// PendingRow is a pending placement.
type PendingRow struct {
	MailboxID   string    `json:"mailbox_id"`
	OrgID       string    `json:"org_id"`
	Band        string    `json:"band"`
	Reason      string    `json:"reason"`
	WeightMilli int64     `json:"weight_milli"`
	Since       time.Time `json:"since"`
	// WorkerID is the shared worker a degraded mailbox waits on, "" for a
	// refused one.
	WorkerID string `json:"worker_id,omitempty"`
}

// MailboxStory is one mailbox's placement and every decision about it.
type MailboxStory struct {
	// Placed is false for an unknown or removed mailbox; History may still
	// hold its decisions.
	Placed        bool         `json:"placed"`
	OrgID         string       `json:"org_id,omitempty"`
	Band          string       `json:"band,omitempty"`
	WorkerID      string       `json:"worker_id,omitempty"`
	Tier          string       `json:"tier,omitempty"`
	PendingReason string       `json:"pending_reason,omitempty"`
	WeightMilli   int64        `json:"weight_milli"`
	Degraded      bool         `json:"degraded"`
	History       []HistoryRow `json:"history"`
}

// HistoryRow is one decision about a mailbox.
type HistoryRow struct {
	Offset     int64     `json:"offset"`
	At         time.Time `json:"at"`
	Type       string    `json:"type"`
	Reason     string    `json:"reason"`
	FromWorker string    `json:"from_worker,omitempty"`
	ToWorker   string    `json:"to_worker,omitempty"`
	FromBand   string    `json:"from_band,omitempty"`
	ToBand     string    `json:"to_band,omitempty"`
	Cause      string    `json:"cause,omitempty"`
	Detail     string    `json:"detail,omitempty"`
	Health     string    `json:"health,omitempty"`
}

const (
	poolOrder = `array_position(ARRAY['clean','risky','quarantine'], pool)`
	sqlPools  = `SELECT tier, pool, workers, live_workers, eligible_workers, load_milli, capacity, live_capacity, mailboxes
FROM placement_pool_summary ORDER BY tier, ` + poolOrder
	sqlDead    = `SELECT count(*), min(last_seen) FROM placement_workers WHERE NOT live`
	sqlWorkers = `SELECT tier, pool, worker_id::text, egress, health, live, stopping, releasing, load_milli, capacity, mailboxes,
    COALESCE(dedicated_org::text, ''), last_seen
FROM placement_workers ORDER BY tier, ` + poolOrder + `, worker_id`
	sqlShortfalls = `SELECT c.org_id::text, c.dedicated_workers, count(w.worker_id) FILTER (WHERE NOT w.releasing)
FROM placement_org_classes c
LEFT JOIN placement_workers w ON w.dedicated_org = c.org_id AND w.tier = 'dedicated'
WHERE c.class = 'dedicated'
GROUP BY 1, 2
HAVING count(w.worker_id) FILTER (WHERE NOT w.releasing) < c.dedicated_workers
ORDER BY 1`
	sqlPendingCounts = `SELECT count(*) FILTER (WHERE worker_id IS NULL), count(*) FILTER (WHERE worker_id IS NOT NULL)
FROM placement_pending`
	sqlPending = `SELECT mailbox_id::text, org_id::text, band, weight_milli, reason, since, COALESCE(worker_id::text, '')
FROM placement_pending ORDER BY since, mailbox_id LIMIT $1`
	sqlMailboxStatus = `SELECT org_id::text, band, weight_milli, COALESCE(worker_id::text, ''), COALESCE(tier, ''), degraded,
    COALESCE(pending_reason, '')
FROM placement_mailbox_status WHERE mailbox_id = $1`
	sqlHistory = `SELECT decision_offset, at, type, reason, COALESCE(from_worker::text, ''), COALESCE(to_worker::text, ''),
    COALESCE(from_band, ''), COALESCE(to_band, ''), COALESCE(cause, ''), COALESCE(detail, ''), COALESCE(health, '')
FROM placement_history WHERE mailbox_id = $1 ORDER BY decision_offset`
)

// read runs fn in one read-only repeatable-read transaction: one snapshot.
func (s *Store) read(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("placement store: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	return fn(tx)
}

// Overview reads the overview, the workers only when workers is set and at
// most pendingLimit pending placements.
func (s *Store) Overview(ctx context.Context, workers bool, pendingLimit int) (Overview, error) {
	var o Overview
	err := s.read(ctx, func(tx pgx.Tx) error {
		ck, err := ReadCheckpoint(ctx, tx)
		if err != nil {
			return err
		}
		o.NextOffset = ck.NextOffset
		if o.Pools, err = collect(ctx, tx, "pools", sqlPools, nil, func(r *PoolRow) []any {
			return []any{&r.Tier, &r.Pool, &r.Workers, &r.LiveWorkers, &r.EligibleWorkers, &r.LoadMilli, &r.Capacity, &r.LiveCapacity, &r.Count}
		}); err != nil {
			return err
		}
		var oldest *time.Time
		if err := tx.QueryRow(ctx, sqlDead).Scan(&o.DeadWorkers, &oldest); err != nil {
			return fmt.Errorf("placement store: dead workers: %w", err)
		}
		if oldest != nil {
			o.OldestDead = oldest.UTC()
		}
		if o.Liveness, err = ReadLiveness(ctx, tx); err != nil {
			return fmt.Errorf("placement store: %w", err)
		}
		if workers {
			if o.Workers, err = collect(ctx, tx, "workers", sqlWorkers, nil, func(r *WorkerRow) []any {
				return []any{&r.Tier, &r.Pool, &r.ID, &r.Egress, &r.Health, &r.Live, &r.Stopping, &r.Releasing,
					&r.LoadMilli, &r.Capacity, &r.Mailboxes, &r.DedicatedOrg, &r.LastSeen}
			}); err != nil {
				return err
			}
		}
		if o.Shortfalls, err = collect(ctx, tx, "dedicated shortfalls", sqlShortfalls, nil, func(r *Shortfall) []any {
			return []any{&r.OrgID, &r.Want, &r.Have}
		}); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, sqlPendingCounts).Scan(&o.Refused, &o.Degraded); err != nil {
			return fmt.Errorf("placement store: pending: %w", err)
		}
		o.Pending, err = collect(ctx, tx, "pending", sqlPending, []any{pendingLimit}, func(r *PendingRow) []any {
			return []any{&r.MailboxID, &r.OrgID, &r.Band, &r.WeightMilli, &r.Reason, &r.Since, &r.WorkerID}
		})
		return err
	})
	return o, err
}

// Mailbox reads one mailbox's placement and history.
func (s *Store) Mailbox(ctx context.Context, id string) (MailboxStory, error) {
	var m MailboxStory
	err := s.read(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, sqlMailboxStatus, id).Scan(&m.OrgID, &m.Band, &m.WeightMilli, &m.WorkerID, &m.Tier, &m.Degraded, &m.PendingReason)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return fmt.Errorf("placement store: mailbox: %w", err)
		default:
			m.Placed = true
		}
		m.History, err = collect(ctx, tx, "history", sqlHistory, []any{id}, func(r *HistoryRow) []any {
			return []any{&r.Offset, &r.At, &r.Type, &r.Reason, &r.FromWorker, &r.ToWorker, &r.FromBand, &r.ToBand, &r.Cause, &r.Detail, &r.Health}
		})
		return err
	})
	return m, err
}

// collect reads every row of sql into a T through the scan targets fields
// names.
func collect[T any](ctx context.Context, tx pgx.Tx, what, sql string, args []any, fields func(*T) []any) ([]T, error) {
	rows, _ := tx.Query(ctx, sql, args...)
	var out []T
	var r T
	if _, err := pgx.ForEachRow(rows, fields(&r), func() error {
		out = append(out, r)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("placement store: %s: %w", what, err)
	}
	return out, nil
}
