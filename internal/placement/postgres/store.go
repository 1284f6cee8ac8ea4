package postgres

import (
	"context"
	"errors"
	"fmt"

	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/workerapi"
)

// Store reads the placement projection for its readers: it is the
// workerapi.AssignmentStore and workerapi.KnownWorkers of the worker API. It
// reads, in one read-only repeatable-read transaction (one snapshot):
//
//   - projector_offsets: the placement projector's next offset on the
//     decision log (partition 0), which is the token of every answer;
//   - placement_assignment_retention: retained_from, the lowest decision
//     offset whose changes are still kept;
//   - placement_assignments: one row per placed mailbox;
//   - placement_assignment_changes: per worker, the mailboxes added to and
//     removed from it, by decision offset.
//
// The projector writes all four in the transaction of each batch, so one
// snapshot is always consistent. The tables are migration
// 0005_placement's (placement_assignments is a view of
// placement_mailboxes).
type Store struct {
	db TxBeginner
	// projector names the position row; the placement projector has one,
	// on the decision log's only partition, whatever the namespace.
	projector string
}

// StoreOption configures a Store.
type StoreOption func(*Store)

// WithProjector names the projector whose decision-log offset is the
// projection's position (default Name).
func WithStoreProjector(name string) StoreOption { return func(s *Store) { s.projector = name } }

// NewStore returns a store reading the placement projection through db
// (whose connections' search_path selects the projection's schema).
func NewStore(db TxBeginner, opts ...StoreOption) *Store {
	s := &Store{db: db, projector: Name}
	for _, o := range opts {
		o(s)
	}
	return s
}

const (
	sqlPosition = `
SELECT
  COALESCE((SELECT next_offset FROM projector_offsets
            WHERE projector = $1 AND partition = 0), 0),
  COALESCE((SELECT retained_from FROM placement_assignment_retention), 0)`

	sqlFull = `
SELECT mailbox_id::text, org_id::text, band, weight_milli, assigned_at
FROM placement_assignments
WHERE worker_id = $1::uuid
ORDER BY mailbox_id`

	// For each mailbox with a change on the worker since the token: the
	// first change tells whether it was on the worker at the token ("removed"
	// first: it was), the current row whether it is now. On now: added
	// (upsert, with current details); gone now but there then: removed;
	// added and removed again in between: nothing.
	sqlChanges = `
WITH c AS (
  SELECT mailbox_id,
         (array_agg(change ORDER BY decision_offset))[1] AS first_change
  FROM placement_assignment_changes
  WHERE worker_id = $1::uuid AND decision_offset >= $2 AND decision_offset < $3
  GROUP BY mailbox_id
)
SELECT c.mailbox_id::text, c.first_change,
       a.mailbox_id IS NOT NULL, a.org_id::text, a.band, a.weight_milli, a.assigned_at
FROM c
LEFT JOIN placement_assignments a ON a.mailbox_id = c.mailbox_id AND a.worker_id = $1::uuid
ORDER BY c.mailbox_id`
)

// Assignments implements workerapi.AssignmentStore.
func (s *Store) Assignments(ctx context.Context, workerID string, since workerapi.Token) (res workerapi.Result, err error) {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return workerapi.Result{}, fmt.Errorf("placement store: begin: %w", err)
	}
	defer func() {
		if rerr := tx.Rollback(ctx); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) && err == nil {
			err = fmt.Errorf("placement store: end read: %w", rerr)
		}
	}()

	var next, retainedFrom int64
	if err := tx.QueryRow(ctx, sqlPosition, s.projector).Scan(&next, &retainedFrom); err != nil {
		return workerapi.Result{}, fmt.Errorf("placement store: read projection position: %w", err)
	}
	res.Token = workerapi.TokenAt(next)

	if since.IsZero() {
		res.Full = true
		rows, _ := tx.Query(ctx, sqlFull, workerID)
		res.Mailboxes, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (workerapi.Assignment, error) {
			var a workerapi.Assignment
			err := row.Scan(&a.MailboxID, &a.OrgID, &a.Band, &a.WeightMilli, &a.AssignedAt)
			a.AssignedAt = a.AssignedAt.UTC()
			return a, err
		})
		if err != nil {
			return workerapi.Result{}, fmt.Errorf("placement store: read assignments: %w", err)
		}
		return res, nil
	}

	// A token below the retention horizon may have lost changes; one ahead
	// of the projection comes from another history (a restored database,
	// another cluster). Either way only a full resync is right.
	if since.Offset() < retainedFrom || since.Offset() > next {
		return workerapi.Result{}, workerapi.ErrTokenExpired
	}
	rows, _ := tx.Query(ctx, sqlChanges, workerID, since.Offset(), next)
	var (
		mailbox, first string
		present        bool
		orgID, band    *string
		weight         *int64
		at             *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&mailbox, &first, &present, &orgID, &band, &weight, &at}, func() error {
		switch {
		case present:
			res.Added = append(res.Added, workerapi.Assignment{
				MailboxID: mailbox, OrgID: *orgID, Band: domain.RiskPool(*band), WeightMilli: *weight,
				AssignedAt: at.UTC(),
			})
		case first == "removed":
			res.Removed = append(res.Removed, mailbox)
		}
		return nil
	})
	if err != nil {
		return workerapi.Result{}, fmt.Errorf("placement store: read assignment changes: %w", err)
	}
	return res, nil
}

// Execer runs statements; pgx.Tx, *pgx.Conn and *pgxpool.Pool are ones.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// PruneChanges deletes the assignment changes below decision offset before
// and raises the retention horizon to it, so tokens older than before are
// answered with 410 expired (full resync) rather than with a partial list.
// Run it in one transaction (db a pgx.Tx, or a pool: the statement is
// one). The horizon never moves down. It returns the rows deleted.
//
// A rebuilt projection (mailplane rebuild) keeps every change; compare it
// with the live one above the live horizon, or prune it to the same horizon
// before verifying.
func PruneChanges(ctx context.Context, db Execer, before int64) (int64, error) {
	if before < 0 {
		return 0, fmt.Errorf("placement store: prune below %d: negative offset", before)
	}
	tag, err := db.Exec(ctx, `
WITH horizon AS (
  INSERT INTO placement_assignment_retention (singleton, retained_from) VALUES (true, $1)
  ON CONFLICT (singleton) DO UPDATE
    SET retained_from = GREATEST(placement_assignment_retention.retained_from, EXCLUDED.retained_from)
  RETURNING retained_from
)
DELETE FROM placement_assignment_changes
WHERE decision_offset < (SELECT retained_from FROM horizon)`, before)
	if err != nil {
		return 0, fmt.Errorf("placement store: prune assignment changes: %w", err)
	}
	return tag.RowsAffected(), nil
}

// KnownWorkers implements workerapi.KnownWorkers.
func (s *Store) KnownWorkers(ctx context.Context, ids []string) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, workerapi.DefaultQueryTimeout)
	defer cancel()
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("placement store: known workers: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, _ := tx.Query(ctx, `SELECT worker_id::text FROM placement_workers WHERE worker_id = ANY($1::uuid[])`, ids)
	known, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("placement store: known workers: %w", err)
	}
	out := make(map[string]bool, len(known))
	for _, id := range known {
		out[id] = true
	}
	return out, nil
}
