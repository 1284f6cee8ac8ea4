// Package rebuild rebuilds a projection from the log into a fresh schema,
// verifies it row for row against the live schema, and swaps it in
// (`mailplane rebuild registry|placement|health`, docs/runbook.md). A
// rebuild of the same log yields identical rows, so a rebuild that differs
// from the live projection says the live one drifted (or the code
// changed), and swapping the rebuild in repairs it.
//
// Rebuild is the one driver of every projection (Start with RegistrySpec,
// HealthSpec or PlacementSpec; one Config, one Progress): the fresh schema
// and the marker that says mailplane made it, the passes over the log, the
// row-for-row comparison, the one-transaction swap, and the cleanup of old
// rebuild schemas. What differs is the fold (fold): the projections of the
// generic projector are applied through applyonce.Run, the transaction the
// live projector runs; the placement projection's decision log is folded
// by its own fold (postgres.Builder, then Projection.ApplyDecisions, as
// its live projector).
package rebuild

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/internal/backoff"
)

// The projections a rebuild knows.
const (
	Registry  = "registry"
	Placement = "placement"
	Health    = "health"
)

// Projections lists them, in the order commands show them.
var Projections = []string{Registry, Placement, Health}

// MarkerTable is the table a rebuild writes into its schema, first thing,
// in the transaction that creates the schema: one row naming the schema,
// the projection and the live schema. Cleanup drops only a schema whose
// name has the rebuild pattern AND that holds this row naming it, so it
// never drops a schema mailplane did not create.
const MarkerTable = "mailplane_rebuild"

// States of a rebuild schema, in its marker.
const (
	// StateBuilding: the rebuild is being written or was left unfinished.
	StateBuilding = "building"
	// StateBuilt: the rebuild is complete and was not swapped in.
	StateBuilt = "built"
	// StatePrevious: swapped; the schema holds the projection that was
	// live before the swap.
	StatePrevious = "previous"
)

// nameRE is the pattern of a rebuild schema's name:
// <prefix>_<projection>_<digits>, at most 58 characters (room for the
// swap's "_swap" schema).
var nameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*_(registry|placement|health)_[0-9]+$`)

const maxName = 58

// nameSeq makes default names unique within a process, from a random
// start so that two processes differ too (Start also tries another name
// when one is taken).
var nameSeq atomic.Uint32

func init() { nameSeq.Store(rand.Uint32N(1_000_000)) }

// DefaultName is a rebuild schema's default name: <live>_<projection>_<unix
// seconds><6 digits, unique>, the live name shortened when needed: two
// rebuilds started in the same second get different names.
func DefaultName(live, projection string, now time.Time) string {
	tail := fmt.Sprintf("_%s_%d%06d", projection, now.Unix(), nameSeq.Add(1)%1_000_000)
	if len(live)+len(tail) > maxName {
		live = live[:maxName-len(tail)]
	}
	return live + tail
}

// CheckName refuses a schema name that is not a rebuild name of
// projection (see DefaultName), or that is the live schema.
func CheckName(name, projection, live string) error {
	m := nameRE.FindStringSubmatch(name)
	if m == nil || len(name) > maxName || m[1] != projection {
		return fmt.Errorf("schema %q: a rebuild schema is named <prefix>_%s_<digits> in lower case, at most %d characters, so that rebuild cleanup recognises it",
			name, projection, maxName)
	}
	if name == live {
		return fmt.Errorf("schema %q is the live schema", name)
	}
	return nil
}

// projectionOf is the projection a rebuild name names, or "".
func projectionOf(name string) string {
	if m := nameRE.FindStringSubmatch(name); m != nil && len(name) <= maxName {
		return m[1]
	}
	return ""
}

// LiveSchema is the schema pool's connections write to (the first
// existing schema of their search_path).
func LiveSchema(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var live *string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&live); err != nil {
		return "", fmt.Errorf("rebuild: live schema: %w", err)
	}
	if live == nil {
		return "", errors.New("rebuild: the live pool's search_path names no existing schema")
	}
	return *live, nil
}

// Create creates schema, with its marker (StateBuilding), in one
// transaction through the live pool. The schema must not exist.
func Create(ctx context.Context, live *pgxpool.Pool, projection, liveSchema, schema string) error {
	if err := CheckName(schema, projection, liveSchema); err != nil {
		return err
	}
	id := pgx.Identifier{schema}.Sanitize()
	marker := pgx.Identifier{schema, MarkerTable}.Sanitize()
	err := pgx.BeginFunc(ctx, live, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `CREATE SCHEMA `+id+`;
