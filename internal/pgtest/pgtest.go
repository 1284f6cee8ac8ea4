// Package pgtest gives each test its own PostgreSQL schema, in the style of
// riverqueue/river's test helpers: tests share one server and one database,
// run in parallel, and never see each other's tables.
//
// The server comes from MAILPLANE_TEST_DATABASE_URL (.ci/run sets it). When
// that is unset on a developer machine, pgtest starts a private cluster from
// the system's PostgreSQL binaries under /tmp/mailplane-pgtest on port 54339,
// once per test binary; the cluster is left running afterwards so the next
// `go test` starts instantly (stop it with
// `scripts/pg-private.sh stop /tmp/mailplane-pgtest 54339`). In CI (CI
// non-empty) the variable is required. pgtest never skips: a test that needs
// Postgres and cannot have it fails, with the reason.
//
// Typical use:
//
//	func TestThing(t *testing.T) {
//		t.Parallel()
//		db := pgtest.New(t) // or: pool := pgtest.Schema(t)
//		// db.Pool's connections use search_path = db.Schema.
//		// db.URL does the same for a subprocess or a second pool.
//	}
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/internal/pgcluster"
)

// EnvURL names the variable holding the test server's base URL. The URL's
// database is shared by all tests; isolation comes from schemas.
const EnvURL = "MAILPLANE_TEST_DATABASE_URL"

// The private cluster used when EnvURL is unset outside CI. Its port is not
// pgcluster's default, so it never collides with `mailplane dev`.
const (
	PrivateDir  = "/tmp/mailplane-pgtest"
	PrivatePort = 54339
)

// lockPath serializes private-cluster start-up across test binaries: `go test
// ./...` runs several packages at once and each would otherwise race to
// initdb the same directory. It sits outside PrivateDir because that
// directory belongs to the postgres user.
const lockPath = "/tmp/mailplane-pgtest.lock"

// MaxConns caps each test's pool. Many tests run at once, across packages,
// against one server with max_connections = 200.
const MaxConns = 4

// DB is one test's isolated schema.
type DB struct {
	// Pool's connections have search_path set to Schema, so unqualified
	// names create and find tables there. Closed at test cleanup.
	Pool *pgxpool.Pool
	// Schema is the schema's name, t_ followed by 16 hex digits. Dropped
	// (CASCADE) at test cleanup.
	Schema string
	// URL is the base URL with search_path set to Schema (see
	// URLWithSchema), for subprocesses and for code that opens its own pool.
	URL string
}

// New creates a fresh schema for t and a pool (at most MaxConns connections)
// whose connections use it. Cleanup closes the pool and drops the schema.
// Safe under t.Parallel.
func New(t testing.TB) *DB {
	t.Helper()
	base := URL(t)
	schema := "t_" + randomHex(8)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := execBase(ctx, base, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}

	cfg, err := pgxpool.ParseConfig(base)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", EnvURL, err)
	}
	cfg.MaxConns = MaxConns
	cfg.MinConns = 0
	// A startup parameter rather than a SET in AfterConnect: it holds from
	// the first statement, survives DISCARD ALL, and costs no round trip.
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}

	t.Cleanup(func() { cleanup(t, base, schema, pool) })
	return &DB{Pool: pool, Schema: schema, URL: urlWithSchema(t, base, schema)}
}

// Schema is New(t).Pool, for tests that only need the pool; SchemaName
// recovers the schema's name from it.
func Schema(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return New(t).Pool
}

// SchemaName returns the schema a pool from New or Schema is bound to, or ""
// for any other pool.
func SchemaName(pool *pgxpool.Pool) string {
	return pool.Config().ConnConfig.RuntimeParams["search_path"]
}

// URL returns the base URL of the test server: EnvURL if set, else (outside
// CI) the private cluster's, starting it if needed. It fails t if there is
// no server to be had.
func URL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(EnvURL); u != "" {
		return u
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("pgtest: %s is required in CI; .ci/run starts Postgres and sets it", EnvURL)
	}
	private.once.Do(startPrivate)
	if private.err != nil {
		t.Fatalf("pgtest: %s is unset and the private cluster in %s (port %d) could not start: %v\n"+
			"Set %s to a server you run, or install the PostgreSQL server binaries.",
			EnvURL, PrivateDir, PrivatePort, private.err, EnvURL)
	}
	return private.url
}

// URLWithSchema returns the base URL with `options=-csearch_path=<schema>`
// added. Both pgx and libpq (psql) honour it, so a subprocess given this URL
// works in the schema. schema must be a plain lower-case identifier.
func URLWithSchema(t testing.TB, schema string) string {
	t.Helper()
	return urlWithSchema(t, URL(t), schema)
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

func urlWithSchema(t testing.TB, base, schema string) string {
	t.Helper()
	if !identRE.MatchString(schema) {
		// Anything else would need quoting both in SQL and in libpq's
		// options syntax; our schemas never do.
		t.Fatalf("pgtest: schema %q is not a plain identifier", schema)
	}
	opt := "-csearch_path=" + schema
	if !strings.Contains(base, "://") {
		// keyword=value DSN; a later keyword overrides an earlier one.
		return base + " options='" + opt + "'"
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", EnvURL, err)
	}
	q := u.Query()
	if prev := q.Get("options"); prev != "" {
		opt = prev + " " + opt
	}
	q.Set("options", opt)
	u.RawQuery = q.Encode()
	return u.String()
}

var private struct {
	once sync.Once
	url  string
	err  error
}

// startPrivate starts (or reuses) the private cluster. The file lock makes
// concurrent test binaries take turns: the first initializes and starts it,
// the others find it running and reuse it.
func startPrivate() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		private.err = err
		return
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		private.err = fmt.Errorf("lock %s: %w", lockPath, err)
		return
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)

	// Quiet: test output is no place for start-up chatter; failures come
	// back as errors.
	c := pgcluster.New(PrivateDir, pgcluster.WithPort(PrivatePort), pgcluster.WithLogger(slog.New(slog.DiscardHandler)))
	if err := c.Start(ctx); err != nil {
		private.err = err
		return
	}
	private.url = c.URL()
}

// cleanup closes the pool and drops the schema. It bounds both waits: a
// test that leaked an acquired connection must fail with a message, not hang
// the whole binary until go test's timeout.
func cleanup(t testing.TB, base, schema string, pool *pgxpool.Pool) {
	closed := make(chan struct{})
	go func() { pool.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Errorf("pgtest: pool for schema %s still has acquired connections 10s after the test; a connection or transaction was not released", schema)
	}

	// t.Context() is already canceled when cleanups run.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := execBase(ctx, base, "SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		t.Errorf("pgtest: drop schema %s: %v", schema, err)
	}
}

// execBase runs sql on a short-lived connection to the base URL. A
// connection per call, rather than a shared admin pool, leaves nothing
// running between tests.
func execBase(ctx context.Context, base, sql string) error {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, sql)
	return errors.Join(err, conn.Close(context.WithoutCancel(ctx)))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}
