package projections_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/topics"
)

// Environment of the crash helper child.
const (
	envCrashHelper  = "MAILPLANE_CRASH_HELPER"
	envCrashBrokers = "MAILPLANE_CRASH_BROKERS"
	envCrashDB      = "MAILPLANE_CRASH_DATABASE_URL"
	envCrashNS      = "MAILPLANE_CRASH_NAMESPACE"
	// envCrashEvents overrides how many records TestCrash produces.
	envCrashEvents = "MAILPLANE_CRASH_EVENTS"
)

const crashReady = "crash-helper: ready"

// crashGroup is the child's group membership: a static instance id, so a
// restarted child takes its killed predecessor's place at once instead of
// waiting out its session.
var crashGroup = kafka.GroupConfig{SessionTimeout: kafkatest.SessionTimeout(2 * time.Second), HeartbeatInterval: 200 * time.Millisecond, InstanceID: "crash-child"}

// crashHelper is the child process of TestCrash: a projector, as a
// small main would run it, until SIGTERM or SIGKILL.
// TestMain runs this test binary as the child process of TestCrash when
// the environment asks for it, instead of running tests.
func TestMain(m *testing.M) {
	if os.Getenv(envCrashHelper) == "1" {
		crashHelper()
	}
	os.Exit(m.Run())
}

func crashHelper() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// The parent waits for this line before it may SIGTERM us.
	fmt.Println(crashReady)
	pool, err := pgxpool.New(ctx, os.Getenv(envCrashDB))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := projections.New(kafka.Config{Brokers: kafka.ParseBrokers(os.Getenv(envCrashBrokers)), ClientID: "crash-child",
		Namespace: topics.Namespace(os.Getenv(envCrashNS))},
		pool, projections.NewRegistry(),
		projections.WithLogger(logger), projections.WithGroup(crashGroup), projections.WithBatchSize(200))
	if err != nil {
		log.Fatal(err)
	}
	if err := p.Run(ctx); err != nil {
		log.Fatal(err)
	}
	os.Exit(0)
}

// TestCrash produces events while a child projector is SIGKILLed at 20
// random points and restarted, then checks its schema against an
// uninterrupted run of the same log: same rows, every distinct event id
// applied once. The broker lives in this process, so it survives the kills.
func TestCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test: not in -short")
	}
	t.Parallel()
	n := 20000
	if s := os.Getenv(envCrashEvents); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			t.Fatal(err)
		}
	}
	e := newEnv(t)
	crashDB := e.db
	url := pgtest.URLWithSchema(t, crashDB.Schema)

	// The load: mixed events, and about 2% of records re-sent with the
	// same id (a producer retrying).
	rng := rand.New(rand.NewPCG(20260101, 7))
	g := newGen(20260101, 400)
	var records []domain.Event
	distinct := map[string]bool{}
	for len(records) < n {
		if len(records) > 100 && rng.IntN(50) == 0 {
			records = append(records, records[rng.IntN(len(records))])
			continue
		}
		ev := g.next()
		distinct[ev.ID] = true
		records = append(records, ev)
	}

	recs := make([]*kgo.Record, len(records))
	for i, ev := range records {
		r, err := topics.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		recs[i] = r
	}
	kafkatest.InNamespace(e.kcfg, recs...)
	// Production is spread over the kills, as at load.
	var wg sync.WaitGroup
	var produceErr error
	wg.Go(func() {
		for i := 0; i < len(recs); i += 250 {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := e.prod.ProduceSync(ctx, recs[i:min(i+250, len(recs))]...).FirstErr()
			cancel()
			if err != nil {
				produceErr = err
				return
			}
			time.Sleep(time.Duration(100+rng.IntN(100)) * time.Millisecond)
		}
	})
	defer wg.Wait()

	applied := func() int { return count(t, crashDB.Pool, `SELECT count(*) FROM applied_events`) }
	kills := 20
	killRNG := rand.New(rand.NewPCG(1, 2))
	for i := range kills {
		before := applied()
		c := startChild(t, e.kcfg, url)
		c.waitReady(t)
		// A random point while the child is applying: after it has
		// applied 1 to 600 more events (or 3s, if the load ran dry).
		target := before + 1 + killRNG.IntN(600)
		deadline := time.Now().Add(3 * time.Second)
		for applied() < target && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		c.kill(t)
		t.Logf("kill %d: %d events applied (target %d)", i+1, applied(), target)
	}
	wg.Wait()
	if produceErr != nil {
		t.Fatal(produceErr)
	}
	c := startChild(t, e.kcfg, url)
	c.waitReady(t)
	waitCaughtUp(t, e.kcfg, crashDB.Pool, projections.RegistryName, domainTopics, 3*time.Minute)
	c.terminate(t)

	// The uninterrupted run of the same log, in-process, into its own schema.
	refDB := newDB(t)
	p, _ := e.projector(refDB, projections.NewRegistry(), projections.WithGroup(withGroupName(testGroup, "crash-reference")), projections.WithBatchSize(200))
	stop := start(t, p)
	waitCaughtUp(t, e.kcfg, refDB, projections.RegistryName, domainTopics, 3*time.Minute)
	stop()

	if got, want := registryCounts(t, crashDB.Pool), registryCounts(t, refDB); got != want {
		t.Errorf("counts differ: crashed %s, uninterrupted %s", got, want)
	}
	if got, want := registryChecksum(t, crashDB.Pool), registryChecksum(t, refDB); got != want {
		t.Errorf("checksums differ: crashed %s, uninterrupted %s", got, want)
	}
	for name, pool := range map[string]*pgxpool.Pool{"crashed": crashDB.Pool, "uninterrupted": refDB} {
		if got := count(t, pool, `SELECT count(*) FROM applied_events`); got != len(distinct) {
			t.Errorf("%s: applied_events = %d, want %d distinct ids", name, got, len(distinct))
		}
	}
	t.Logf("%d records (%d distinct ids), %d kills: %s", len(records), len(distinct), kills, registryCounts(t, refDB))
}

type child struct {
	cmd *exec.Cmd
	out *mailplanetest.Output
}

func (c *child) waitReady(t *testing.T) {
	t.Helper()
	waitFor(t, 30*time.Second, "child to start", func() (bool, error) {
		return strings.Contains(c.out.String(), crashReady), nil
	})
}

func startChild(t *testing.T, kcfg kafka.Config, url string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(os.Environ(),
		envCrashHelper+"=1",
		envCrashBrokers+"="+strings.Join(kcfg.Brokers, ","),
		envCrashDB+"="+url,
		envCrashNS+"="+string(kcfg.Namespace),
	)
	out := &mailplanetest.Output{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, out: out}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	})
	return c
}

func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := c.cmd.Wait()
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
		// It exited on its own before the kill: that is a failure.
		t.Fatalf("child exited before SIGKILL (%v):\n%s", err, c.out)
	}
}

func (c *child) terminate(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("child did not stop cleanly: %v\n%s", err, c.out)
		}
	case <-time.After(60 * time.Second):
		_ = c.cmd.Process.Kill()
		t.Fatalf("child did not stop within 60s of SIGTERM:\n%s", c.out)
	}
	if s := c.out.String(); strings.Contains(s, "level=ERROR") {
		t.Logf("child log:\n%s", s)
	}
}
