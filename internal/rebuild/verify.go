package rebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/internal/applyonce"
	"github.com/mailplane/mailplane/internal/kafka"
)

// Report is the outcome of a verify.
type Report struct {
	// Positions are where both sides stood when compared.
	Positions []Position    `json:"positions"`
	Tables    []TableReport `json:"tables"`
}

// Equal reports whether every table matched row for row.
func (r Report) Equal() bool { return AllEqual(r.Tables) }

// Format writes the report: the positions compared at, then the tables.
func (r Report) Format(w io.Writer) {
	fmt.Fprintln(w, "compared at", DescribePositions(r.Positions))
	FormatTables(w, r.Tables)
}

// DescribePositions: "offset N" for one partition, else per partition.
func DescribePositions(ps []Position) string {
	if len(ps) == 1 {
		return fmt.Sprintf("offset %d", ps[0].Next)
	}
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = fmt.Sprintf("%s/%d@%d", p.Topic, p.Partition, p.Next)
	}
	return "offsets " + strings.Join(parts, " ")
}

// FormatTables writes table reports as a table, then "identical" or
// "DIFFERENT".
func FormatTables(w io.Writer, ts []TableReport) {
	fmt.Fprintf(w, "%-32s %12s %12s %10s %12s %8s\n", "TABLE", "LIVE ROWS", "REBUILT", "ONLY LIVE", "ONLY REBUILT", "SKIPPED")
	for _, t := range ts {
		fmt.Fprintf(w, "%-32s %12d %12d %10d %12d %8d\n", t.Table, t.LiveRows, t.RebuiltRows, t.OnlyLive, t.OnlyRebuilt, t.Skipped)
	}
	for _, t := range ts {
		if t.Skipped > 0 {
			fmt.Fprintf(w, "  %s: %d rows not compared: %s\n", t.Table, t.Skipped, t.SkipWhy)
		}
		for _, s := range t.Samples {
			fmt.Fprintf(w, "  %s: %s\n", t.Table, s)
		}
	}
	if AllEqual(ts) {
		fmt.Fprintln(w, "identical")
	} else {
		fmt.Fprintln(w, "DIFFERENT")
	}
}

// ErrLiveBehind: the live projection stayed behind the rebuild, so the two
// could not be compared at one position (is the projector running?).
var ErrLiveBehind = errors.New("rebuild: the live projection is behind the rebuild")

