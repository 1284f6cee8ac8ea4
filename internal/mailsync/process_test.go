package mailsync_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/topics"
)

// Environment of the sync worker child process.
const (
	envHelper  = "MAILPLANE_SYNC_HELPER"
	envBrokers = "MAILPLANE_SYNC_BROKERS"
	envDB      = "MAILPLANE_SYNC_DATABASE_URL"
	envID      = "MAILPLANE_SYNC_ID"
	envStatus  = "MAILPLANE_SYNC_STATUS"
	envSession = "MAILPLANE_SYNC_SESSION" // session timeout of the children (default 2s)
	helperUp   = "sync-helper: ready"
)

// status is what a child reports, every 50ms, in its status file.
type status struct {
	ID      string                      `json:"id"`
	PID     int                         `json:"pid"`
	At      time.Time                   `json:"at"`
	Running map[string]mailsync.RunInfo `json:"running"`
	Stats   mailsync.RecorderStats      `json:"stats"`
}

func childSession() time.Duration {
	if s := os.Getenv(envSession); s != "" {
		if d, err := time.ParseDuration(s); err == nil {
			return d
		}
	}
	return 2 * time.Second
}

// processHelper is a sync worker process for TestProcesses: a worker
// with the recording runner (a beat row every 250ms per mailbox), until
// SIGTERM or SIGKILL.
// TestMain runs this test binary as the child process of TestProcesses when
// the environment asks for it, instead of running tests.
func TestMain(m *testing.M) {
	if os.Getenv(envHelper) == "1" {
		processHelper()
	}
	os.Exit(m.Run())
}

