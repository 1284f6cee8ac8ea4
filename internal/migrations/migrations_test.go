package migrations_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
)

func TestFilesWellFormed(t *testing.T) {
	t.Parallel()
	ms := migrations.All()
	if len(ms) < 2 {
		t.Fatalf("want at least 2 migrations, got %d", len(ms))
	}
	for i, m := range ms {
		if m.Version != i+1 || m.Name == "" || m.SQL == "" {
			t.Errorf("migration %d: %+v", i, m)
		}
	}
}

func TestLoadRejectsGapsAndBadNames(t *testing.T) {
	t.Parallel()
	for name, fsys := range map[string]fstest.MapFS{
		"gap":      {"sql/0001_a.sql": {Data: []byte("x")}, "sql/0003_b.sql": {Data: []byte("x")}},
		"repeat":   {"sql/0001_a.sql": {Data: []byte("x")}, "sql/0001_b.sql": {Data: []byte("x")}},
		"bad name": {"sql/1_a.sql": {Data: []byte("x")}},
	} {
		if _, err := migrations.Load(fsys); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestApply(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	pending, err := migrations.Pending(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != len(migrations.All()) {
		t.Fatalf("fresh schema: %d pending, want %d", len(pending), len(migrations.All()))
	}
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	// Idempotent.
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	pending, err = migrations.Pending(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 0 {
		t.Fatalf("after Apply: %d pending", len(pending))
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != len(migrations.All()) {
		t.Fatalf("schema_migrations has %d rows, want %d", n, len(migrations.All()))
	}
	// The tables landed in the test's schema.
	for _, table := range []string{"projector_offsets", "applied_events", "mailboxes", "orgs", "users", "workers"} {
		var schema string
		err := db.Pool.QueryRow(ctx, `SELECT table_schema FROM information_schema.tables WHERE table_name = $1 AND table_schema = current_schema()`, table).Scan(&schema)
		if err != nil {
			t.Fatalf("table %s: %v", table, err)
		}
		if schema != db.Schema {
			t.Fatalf("table %s in schema %s, want %s", table, schema, db.Schema)
		}
	}
	// applied_events stays cheap: its primary key and the dedupe window's
	// (projector, applied_at) index, both written at their right edge, are
	// its only indexes (internal/projections/dedupe.go).
	var defs []string
	rows, err := db.Pool.Query(ctx, `SELECT indexdef FROM pg_indexes WHERE tablename = 'applied_events' AND schemaname = current_schema() ORDER BY indexname`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			t.Fatal(err)
		}
		defs = append(defs, d[strings.Index(d, " USING "):])
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{" USING btree (projector, applied_at)", " USING btree (projector, event_id)"}; !slices.Equal(defs, want) {
		t.Fatalf("applied_events indexes %q, want %q", defs, want)
	}
}

// TestApplyConcurrent runs several runners at once on one schema: the
// advisory lock makes them take turns and each migration lands once.
func TestApplyConcurrent(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		wg.Go(func() { errs <- migrations.Apply(ctx, db.Pool) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var n, distinct int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT version) FROM schema_migrations`).Scan(&n, &distinct); err != nil {
		t.Fatal(err)
	}
	if n != len(migrations.All()) || distinct != n {
		t.Fatalf("schema_migrations: %d rows, %d distinct; want %d", n, distinct, len(migrations.All()))
	}
}

func TestApplyCanceled(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := migrations.Apply(ctx, db.Pool); err == nil {
		t.Fatal("Apply with a canceled context succeeded")
	}
}
