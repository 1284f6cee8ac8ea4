// Package pgcluster runs a private PostgreSQL cluster from the system's
// PostgreSQL server binaries. `mailplane dev` uses it when
// MAILPLANE_DATABASE_URL is not set, and pgtest uses it so that `go test
// ./...` works on a developer machine without a running server.
//
// Layout under the cluster directory (shared with scripts/pg-private.sh, so
// either can start a cluster the other created):
//
//	DIR/pgdata          the data directory
//	DIR/pgdata/mailplane.conf  settings written on every start (included from postgresql.conf)
//	DIR/run             the unix socket directory
//	DIR/postgres.log    the server log
//
// initdb refuses to run as root, so when the process is root every PostgreSQL
// binary runs as an unprivileged OS user (default "postgres") that owns DIR.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultPort is the TCP port a Cluster listens on unless WithPort says
// otherwise. It is off the standard 5432 so it never collides with a system
// server.
const DefaultPort = 54329

// Database is the database Start creates and URL points at.
const Database = "mailplane"

// Superuser is the PostgreSQL role initdb creates; URL connects as it.
const Superuser = "postgres"

// defaultTimeout bounds start and stop when the context has no deadline.
const defaultTimeout = 60 * time.Second

// ErrBinariesNotFound is returned (wrapped) by Start when initdb and pg_ctl
// cannot be found. Its text is stable: it is what a developer sees first on a
// machine without PostgreSQL.
var ErrBinariesNotFound = errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found in PATH or /usr/lib/postgresql/*/bin; " +
	"install them (Debian/Ubuntu: apt-get install postgresql) or set MAILPLANE_DATABASE_URL to use an existing server")

// Cluster is a private PostgreSQL cluster rooted in one directory.
// Create it with New; it is not safe for concurrent Start/Stop calls.
type Cluster struct {
	dir    string
	port   int
	user   string
	logger *slog.Logger

	binDir string // resolved by Start
}

// Option configures a Cluster.
type Option func(*Cluster)

// WithPort sets the TCP port on 127.0.0.1 (default DefaultPort).
func WithPort(port int) Option { return func(c *Cluster) { c.port = port } }

// WithLogger sets the logger for lifecycle messages (default, and for nil,
// slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(c *Cluster) {
		if l != nil {
			c.logger = l
		}
	}
}

// WithUser sets the OS user the server runs as when the process is root
// (default "postgres"). It is ignored when not root: the server then runs as
// the current user.
func WithUser(name string) Option { return func(c *Cluster) { c.user = name } }

// New returns a Cluster rooted at dir. Nothing happens until Start.
func New(dir string, opts ...Option) *Cluster {
	c := &Cluster{dir: dir, port: DefaultPort, user: "postgres", logger: slog.Default()}
	for _, o := range opts {
		o(c)
	}
	if abs, err := filepath.Abs(c.dir); err == nil {
		c.dir = abs
	}
	return c
}

// Dir returns the cluster's root directory (absolute).
func (c *Cluster) Dir() string { return c.dir }

// DataDir returns the PostgreSQL data directory, Dir()/pgdata.
func (c *Cluster) DataDir() string { return filepath.Join(c.dir, "pgdata") }

// SocketDir returns the unix socket directory, Dir()/run.
func (c *Cluster) SocketDir() string { return filepath.Join(c.dir, "run") }

// LogFile returns the server log path, Dir()/postgres.log.
func (c *Cluster) LogFile() string { return filepath.Join(c.dir, "postgres.log") }

// Port returns the TCP port the cluster listens on.
func (c *Cluster) Port() int { return c.port }

// URL returns a pgx connection URL for the mailplane database over TCP on
// 127.0.0.1, as the postgres superuser (trust auth, no password).
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", Superuser, c.port, Database)
}

// adminURL points at the always-present "postgres" database, used to create
// the mailplane database.
func (c *Cluster) adminURL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", Superuser, c.port)
}

// Start makes the cluster ready: it initializes the data directory if
// needed, starts the server unless one is already running from this data
// directory on this port, and creates the mailplane database if missing.
// The context's deadline bounds the wait for the server (60 s without one).
func (c *Cluster) Start(ctx context.Context) error {
	binDir, err := findBinDir()
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	c.binDir = binDir

	cred, err := c.credential()
	if err != nil {
		return err
	}
	if err := c.prepareDirs(cred); err != nil {
		return err
	}

	if _, err := os.Stat(filepath.Join(c.DataDir(), "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if err := c.initdb(ctx, cred); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}

	running, err := c.runningPort()
	if err != nil {
		return err
	}
	switch {
	case running == c.port:
		c.logger.Info("pgcluster: reusing running server", "dir", c.dir, "port", c.port)
	case running != 0:
		return fmt.Errorf("pgcluster: a server from %s is already running on port %d, not %d; stop it (pg_ctl stop -D %s) or use that port",
			c.DataDir(), running, c.port, c.DataDir())
	default:
		// Written on every start (and only when we start the server, so a
		// refused Start cannot change a running server's settings) so that
		// a changed port takes effect and a plain `pg_ctl start -D` by
		// hand gets the same settings.
		if err := c.writeConf(cred); err != nil {
			return err
		}
		if err := c.pgctlStart(ctx, cred); err != nil {
			return err
		}
	}

	return c.ensureDatabase(ctx)
}

// Stop shuts the server down (fast mode: rolls back open transactions and
// disconnects clients) and waits for it to exit. Stopping a cluster that is
// not running is not an error.
func (c *Cluster) Stop(ctx context.Context) error {
	if c.binDir == "" {
		binDir, err := findBinDir()
		if err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		c.binDir = binDir
	}
	running, err := c.runningPort()
	if err != nil {
		return err
	}
	if running == 0 {
		return nil
	}
	cred, err := c.credential()
	if err != nil {
		return err
	}
	out, err := c.run(ctx, cred, "pg_ctl", "stop", "-D", c.DataDir(), "-m", "fast", "-w", "-t", waitSeconds(ctx))
	if err != nil {
		return fmt.Errorf("pgcluster: pg_ctl stop: %w: %s", err, bytes.TrimSpace(out))
	}
	c.logger.Info("pgcluster: stopped", "dir", c.dir, "port", c.port)
	return nil
}

// findBinDir returns the directory holding pg_ctl and initdb: PATH first
// (the developer's choice wins), else the newest /usr/lib/postgresql/N/bin,
// which is where Debian puts them without adding them to PATH.
func findBinDir() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		dir := filepath.Dir(p)
		if isExecutable(filepath.Join(dir, "initdb")) {
			return dir, nil
		}
		// pg_ctl and initdb come from different places on PATH: use each
		// one's real location, which is where postgres sits too.
		if real, err := filepath.EvalSymlinks(p); err == nil && isExecutable(filepath.Join(filepath.Dir(real), "initdb")) {
			return filepath.Dir(real), nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	for _, dir := range matches {
		if isExecutable(filepath.Join(dir, "pg_ctl")) && isExecutable(filepath.Join(dir, "initdb")) {
			return dir, nil
		}
	}
	return "", ErrBinariesNotFound
}

// versionOf parses N from /usr/lib/postgresql/N/bin so 15 sorts above 9.6.
func versionOf(binDir string) float64 {
	v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	if err != nil {
		return math.Inf(-1)
	}
	return v
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// credential returns the identity the PostgreSQL binaries run as: nil (the
// current user) unless we are root, in which case c.user.
func (c *Cluster) credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(c.user)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root, PostgreSQL must run as OS user %q, which does not exist (%v); "+
			"install the postgresql package (it creates the user) or choose another user with WithUser", c.user, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgcluster: user %q: %w", c.user, err)
	}
	if uid == 0 {
		return nil, fmt.Errorf("pgcluster: WithUser(%q) is root; initdb refuses to run as root", c.user)
	}
	// Groups is left empty on purpose: it drops root's supplementary groups.
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// prepareDirs creates DIR, DIR/pgdata (0700, as postgres demands) and
// DIR/run, and hands them to the server's user when we are root.
func (c *Cluster) prepareDirs(cred *syscall.Credential) error {
	// Unix socket paths are limited to 107 bytes; fail here with a clear
	// message rather than with postgres' terse one in the log.
	if sock := filepath.Join(c.SocketDir(), ".s.PGSQL."+strconv.Itoa(c.port)); len(sock) > 107 {
		return fmt.Errorf("pgcluster: socket path %s is %d bytes, over the 107-byte unix limit; use a shorter directory", sock, len(sock))
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	for _, d := range []struct {
		path string
		perm os.FileMode
	}{{c.DataDir(), 0o700}, {c.SocketDir(), 0o755}} {
		if err := os.Mkdir(d.path, d.perm); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	if cred == nil {
		return nil
	}
	if err := checkTraversable(filepath.Dir(c.dir), cred); err != nil {
		return err
	}
	// Not recursive: the data directory's contents are already the server
	// user's (it created them), and DIR may hold other things of ours.
	for _, p := range []string{c.dir, c.DataDir(), c.SocketDir()} {
		if err := os.Lchown(p, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	// The log file may predate a switch of user; pg_ctl appends to it.
	if err := os.Lchown(c.LogFile(), int(cred.Uid), int(cred.Gid)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

// checkTraversable reports, before initdb fails obscurely, an ancestor
// directory that the server's user cannot enter (t.TempDir() is 0700 root,
// for example).
func checkTraversable(dir string, cred *syscall.Credential) error {
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		perm := fi.Mode().Perm()
		var can bool
		switch {
		case st.Uid == cred.Uid:
			can = perm&0o100 != 0
		case st.Gid == cred.Gid:
			can = perm&0o010 != 0
		default:
			can = perm&0o001 != 0
		}
		if !can {
			return fmt.Errorf("pgcluster: directory %s (mode %v) is not traversable by uid %d, which the PostgreSQL server runs as; "+
				"put the cluster under a world-traversable path such as /tmp/NAME or ./var", p, perm, cred.Uid)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

func (c *Cluster) initdb(ctx context.Context, cred *syscall.Credential) error {
	c.logger.Info("pgcluster: initializing data directory", "dir", c.DataDir(), "bin", c.binDir)
	// -A trust: the cluster only listens on 127.0.0.1 and a private socket
	// directory; it holds development and test data only.
	// -U postgres: the superuser's name must not depend on the OS user.
	out, err := c.run(ctx, cred, "initdb",
		"-D", c.DataDir(), "-U", Superuser, "-A", "trust", "-E", "UTF8", "--no-locale", "--no-instructions")
	if err != nil {
		return fmt.Errorf("pgcluster: initdb: %w: %s", err, bytes.TrimSpace(out))
	}
	conf := filepath.Join(c.DataDir(), "postgresql.conf")
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	_, err = f.WriteString("\n# Added by mailplane pgcluster / scripts/pg-private.sh.\ninclude_if_exists = 'mailplane.conf'\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

// writeConf writes DIR/pgdata/mailplane.conf. Keep it in step with
// scripts/pg-private.sh.
func (c *Cluster) writeConf(cred *syscall.Credential) error {
	conf := fmt.Sprintf(`# Written by mailplane pgcluster on every start; edits are lost.
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
# Many test packages run in parallel, each test with its own small pool.
max_connections = 200
shared_buffers = 128MB
# fsync and synchronous_commit stay on: measurements made here must hold in production.
log_line_prefix = '%%m [%%p] '
`, c.port, strings.ReplaceAll(c.SocketDir(), "'", "''"))
	path := filepath.Join(c.DataDir(), "mailplane.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if cred != nil {
		if err := os.Lchown(path, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	return nil
}

// runningPort returns the port of a live server using this data directory,
// or 0. postmaster.pid holds the pid on line 1 and the port on line 4; a
// stale file (crash, reboot) is ignored, as postgres itself ignores it.
func (c *Cluster) runningPort() (int, error) {
	b, err := os.ReadFile(filepath.Join(c.DataDir(), "postmaster.pid"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("pgcluster: %w", err)
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 4 {
		return 0, nil // being written by a starting server; treat as not running
	}
	pid, err1 := strconv.Atoi(strings.TrimSpace(lines[0]))
	port, err2 := strconv.Atoi(strings.TrimSpace(lines[3]))
	if err1 != nil || err2 != nil || pid <= 0 {
		return 0, nil
	}
	// Signal 0 checks existence; EPERM means it exists but is not ours.
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return 0, nil
	}
	return port, nil
}

func (c *Cluster) pgctlStart(ctx context.Context, cred *syscall.Credential) error {
	c.logger.Info("pgcluster: starting server", "dir", c.dir, "port", c.port)
	start := time.Now()
	// -l sends the server's output to the log file, so the server does not
	// inherit (and hold open) our output pipe.
	out, err := c.run(ctx, cred, "pg_ctl", "start", "-D", c.DataDir(), "-l", c.LogFile(), "-w", "-t", waitSeconds(ctx))
	if err != nil {
		return fmt.Errorf("pgcluster: pg_ctl start: %w: %s\nlast lines of %s:\n%s",
			err, bytes.TrimSpace(out), c.LogFile(), tail(c.LogFile(), 20))
	}
	c.logger.Info("pgcluster: server started", "port", c.port, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// ensureDatabase creates the mailplane database if it does not exist.
func (c *Cluster) ensureDatabase(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, defaultTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.adminURL())
	if err != nil {
		return fmt.Errorf("pgcluster: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", Database).Scan(&exists); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{Database}.Sanitize())
	// Another process may have created it between our check and CREATE.
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42P04" {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("pgcluster: create database: %w", err)
	}
	c.logger.Info("pgcluster: created database", "name", Database)
	return nil
}

// run executes a PostgreSQL binary from binDir as cred (nil: ourselves) and
// returns its combined output.
func (c *Cluster) run(ctx context.Context, cred *syscall.Credential, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	// The server user may not be able to enter our working directory
	// (e.g. /root), and initdb complains about that.
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	return cmd.CombinedOutput()
}

// waitSeconds turns the context's deadline into pg_ctl's -t argument.
func waitSeconds(ctx context.Context) string {
	d := defaultTimeout
	if dl, ok := ctx.Deadline(); ok {
		d = time.Until(dl)
	}
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