CREATE TABLE `+marker+` (
    schema_name text        PRIMARY KEY,
    projection  text        NOT NULL,
    live_schema text        NOT NULL,
    created_at  timestamptz NOT NULL,
    state       text        NOT NULL CHECK (state IN ('building', 'built', 'previous'))
);
COMMENT ON SCHEMA `+id+` IS 'mailplane rebuild: a rebuild of the `+projection+` projection (see its `+MarkerTable+` table)'`)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+marker+` (schema_name, projection, live_schema, created_at, state)
VALUES ($1, $2, $3, now(), $4)`, schema, projection, liveSchema, StateBuilding)
		return err
	})
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P06" {
		return fmt.Errorf("rebuild: create schema %s: %w", schema, errSchemaExists)
	}
	if err != nil {
		return fmt.Errorf("rebuild: create schema %s: %w", schema, err)
	}
	return nil
}

// errSchemaExists: Create found the schema there already.
var errSchemaExists = errors.New("the schema exists")

// Execer is a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// SetState records a rebuild schema's state in its marker.
func SetState(ctx context.Context, q Execer, schema, state string) error {
	_, err := q.Exec(ctx, `UPDATE `+pgx.Identifier{schema, MarkerTable}.Sanitize()+` SET state = $1 WHERE schema_name = $2`, state, schema)
	if err != nil {
		return fmt.Errorf("rebuild: mark %s %s: %w", schema, state, err)
	}
	return nil
}

// Pool opens a small pool like live's whose connections write to schema
// (search_path set after connecting, so it wins over one in the URL; and
// checked).
func Pool(ctx context.Context, live *pgxpool.Pool, schema string) (*pgxpool.Pool, error) {
	pc := live.Config().Copy()
	id := pgx.Identifier{schema}.Sanitize()
	pc.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET search_path = `+id)
		return err
	}
	pc.MaxConns, pc.MinConns = 2, 0
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("rebuild: pool on %s: %w", schema, err)
	}
	var cur *string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&cur); err != nil || cur == nil || *cur != schema {
		pool.Close()
		return nil, fmt.Errorf("rebuild: the rebuild's connections are not in schema %s (%v, %v)", schema, cur, err)
	}
	return pool, nil
}

// DropSchema drops a schema this process just created (a failed rebuild),
// bounded even when ctx is done.
func DropSchema(ctx context.Context, live *pgxpool.Pool, schema string) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, err := live.Exec(dctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	return err
}

// Relation is a table or a view of a projection.
type Relation struct {
	Name string
	View bool
}

// Relations lists the tables and views of schema that match.
func Relations(ctx context.Context, tx pgx.Tx, schema string, match func(name string) bool) ([]Relation, error) {
	rows, _ := tx.Query(ctx, `SELECT c.relname, c.relkind = 'v'
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'v', 'p')
ORDER BY c.relname`, schema)
	var out []Relation
	var r Relation
	if _, err := pgx.ForEachRow(rows, []any{&r.Name, &r.View}, func() error {
		if match(r.Name) {
			out = append(out, r)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("rebuild: relations of %s: %w", schema, err)
	}
	return out, nil
}

// Named matches the names given.
func Named(names ...string) func(string) bool {
	return func(n string) bool { return slices.Contains(names, n) }
}

// SameRelations refuses two lists that differ (a schema migrated further
// than the other).
func SameRelations(live, rebuilt []Relation, liveSchema, rebuiltSchema string) error {
	a, b := relNames(live), relNames(rebuilt)
	if a != b || a == "" {
		return fmt.Errorf("rebuild: the relations of %s (%s) differ from the rebuild's in %s (%s); migrate both first",
			liveSchema, a, rebuiltSchema, b)
	}
	return nil
}

func relNames(rs []Relation) string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.Name
	}
	return strings.Join(names, ",")
}

