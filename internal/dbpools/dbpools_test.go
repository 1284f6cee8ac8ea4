package dbpools_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mailplane/mailplane/internal/dbpools"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/pgtest"
)

// TestOpenWaitsForTheDatabase: a process started before its database
// waits (logging each attempt, its health saying what it waits for)
// instead of exiting, and opens its pools, migrated, once the database
// answers.
func TestOpenWaitsForTheDatabase(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	// A port nothing listens on yet: the database "is not up".
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	u.Host = addr

	logs := &mailplanetest.Output{}
	w := &dbpools.Waiter{}
	type result struct {
		p   *dbpools.Pools
		err error
	}
	done := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go func() {
		p, err := dbpools.Open(ctx, u.String(), dbpools.Sizes{Serve: 2, Runners: 4, Work: 3},
			dbpools.Options{Logger: newLogger(logs), Waiter: w, MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
		done <- result{p, err}
	}()
	waitFor(t, func() bool { return strings.Count(logs.String(), "waiting for the database") >= 3 })
	if err := w.Err(ctx); err == nil || !strings.Contains(err.Error(), "waiting for the database") || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("health while waiting: %v", err)
	}
	select {
	case r := <-done:
		t.Fatalf("Open returned while the database was down: %v", r.err)
	default:
	}

	// The database comes up.
	stop := forward(t, addr, target)
	defer stop()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("Open did not return once the database answered")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.p.Close()
	if err := w.Err(ctx); err != nil {
		t.Errorf("health once open: %v", err)
	}
	if got := r.p.Serve.Config().MaxConns; got != 2 {
		t.Errorf("serve pool of %d connections, want 2", got)
	}
	if got := r.p.Runners.Config().MaxConns; got != 4 {
		t.Errorf("runner pool of %d connections, want 4", got)
	}
	var n int
	if err := r.p.Work.QueryRow(ctx, `SELECT count(*) FROM projector_offsets`).Scan(&n); err != nil {
		t.Errorf("the schema is not migrated: %v", err)
	}

	// Runners holding every connection of theirs (a thousand runners
	// writing) do not hold up the health check or the APIs.
	var held []interface{ Release() }
	for range 4 {
		c, err := r.p.Runners.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	qctx, qcancel := context.WithTimeout(ctx, time.Second)
	if _, err := r.p.Runners.Acquire(qctx); err == nil {
		t.Error("the runner pool gave a fifth connection")
	}
	qcancel()
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	if err := w.Err(pctx); err != nil {
		t.Errorf("the health check queued behind the runners: %v", err)
	}
	pcancel()
	for _, c := range held {
		c.Release()
	}
}

// TestOpenGivesUpOnlyWithItsContext: a URL that parses is waited on for
// as long as ctx lasts; one that does not parse fails at once.
func TestOpenGivesUpOnlyWithItsContext(t *testing.T) {
	t.Parallel()
	if _, err := dbpools.Open(context.Background(), "postgres://%zz", dbpools.Sizes{Serve: 1}, dbpools.Options{}); err == nil {
		t.Error("a URL that does not parse was accepted")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := dbpools.Open(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1", dbpools.Sizes{Serve: 1},
		dbpools.Options{MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err == nil || ctx.Err() == nil {
		t.Errorf("Open returned %v before its context ended", err)
	}
}

// forward accepts on addr and pipes every connection to target.
func forward(t *testing.T, addr, target string) (stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				d, err := net.DialTimeout("tcp", target, 5*time.Second)
				if err != nil {
					return
				}
				defer d.Close()
				go func() { _, _ = io.Copy(d, c); d.Close() }()
				_, _ = io.Copy(c, d)
			})
		}
	})
	return func() { ln.Close() }
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func newLogger(out io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