func processHelper() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv(envDB))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	id := os.Getenv(envID)
	rec := &mailsync.RecordingRunner{Beat: 250 * time.Millisecond}
	session := childSession()
	cfg := mailsync.Config{
		WorkerID:          id,
		SessionTimeout:    session,
		HeartbeatInterval: session / 10,
		RebalanceTimeout:  10 * time.Second,
		WriteIdleTimeout:  time.Second,
		// Connection pacing is not what this test is about: every runner
		// starts (and writes its start row) at once.
		ConnectRatePerHost: 1e6,
		Logger:             childLogger().With("child", id),
	}
	w, err := mailsync.New(kafka.Config{Brokers: kafka.ParseBrokers(os.Getenv(envBrokers)), ClientID: "sync-" + id}, pool, rec, cfg)
	if err != nil {
		log.Fatal(err)
	}
	path := os.Getenv(envStatus)
	go func() {
		for {
			s := status{ID: id, PID: os.Getpid(), At: time.Now(), Running: rec.Running(), Stats: rec.Stats()}
			b, _ := json.Marshal(s)
			tmp := path + ".tmp"
			if err := os.WriteFile(tmp, b, 0o644); err == nil {
				_ = os.Rename(tmp, path)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	fmt.Println(helperUp)
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
	os.Exit(0)
}

// childLogger logs warnings to stderr, which the parent captures (a
// child's test output would be lost with the child); everything with
// MAILPLANE_TEST_LOG=debug.
func childLogger() *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("MAILPLANE_TEST_LOG") == "debug" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

type proc struct {
	id      string
	cmd     *exec.Cmd
	out     *mailplanetest.Output
	status  string
	stopped bool // SIGSTOPped: its runners do not run
	exited  bool
}

type fleet struct {
	t       *testing.T
	brokers []string
	url     string
	dir     string
	procs   map[string]*proc
}

func (fl *fleet) start(id string) *proc {
	fl.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.count=1", "-test.timeout=10m")
	p := &proc{id: id, cmd: cmd, out: &mailplanetest.Output{}, status: filepath.Join(fl.dir, id+".json")}
	cmd.Env = append(os.Environ(),
		envHelper+"=1",
		envBrokers+"="+strings.Join(fl.brokers, ","),
		envDB+"="+fl.url,
		envID+"="+id,
		envStatus+"="+p.status,
	)
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		fl.t.Fatal(err)
	}
	fl.procs[id] = p
	fl.t.Cleanup(func() {
		if p.stopped {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
		if !p.exited {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	})
	waitFor(fl.t, 30*time.Second, id+" to start", func() (bool, string) {
		return strings.Contains(p.out.String(), helperUp), "not ready"
	})
	return p
}

func (fl *fleet) read(p *proc) (status, bool) {
	b, err := os.ReadFile(p.status)
	if err != nil {
		return status{}, false
	}
	var s status
	if err := json.Unmarshal(b, &s); err != nil {
		return status{}, false
	}
	return s, true
}

// settled checks that the live mailboxes run exactly once across the
// running (not stopped, not exited) children, each at its partition's
// current epoch, per statuses written after since.
func (fl *fleet) settled(pool *pgxpool.Pool, live map[string]bool, since time.Time) (bool, string) {
	owner := map[string]string{}
	ep := epochs(fl.t, pool)
	for _, p := range fl.procs {
		if p.exited || p.stopped {
			continue
		}
		s, ok := fl.read(p)
		if !ok || s.At.Before(since) {
			return false, p.id + " has no fresh status"
		}
		for id, info := range s.Running {
			if prev, dup := owner[id]; dup {
				return false, fmt.Sprintf("mailbox %s runs on %s and %s", id, prev, p.id)
			}
			owner[id] = p.id
			if !live[id] {
				return false, fmt.Sprintf("%s runs %s, which is not live", p.id, id)
			}
			if ep[info.Partition] != info.Epoch {
				return false, fmt.Sprintf("%s runs %s at epoch %d of partition %d; current %d", p.id, id, info.Epoch, info.Partition, ep[info.Partition])
			}
		}
	}
	if len(owner) != len(live) {
		return false, fmt.Sprintf("%d of %d live mailboxes running", len(owner), len(live))
	}
	return true, ""
}

func (fl *fleet) waitSettled(pool *pgxpool.Pool, live map[string]bool, what string) time.Duration {
	fl.t.Helper()
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	var why string
	for time.Now().Before(deadline) {
		var ok bool
		if ok, why = fl.settled(pool, live, start); ok {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, p := range fl.procs {
		fl.t.Logf("--- %s output:\n%s", p.id, tail(p.out.String(), 4000))
	}
	fl.t.Fatalf("not settled after %s: %s (last: %s)", time.Since(start), what, why)
	return 0
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

func (fl *fleet) signal(p *proc, sig syscall.Signal) {
	fl.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		fl.t.Fatal(err)
	}
}

func (fl *fleet) terminate(p *proc) {
	fl.t.Helper()
	fl.signal(p, syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		p.exited = true
		if err != nil {
			fl.t.Fatalf("%s did not stop cleanly: %v\n%s", p.id, err, tail(p.out.String(), 4000))
		}
	case <-time.After(60 * time.Second):
		fl.t.Fatalf("%s did not stop within 60s of SIGTERM", p.id)
	}
}

func (fl *fleet) kill(p *proc) {
	fl.t.Helper()
	fl.signal(p, syscall.SIGKILL)
	_ = p.cmd.Wait()
	p.exited = true
}

// TestProcesses runs sync workers as separate processes (this test binary
// re-executed) against one embedded broker and one Postgres schema, with
// the mailbox.state processor folding mailbox events in this process. It
// adds and removes mailboxes, stops a worker gracefully, SIGKILLs one and
// SIGSTOPs one past the session timeout before SIGCONT (a zombie). After
// each step every live mailbox runs exactly once at its partition's
// current epoch; no write ever lands at a stale epoch. The zombie's stale
// writes are refused by the fence or not even attempted: its watchdog
// trips on waking and bounds its runners' last writes by a moment long
// past (Job.LastWriteContext).
func TestProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("process test: not in -short")
	}
	t.Parallel()
	e := newEnv(t, 12)
	session := childSession()
	sp, err := mailboxstate.New(e.kcfg, mailboxstate.WithGroup(kafka.GroupConfig{SessionTimeout: time.Second, HeartbeatInterval: 100 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(context.Background())
	pdone := make(chan error, 1)
	go func() { pdone <- sp.Run(pctx) }()
	t.Cleanup(func() { pcancel(); <-pdone })

	fl := &fleet{t: t, brokers: e.kcfg.Brokers, url: e.db.URL, dir: t.TempDir(), procs: map[string]*proc{}}
	f := newFixture(70)
	live := map[string]bool{}
	publish := func(evs ...domain.Event) {
		t.Helper()
		recs := make([]*kgo.Record, len(evs))
		for i, ev := range evs {
			r, err := topics.Encode(ev)
			if err != nil {
				t.Fatal(err)
			}
			recs[i] = r
		}
		e.produce(recs...)
	}
	event := func(d domain.Data) domain.Event {
		return domain.Event{ID: domain.NewEventID(), Type: d.EventType(), Source: "mailplane/test", Time: time.Now().UTC(), Subject: d.AggregateID(), Data: d}
	}
	add := func(n int) {
		var evs []domain.Event
		for range n {
			m := f.mailbox("", time.Hour)
			live[m.MailboxID] = true
			evs = append(evs, event(&domain.MailboxAdded{MailboxID: m.MailboxID, OrgID: m.OrgID, UserID: m.UserID,
				Address: m.Address, Provider: m.Provider, IMAP: m.IMAP, SealedCredentials: m.SealedCredentials}))
		}
		publish(evs...)
	}
	remove := func(n int) {
		var evs []domain.Event
		for id := range live {
			if len(evs) == n {
				break
			}
			delete(live, id)
			evs = append(evs, event(&domain.MailboxRemoved{MailboxID: id, Reason: "test"}))
		}
		publish(evs...)
	}

	// Start three, add mailboxes.
	for _, id := range []string{"p1", "p2", "p3"} {
		fl.start(id)
	}
	add(90)
	d := fl.waitSettled(e.db.Pool, live, "three workers, 90 mailboxes")
	t.Logf("start: 90 mailboxes on 3 workers settled in %s", d)
	add(30)
	remove(20)
	d = fl.waitSettled(e.db.Pool, live, "after adding 30 and removing 20")
	t.Logf("add 30, remove 20: settled in %s", d)

	// Graceful stop.
	start := time.Now()
	fl.terminate(fl.procs["p1"])
	d = fl.waitSettled(e.db.Pool, live, "after p1 stopped gracefully")
	graceful := time.Since(start)
	t.Logf("graceful stop of p1: every mailbox running on the others %s after SIGTERM (settle check %s)", graceful, d)
	fl.start("p4")
	fl.waitSettled(e.db.Pool, live, "after p4 joined")

	// SIGKILL.
	start = time.Now()
	fl.kill(fl.procs["p2"])
	fl.waitSettled(e.db.Pool, live, "after p2 was killed")
	killed := time.Since(start)
	t.Logf("SIGKILL of p2: every mailbox running on the others %s after the kill (session timeout %s)", killed, session)
	fl.start("p5")
	fl.waitSettled(e.db.Pool, live, "after p5 joined")

	// Zombie: SIGSTOP p3 past the session timeout, then SIGCONT.
	zombie := fl.procs["p3"]
	var zs status
	waitFor(t, 30*time.Second, "p3 to have started every runner it owns", func() (bool, string) {
		zs, _ = fl.read(zombie)
		if len(zs.Running) == 0 {
			return false, "p3 runs nothing"
		}
		for id, info := range zs.Running {
			if count(t, e.db.Pool, `SELECT count(*) FROM sync_recorder_writes WHERE mailbox_id = $1 AND epoch = $2 AND kind = 'start'`, id, info.Epoch) == 0 {
				return false, id + " has not written its start row"
			}
		}
		return true, ""
	})
	fl.signal(zombie, syscall.SIGSTOP)
	zombie.stopped = true
	paused := time.Now()
	d = fl.waitSettled(e.db.Pool, live, "while p3 is stopped")
	t.Logf("SIGSTOP of p3 (%d mailboxes): the others run everything %s later", len(zs.Running), d)
	// Keep it paused well past its session, with more changes meanwhile.
	add(10)
	remove(5)
	time.Sleep(time.Until(paused.Add(2 * session)))
	d = fl.waitSettled(e.db.Pool, live, "p3 still stopped, after more changes")
	t.Logf("10 added and 5 removed while p3 is stopped: settled in %s", d)
	if n := staleWrites(t, e.db.Pool); n != 0 {
		t.Fatalf("%d writes landed at a stale epoch during the pause", n)
	}
	resumed := time.Now()
	fl.signal(zombie, syscall.SIGCONT)
	zombie.stopped = false
	d = fl.waitSettled(e.db.Pool, live, "after p3 came back")
	t.Logf("SIGCONT of p3 after %s: settled again %s later", resumed.Sub(paused), d)
	// The zombie, back in the group, gets work again.
	waitFor(t, 60*time.Second, "p3 back at work", func() (bool, string) {
		if ok, why := fl.settled(e.db.Pool, live, resumed); !ok {
			return false, why
		}
		s, _ := fl.read(zombie)
		return len(s.Running) > 0, "p3 runs nothing"
	})
	t.Logf("p3 back at work %s after SIGCONT", time.Since(resumed))
	if n := staleWrites(t, e.db.Pool); n != 0 {
		t.Errorf("%d writes landed at a stale epoch", n)
	}
	fenced := count(t, e.db.Pool, `SELECT count(*) FROM sync_fenced_writes WHERE owner = 'p3' AND attempted_at >= $1`, resumed)
	t.Logf("the zombie's writes refused by the fence after SIGCONT: %d (the rest were not attempted)", fenced)
	if os.Getenv("MAILPLANE_TEST_LOG") == "debug" {
		rows, _ := e.db.Pool.Query(context.Background(), `SELECT 'fenced', kind, count(*) FROM sync_fenced_writes WHERE owner = 'p3' GROUP BY 1, 2
			UNION ALL SELECT 'landed-after-cont', kind, count(*) FROM sync_recorder_writes WHERE owner = 'p3' AND written_at >= $1 GROUP BY 1, 2`, resumed)
		for rows.Next() {
			var a, b string
			var n int
			_ = rows.Scan(&a, &b, &n)
			t.Logf("%s %s %d", a, b, n)
		}
		rows.Close()
		t.Logf("p3 output:\n%s", zombie.out.String())
	}
	// Every write the zombie made after its pause is at an epoch taken
	// after the pause (its new ownership), none at an old one.
	if n := count(t, e.db.Pool, `SELECT count(*) FROM sync_recorder_writes w WHERE owner = 'p3' AND written_at >= $1
        AND NOT EXISTS (SELECT 1 FROM sync_partition_epochs h WHERE h.partition = w.partition AND h.epoch = w.epoch AND h.acquired_at >= $1)`, resumed); n != 0 {
		t.Errorf("%d writes of the zombie after SIGCONT landed at epochs taken before it", n)
	}

	for _, id := range []string{"p3", "p4", "p5"} {
		s, _ := fl.read(fl.procs[id])
		if s.Stats.Overlaps != 0 {
			t.Errorf("%s ran a mailbox twice at once: %+v", id, s.Stats)
		}
		fl.terminate(fl.procs[id])
	}
	t.Logf("figures (session %s, heartbeat %s): graceful leave %s; SIGKILL failover %s", session, session/10, graceful, killed)
}