// MoveRelations exchanges rels between the live and the rebuilt schema
// inside tx: the rebuilt ones take the live names' place (ALTER ... SET
// SCHEMA keeps every relation's identity, indexes and constraints), the
// live ones move to the rebuilt schema. The caller holds the locks that
// order it with the projection's writers. Connections of the live
// projector keep their search_path (the live schema's name), so their next
// statement finds the swapped-in tables: Postgres re-plans a prepared
// statement whose relations changed, resolving names again.
func MoveRelations(ctx context.Context, tx pgx.Tx, live, rebuilt string, rels []Relation) error {
	tmp := rebuilt + "_swap"
	move := func(from, to string) []string {
		var out []string
		for _, r := range rels {
			kind := "TABLE"
			if r.View {
				kind = "VIEW"
			}
			out = append(out, fmt.Sprintf("ALTER %s %s SET SCHEMA %s", kind, pgx.Identifier{from, r.Name}.Sanitize(), pgx.Identifier{to}.Sanitize()))
		}
		return out
	}
	stmts := []string{"CREATE SCHEMA " + pgx.Identifier{tmp}.Sanitize()}
	stmts = append(stmts, move(live, tmp)...)
	stmts = append(stmts, move(rebuilt, live)...)
	stmts = append(stmts, move(tmp, rebuilt)...)
	stmts = append(stmts, "DROP SCHEMA "+pgx.Identifier{tmp}.Sanitize())
	if _, err := tx.Exec(ctx, strings.Join(stmts, ";\n")); err != nil {
		return fmt.Errorf("rebuild: swap: %w", err)
	}
	return nil
}

// Retry runs a swap transaction again when it deadlocked with, or timed
// out waiting for, another transaction (a reader of the projection),
// after 100 ms, then 200 ms and 400 ms at most, half jittered so two
// swaps that collided do not collide again.
func Retry(ctx context.Context, attempts int, fn func() error, onRetry func(attempt int, err error)) error {
	b := backoff.New(backoff.Policy{Floor: 100 * time.Millisecond, Cap: 400 * time.Millisecond, Jitter: backoff.Half}, nil)
	for attempt := 1; ; attempt++ {
		err := fn()
		var pe *pgconn.PgError
		if err == nil || attempt >= attempts || !errors.As(err, &pe) || (pe.Code != "40P01" && pe.Code != "55P03") {
			return err
		}
		if onRetry != nil {
			onRetry(attempt, err)
		}
		if err := backoff.Sleep(ctx, b.Next()); err != nil {
			return err
		}
	}
}

// Hold takes the session lock that marks schema in use by a running
// rebuild, on a connection of pool held until release: Drop refuses a
// schema whose lock is held.
func Hold(ctx context.Context, pool *pgxpool.Pool, schema string) (release func(), err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("rebuild: hold %s: %w", schema, err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext($1), hashtext($2))`, lockSpace, schema).Scan(&ok); err != nil || !ok {
		conn.Release()
		if err == nil {
			err = errors.New("another rebuild holds it")
		}
		return nil, fmt.Errorf("rebuild: hold %s: %w", schema, err)
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock(hashtext($1), hashtext($2))`, lockSpace, schema); err != nil {
			// The lock is the session's: closing the connection frees it.
			_ = conn.Conn().Close(uctx)
		}
		conn.Release()
	}, nil
}

// lockSpace keys the advisory locks of rebuild schemas.
const lockSpace = "mailplane rebuild"
