package pgcluster

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// clusterDir returns a fresh directory the server's user can reach:
// t.TempDir() is 0700 root-owned, which the postgres user cannot traverse.
func clusterDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "mailplane-pgcluster-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// freePort asks the kernel for an unused port. Another process could take it
// before postgres binds, which would fail the test loudly, not wrongly.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestStartStopRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	dir := clusterDir(t)
	port := freePort(t)
	logger := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	c := New(dir, WithPort(port), WithLogger(logger))
	t.Cleanup(func() {
		if err := c.Stop(context.Background()); err != nil {
			t.Errorf("cleanup stop: %v", err)
		}
	})

	start := time.Now()
	if err := c.Start(ctx); err != nil {
		t.Fatalf("first start: %v", err)
	}
	t.Logf("first start (initdb + start + createdb) took %v", time.Since(start).Round(time.Millisecond))

	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatalf("connect %s: %v", c.URL(), err)
	}
	var db, usr string
	var maxConns int
	if err := conn.QueryRow(ctx, "SELECT current_database(), current_user, current_setting('max_connections')::int").Scan(&db, &usr, &maxConns); err != nil {
		t.Fatal(err)
	}
	if db != Database || usr != Superuser || maxConns != 200 {
		t.Fatalf("got db=%q user=%q max_connections=%d, want %q %q 200", db, usr, maxConns, Database, Superuser)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('survives restart')"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	// Start on a running cluster reuses it instead of failing.
	if err := c.Start(ctx); err != nil {
		t.Fatalf("start while running: %v", err)
	}
	// A second Cluster value on the same directory (another process, in
	// real life) reuses it too.
	if err := New(dir, WithPort(port), WithLogger(logger)).Start(ctx); err != nil {
		t.Fatalf("second Cluster on running dir: %v", err)
	}
	// The same directory on another port is refused with a clear error.
	if err := New(dir, WithPort(port+1), WithLogger(logger)).Start(ctx); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("start on other port: got %v, want 'already running' error", err)
	}
	// ...and leaves the running server's settings alone.
	if conf, err := os.ReadFile(filepath.Join(c.DataDir(), "mailplane.conf")); err != nil || !strings.Contains(string(conf), "port = "+strconv.Itoa(port)+"\n") {
		t.Fatalf("mailplane.conf changed by a refused start (err %v):\n%s", err, conf)
	}

	if err := c.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if _, err := os.Stat(filepath.Join(c.DataDir(), "postmaster.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("postmaster.pid after stop: %v", err)
	}
	if conn, err := pgx.Connect(ctx, c.URL()); err == nil {
		conn.Close(ctx)
		t.Fatal("connected after stop")
	}
	// Stopping a stopped cluster is fine.
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("second stop: %v", err)
	}

	start = time.Now()
	if err := c.Start(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	t.Logf("restart took %v", time.Since(start).Round(time.Millisecond))
	conn, err = pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil {
		t.Fatalf("data after restart: %v", err)
	}
	if v != "survives restart" {
		t.Fatalf("got %q", v)
	}
	// The socket directory is ours, not /var/run/postgresql.
	if _, err := os.Stat(filepath.Join(c.SocketDir(), ".s.PGSQL."+strconv.Itoa(port))); err != nil {
		t.Fatalf("socket: %v", err)
	}
}

func TestUntraversableDirIsExplained(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root drops to another user")
	}
	parent := clusterDir(t)
	if err := os.Chmod(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	err := New(filepath.Join(parent, "c"), WithPort(freePort(t))).Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "not traversable") {
		t.Fatalf("got %v, want a 'not traversable' error", err)
	}
}

func TestBinariesNotFoundMessage(t *testing.T) {
	// The message is what a developer without PostgreSQL reads; it must say
	// what is missing and both ways out.
	msg := ErrBinariesNotFound.Error()
	for _, want := range []string{"PostgreSQL server binaries", "not found", "apt-get install postgresql", "MAILPLANE_DATABASE_URL"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
}

func TestVersionOrder(t *testing.T) {
	if !(versionOf("/usr/lib/postgresql/15/bin") > versionOf("/usr/lib/postgresql/9.6/bin")) {
		t.Fatal("15 must sort above 9.6")
	}
	if !(versionOf("/usr/lib/postgresql/9.6/bin") > versionOf("/usr/lib/postgresql/x/bin")) {
		t.Fatal("numbers must sort above junk")
	}
}

func TestUnknownUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the user only matters as root")
	}
	err := New(clusterDir(t), WithUser("no-such-user-mailplane")).Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("got %v", err)
	}
}

// testWriter routes slog output into the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