// Verify compares the rebuild with the live projection row for row, both
// at the same position on every partition: in one snapshot of the live
// schema it reads the live projector's positions; where the live side is
// ahead the rebuild catches up to exactly its position first, where it is
// behind Verify waits for it (up to wait), then fails with ErrLiveBehind
// saying where each stands. projector_offsets is compared as positions,
// not rows (its updated_at is the wall clock), and applied_events is not
// compared (bookkeeping of the same log). A placement rebuild also adopts
// the live retention horizon of assignment changes first (decisionFold's
// settle).
func (r *Rebuild) Verify(ctx context.Context, wait time.Duration) (Report, error) {
	if r.swapped {
		return Report{}, errors.New("rebuild: the rebuild was swapped in")
	}
	deadline := time.Now().Add(wait)
	for {
		rep, behind, err := r.verifyOnce(ctx)
		if err != nil || behind == nil {
			return rep, err
		}
		if time.Now().After(deadline) {
			return Report{}, fmt.Errorf("%w after waiting %s: %s", ErrLiveBehind, wait, behind)
		}
		select {
		case <-ctx.Done():
			return Report{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// verifyOnce compares in one live snapshot; behind, when set, says where
// the live side was behind.
func (r *Rebuild) verifyOnce(ctx context.Context) (rep Report, behind error, err error) {
	for {
		tx, err := r.cfg.Live.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return Report{}, nil, fmt.Errorf("rebuild: begin: %w", err)
		}
		live, err := applyonce.InSchema(ctx, tx, r.live, r.name, false)
		if err != nil {
			_ = tx.Rollback(ctx)
			return Report{}, nil, err
		}
		ahead := map[kafka.Partition]int64{}
		for p, n := range r.next {
			if live[p] < n {
				_ = tx.Rollback(ctx)
				return Report{}, fmt.Errorf("%s: live at offset %d, the rebuild at %d", p, live[p], n), nil
			}
		}
		for p, n := range live {
			if n > r.next[p] {
				ahead[p] = n
			}
		}
		if len(ahead) > 0 {
			_ = tx.Rollback(ctx)
			if err := r.CatchUp(ctx, ahead); err != nil {
				return Report{}, nil, err
			}
			continue
		}
		again, err := r.fold.settle(ctx, r, tx)
		if err != nil {
			_ = tx.Rollback(ctx)
			return Report{}, nil, err
		}
		if again {
			continue
		}
		ts, err := CompareTables(ctx, tx, r.live, r.schema, r.spec.Tables)
		_ = tx.Rollback(ctx)
		return Report{Positions: r.Positions(), Tables: ts}, nil, err
	}
}

// Swap swaps the rebuild in, in one transaction on the live schema, and
// marks the rebuild's schema StatePrevious: afterwards it holds the
// projection that was live before the swap, for rebuild cleanup. A
// transaction that deadlocks with a reader is retried.
func (r *Rebuild) Swap(ctx context.Context) error {
	if r.swapped {
		return errors.New("rebuild: already swapped")
	}
	swap := func(tx pgx.Tx) error {
		if err := r.fold.swap(ctx, r, tx); err != nil {
			return err
		}
		return SetState(ctx, tx, r.schema, StatePrevious)
	}
	err := Retry(ctx, 5, func() error { return pgx.BeginFunc(ctx, r.cfg.Live, swap) }, func(attempt int, err error) {
		r.cfg.Logger.Warn("swap collided with another transaction; retrying", "attempt", attempt, "err", err)
	})
	if err != nil {
		return err
	}
	r.swapped = true
	r.pool.Close()
	r.cfg.Logger.Info("rebuilt projection swapped in", "projection", r.name, "live", r.live, "previous", r.schema)
	return nil
}

// swap of a projection of the generic projector, in tx on the live schema:
// it
// locks the live projector's offset rows (waiting for the projector's
// transaction in flight and holding its next one back: the projector
// locks them first too, so the two never deadlock), catches the rebuild up
// to where the live projector stands, exchanges the projection's tables
// between the two schemas (MoveRelations) and the projector's
// projector_offsets and applied_events rows with them. The live projector
// then finds its offsets where it left them (or, where the rebuild was
// ahead, moved: its fence check sends it on from there) and its next
// statements resolve to the swapped-in tables. Afterwards the rebuild's
// schema holds the previous projection.
func (eventFold) swap(ctx context.Context, r *Rebuild, tx pgx.Tx) error {
	names := make([]string, len(r.spec.Tables))
	for i, t := range r.spec.Tables {
		names[i] = t.Name
	}
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '30s'`); err != nil {
		return err
	}
	live, err := applyonce.InSchema(ctx, tx, r.live, r.name, true)
	if err != nil {
		return err
	}
	if r.spec.Publishes {
		for p, n := range r.next {
			if live[p] < n {
				return fmt.Errorf("%w: %s: live at offset %d, the rebuild at %d; the live %s projector would never publish what it decides for the records in between: swap once it has caught up",
					ErrLiveBehind, p, live[p], n, r.name)
			}
		}
	}
	ahead := map[kafka.Partition]int64{}
	for p, n := range live {
		if n > r.next[p] {
			ahead[p] = n
		}
	}
	if len(ahead) > 0 {
		// On the rebuild's own connections: the live locks held
		// here do not touch its tables.
		if err := r.CatchUp(ctx, ahead); err != nil {
			return err
		}
	}
	lr, err := Relations(ctx, tx, r.live, Named(names...))
	if err != nil {
		return err
	}
	rr, err := Relations(ctx, tx, r.schema, Named(names...))
	if err != nil {
		return err
	}
	if err := SameRelations(lr, rr, r.live, r.schema); err != nil {
		return err
	}
	if len(lr) != len(names) {
		return fmt.Errorf("rebuild: the live schema %s lacks some of %v", r.live, names)
	}
	if err := noDependents(ctx, tx, r.live, names); err != nil {
		return err
	}
	if err := MoveRelations(ctx, tx, r.live, r.schema, lr); err != nil {
		return err
	}
	// The bookkeeping rows go with the tables: the live projector
	// resumes from the rebuild's positions, and skips the events
	// the rebuild applied.
	if err := applyonce.ExchangeRows(ctx, tx, r.live, r.schema, r.name); err != nil {
		return err
	}
	return nil
}

// noDependents refuses a swap that would leave a view or a foreign key of
// another table bound to the tables moved out: both follow a table by
// identity, not by name, so they would read the previous projection.
func noDependents(ctx context.Context, tx pgx.Tx, schema string, tables []string) error {
	rows, _ := tx.Query(ctx, `SELECT DISTINCT dep.relname::text
FROM pg_class t
JOIN pg_namespace n ON n.oid = t.relnamespace
JOIN pg_depend d ON d.refobjid = t.oid
LEFT JOIN pg_rewrite rw ON rw.oid = d.objid AND d.classid = 'pg_rewrite'::regclass
LEFT JOIN pg_constraint c ON c.oid = d.objid AND d.classid = 'pg_constraint'::regclass AND c.contype = 'f'
JOIN pg_class dep ON dep.oid = COALESCE(rw.ev_class, c.conrelid)
WHERE n.nspname = $1 AND t.relname = ANY($2) AND NOT dep.relname = ANY($2)
ORDER BY 1`, schema, tables)
	deps, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("rebuild: dependents of %v: %w", tables, err)
	}
	if len(deps) > 0 {
		return fmt.Errorf("rebuild: %v depend on the tables the swap moves (%v); swap them too, or drop them first", deps, tables)
	}
	return nil
}
