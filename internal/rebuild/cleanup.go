package rebuild

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Leftover is a schema a rebuild created: its name has the rebuild
// pattern and it holds the marker row naming it.
type Leftover struct {
	Schema     string    `json:"schema"`
	Projection string    `json:"projection"`
	LiveSchema string    `json:"live_schema"`
	State      string    `json:"state"`
	CreatedAt  time.Time `json:"created_at"`
	// Bytes is the size of its tables and indexes.
	Bytes int64 `json:"bytes"`
}

// List returns the rebuild schemas of the live schema live's connections
// write to (their marker names it), newest first. It leaves out the live
// schema and every schema of the live pool's search_path, whatever their
// marker says.
func List(ctx context.Context, live *pgxpool.Pool) ([]Leftover, error) {
	var protected []string
	if err := live.QueryRow(ctx, `SELECT current_schemas(false)::text[]`).Scan(&protected); err != nil {
		return nil, fmt.Errorf("rebuild: live schemas: %w", err)
	}
	liveSchema, err := LiveSchema(ctx, live)
	if err != nil {
		return nil, err
	}
	rows, _ := live.Query(ctx, `SELECT n.nspname::text
FROM pg_namespace n JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = $1 AND c.relkind = 'r'
ORDER BY 1`, MarkerTable)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("rebuild: schemas with a marker: %w", err)
	}
	var out []Leftover
	for _, name := range names {
		if projectionOf(name) == "" || slices.Contains(protected, name) {
			continue
		}
		l, ok, err := readMarker(ctx, live, name)
		if err != nil {
			return nil, err
		}
		if ok && l.LiveSchema == liveSchema {
			out = append(out, l)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out, nil
}

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// readMarker reads schema's marker; ok is false unless it holds exactly one
// row naming schema and the projection its name names.
func readMarker(ctx context.Context, q querier, schema string) (Leftover, bool, error) {
	var (
		l Leftover
		n int64
	)
	err := q.QueryRow(ctx, `SELECT count(*) OVER (), schema_name, projection, live_schema, state, created_at,
    (SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
     JOIN pg_namespace ns ON ns.oid = c.relnamespace WHERE ns.nspname = $1 AND c.relkind IN ('r', 'm'))
FROM `+pgx.Identifier{schema, MarkerTable}.Sanitize()+` LIMIT 1`, schema).
		Scan(&n, &l.Schema, &l.Projection, &l.LiveSchema, &l.State, &l.CreatedAt, &l.Bytes)
	if errors.Is(err, pgx.ErrNoRows) {
		return Leftover{}, false, nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// A table of that name that is not a marker (other columns): not
		// a rebuild schema.
		return Leftover{}, false, nil
	}
	if err != nil {
		return Leftover{}, false, fmt.Errorf("rebuild: marker of %s: %w", schema, err)
	}
	if n != 1 || l.Schema != schema || l.Projection != projectionOf(schema) {
		return Leftover{}, false, nil
	}
	return l, true, nil
}

// Pick chooses what cleanup drops from ls (newest first, as List returns
// them): per projection the keep newest stay, and of the rest those
// created before olderThan ago (any age when olderThan is 0).
func Pick(ls []Leftover, keep int, olderThan time.Duration, now time.Time) (drop, stay []Leftover) {
	seen := map[string]int{}
	for _, l := range ls {
		seen[l.Projection]++
		if seen[l.Projection] <= keep || (olderThan > 0 && now.Sub(l.CreatedAt) < olderThan) {
			stay = append(stay, l)
			continue
		}
		drop = append(drop, l)
	}
	return drop, stay
}

// Drop drops one rebuild schema, in a transaction that first checks again,
// under a lock on its marker, that it still is one and is not live.
func Drop(ctx context.Context, live *pgxpool.Pool, schema string) error {
	if projectionOf(schema) == "" {
		return fmt.Errorf("rebuild: %q is not named as a rebuild schema", schema)
	}
	return pgx.BeginFunc(ctx, live, func(tx pgx.Tx) error {
		var protected []string
		if err := tx.QueryRow(ctx, `SELECT current_schemas(false)::text[]`).Scan(&protected); err != nil {
			return err
		}
		if slices.Contains(protected, schema) {
			return fmt.Errorf("rebuild: %s is the live schema", schema)
		}
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '10s'; LOCK TABLE `+pgx.Identifier{schema, MarkerTable}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`); err != nil {
			return fmt.Errorf("rebuild: %s has no marker: not a rebuild schema (%w)", schema, err)
		}
		if _, ok, err := readMarker(ctx, tx, schema); err != nil || !ok {
			return fmt.Errorf("rebuild: %s has no marker naming it: not a rebuild schema", schema)
		}
		var free bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtext($1), hashtext($2))`, lockSpace, schema).Scan(&free); err != nil {
			return err
		}
		if !free {
			return fmt.Errorf("rebuild: %s is in use by a running rebuild", schema)
		}
		_, err := tx.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		return err
	})
}
