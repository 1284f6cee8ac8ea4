// Package migrations holds mailplane's Postgres schema as embedded, numbered
// SQL files and applies the pending ones.
//
// Migrations run in the schema the connection's search_path selects, so the
// same files build the live schema, a rebuild's fresh schema and every test's
// private schema. Files are never edited once released: a change is a new
// file with the next number.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed sql/*.sql
var files embed.FS

// Migration is one numbered SQL file.
type Migration struct {
	Version int
	Name    string // file name without the number and .sql: "registry"
	SQL     string
}

var fileRE = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.sql$`)

// All returns every embedded migration in version order. It panics if the
// embedded files are misnamed or numbered with gaps or repeats, which a unit
// test catches before any release.
func All() []Migration {
	ms, err := load(files)
	if err != nil {
		panic(err)
	}
	return ms
}

func load(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, "sql")
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, e := range entries {
		m := fileRE.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migrations: %s is not named NNNN_name.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		b, err := fs.ReadFile(fsys, path.Join("sql", e.Name()))
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: m[2], SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migrations: expected version %04d, found %04d_%s", i+1, m.Version, m.Name)
		}
	}
	return ms, nil
}

// lockClass is the fixed first key of the advisory lock Apply holds. The
// second key is the hash of the target schema, so that runners migrating the
// same schema take turns while tests migrating their own schemas do not wait
// for each other.
const lockClass int32 = 0x6d706c6e // "mpln"

const (
	lockSQL   = `SELECT pg_advisory_lock($1::int4, hashtext(current_schema()))`
	unlockSQL = `SELECT pg_advisory_unlock($1::int4, hashtext(current_schema()))`

	createTableSQL = `CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`
	appliedSQL = `SELECT version FROM schema_migrations`
	recordSQL  = `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`
)

// Option configures Apply.
type Option func(*config)

type config struct {
	logger *slog.Logger
}

// WithLogger logs each migration applied.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// DefaultTimeout bounds Apply when ctx has no deadline.
const DefaultTimeout = 5 * time.Minute

// Apply applies every pending migration to the schema the pool's
// search_path selects, each in its own transaction and in order, recording
// it in schema_migrations. Concurrent callers on one schema serialize on an
// advisory lock held by a dedicated connection; the loser finds nothing left
// to do. When ctx has no deadline, DefaultTimeout applies.
func Apply(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	cfg := config{logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&cfg)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	ms := All()

	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrations: acquire connection: %w", err)
	}
	defer conn.Release()

	var schema *string
	if err := conn.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return fmt.Errorf("migrations: current schema: %w", err)
	}
	if schema == nil {
		// With no existing schema on the search_path, CREATE TABLE would fail
		// later with a less helpful message.
		return errors.New("migrations: the search_path names no existing schema")
	}

	if _, err := conn.Exec(ctx, lockSQL, lockClass); err != nil {
		return fmt.Errorf("migrations: advisory lock: %w", err)
	}
	defer func() {
		// ctx may be done by now; the unlock still needs to happen, or the
		// pooled connection would carry the lock to its next user.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, unlockSQL, lockClass); err != nil {
			// Closing the session is the other way to release the lock.
			_ = conn.Conn().Close(uctx)
		}
	}()

	if _, err := conn.Exec(ctx, createTableSQL); err != nil {
		return fmt.Errorf("migrations: create schema_migrations: %w", err)
	}
	rows, err := conn.Query(ctx, appliedSQL)
	if err != nil {
		return fmt.Errorf("migrations: read schema_migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return fmt.Errorf("migrations: read schema_migrations: %w", err)
	}
	done := make(map[int]bool, len(versions))
	for _, v := range versions {
		done[int(v)] = true
	}

	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		start := time.Now()
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			// No arguments: pgx sends the file with the simple protocol, so
			// a file may hold several statements.
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, recordSQL, m.Version, m.Name)
			return err
		})
		if err != nil {
			return fmt.Errorf("migrations: apply %04d_%s: %w", m.Version, m.Name, err)
		}
		cfg.logger.InfoContext(ctx, "migration applied", "version", m.Version, "name", m.Name,
			"schema", *schema, "duration", time.Since(start))
	}
	return nil
}

// Pending returns the migrations not yet applied to the pool's schema.
func Pending(ctx context.Context, pool *pgxpool.Pool) ([]Migration, error) {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	done := map[int]bool{}
	if exists {
		rows, err := pool.Query(ctx, appliedSQL)
		if err != nil {
			return nil, fmt.Errorf("migrations: read schema_migrations: %w", err)
		}
		vs, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return nil, fmt.Errorf("migrations: read schema_migrations: %w", err)
		}
		for _, v := range vs {
			done[int(v)] = true
		}
	}
	var out []Migration
	for _, m := range All() {
		if !done[m.Version] {
			out = append(out, m)
		}
	}
	return out, nil
}
