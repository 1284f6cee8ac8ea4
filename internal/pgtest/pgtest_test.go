package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestIsolation runs parallel tests that each create the same table in their
// own schema and must see only their own rows.
func TestIsolation(t *testing.T) {
	t.Parallel()
	for i := range 8 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			db := New(t)
			ctx := t.Context()
			if got := SchemaName(db.Pool); got != db.Schema {
				t.Fatalf("SchemaName = %q, want %q", got, db.Schema)
			}
			var cur string
			if err := db.Pool.QueryRow(ctx, "SELECT current_schema()").Scan(&cur); err != nil {
				t.Fatal(err)
			}
			if cur != db.Schema {
				t.Fatalf("current_schema() = %q, want %q", cur, db.Schema)
			}
			// Same unqualified name in every subtest: it lands in each one's schema.
			if _, err := db.Pool.Exec(ctx, "CREATE TABLE items (n int)"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Pool.Exec(ctx, "INSERT INTO items SELECT $1::int FROM generate_series(1, $1::int)", i+1); err != nil {
				t.Fatal(err)
			}
			var count, distinct int
			if err := db.Pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT n) FROM items").Scan(&count, &distinct); err != nil {
				t.Fatal(err)
			}
			if count != i+1 || distinct != 1 {
				t.Fatalf("saw %d rows (%d distinct values), want only this test's %d", count, distinct, i+1)
			}
		})
	}
}

func TestCleanupDropsSchema(t *testing.T) {
	t.Parallel()
	var schema string
	t.Run("inner", func(t *testing.T) {
		db := New(t)
		schema = db.Schema
		if _, err := db.Pool.Exec(t.Context(), "CREATE TABLE gone (id int)"); err != nil {
			t.Fatal(err)
		}
	})
	// The subtest's cleanups have run: its schema must be gone.
	conn, err := pgx.Connect(t.Context(), URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("schema %s still exists after cleanup", schema)
	}
}

// TestURLWithSchema checks that the URL a subprocess would get puts both
// pgx and libpq (psql) in the schema.
func TestURLWithSchema(t *testing.T) {
	t.Parallel()
	db := New(t)
	if db.URL != URLWithSchema(t, db.Schema) {
		t.Fatalf("DB.URL %q != URLWithSchema %q", db.URL, URLWithSchema(t, db.Schema))
	}
	if _, err := db.Pool.Exec(t.Context(), "CREATE TABLE marker (v text); INSERT INTO marker VALUES ('here')"); err != nil {
		t.Fatal(err)
	}

	conn, err := pgx.Connect(t.Context(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var cur, v string
	if err := conn.QueryRow(t.Context(), "SELECT current_schema(), (SELECT v FROM marker)").Scan(&cur, &v); err != nil {
		t.Fatalf("pgx via %s: %v", db.URL, err)
	}
	if cur != db.Schema || v != "here" {
		t.Fatalf("pgx: current_schema %q marker %q", cur, v)
	}

	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Log("psql not on PATH; libpq half not checked")
		return
	}
	out, err := exec.CommandContext(t.Context(), psql, db.URL, "-XAtc", "SELECT current_schema() || ' ' || v FROM marker").CombinedOutput()
	if err != nil {
		t.Fatalf("psql %s: %v: %s", db.URL, err, out)
	}
	if got := strings.TrimSpace(string(out)); got != db.Schema+" here" {
		t.Fatalf("psql saw %q", got)
	}
}

func TestURLWithSchemaKeepsOptions(t *testing.T) {
	got := urlWithSchema(t, "postgres://u@h:5/db?sslmode=disable&options=-cstatement_timeout%3D5s", "t_ab")
	want := "postgres://u@h:5/db?options=-cstatement_timeout%3D5s+-csearch_path%3Dt_ab&sslmode=disable"
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if got := urlWithSchema(t, "host=h dbname=db", "t_ab"); got != "host=h dbname=db options='-csearch_path=t_ab'" {
		t.Fatalf("DSN: got %s", got)
	}
}

// TestCIRequiresURL runs this test binary again with CI set and no URL: it
// must fail loudly, not start a private cluster nor skip.
func TestCIRequiresURL(t *testing.T) {
	if os.Getenv("PGTEST_CI_CHILD") != "" {
		URL(t)
		return
	}
	t.Parallel()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestCIRequiresURL$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGTEST_CI_CHILD=1", "CI=true", EnvURL+"=")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("child passed; want failure. Output:\n%s", out)
	}
	if !strings.Contains(string(out), EnvURL+" is required in CI") {
		t.Fatalf("child output lacks the CI message:\n%s", out)
	}
}
