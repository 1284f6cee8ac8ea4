package mailsync

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
)

// TestLastWriteContext: a stopped runner's last write outlives Run's
// context but not the bound the worker gave when it stopped it: the
// watchdog's (the coordinator may expire the session then), a fenced
// partition's (now: another worker owns it), or LastWriteTimeout.
func TestLastWriteContext(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	sup := newSupervisor(RunnerFunc(func(ctx context.Context, job *Job) error {
		<-ctx.Done()
		return nil
	}), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(prometheus.NewRegistry()))
	var n int
	lastWrite := func(stop func(id string) bool) context.Context {
		t.Helper()
		n++
		id := "mb-" + string(rune('a'+n))
		got := make(chan context.Context, 1)
		sup.runner = RunnerFunc(func(ctx context.Context, job *Job) error {
			<-ctx.Done()
			lctx, cancel := job.LastWriteContext(ctx)
			t.Cleanup(cancel)
			got <- lctx
			return nil
		})
		job, _ := NewJob(domain.MailboxStateRecord{MailboxID: id}, 0, 1, "w", nil, domain.SyncTierWarm, nil)
		if !sup.start(job) {
			t.Fatal("not started")
		}
		if !stop(id) {
			t.Fatal("not running")
		}
		return <-got
	}

	t.Run("before the stop it is Run's", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		job, _ := NewJob(domain.MailboxStateRecord{MailboxID: "x"}, 0, 1, "w", nil, domain.SyncTierWarm, nil)
		lctx, lcancel := job.LastWriteContext(ctx)
		defer lcancel()
		cancel()
		<-lctx.Done()
	})

	before := time.Now()
	plain := lastWrite(sup.stop)
	if plain.Err() != nil {
		t.Fatalf("last write of a plain stop: %v", plain.Err())
	}
	dl, ok := plain.Deadline()
	if !ok || dl.Before(before.Add(LastWriteTimeout)) || dl.After(time.Now().Add(LastWriteTimeout)) {
		t.Errorf("plain stop: deadline %v (ok %v), want LastWriteTimeout from the stop", dl, ok)
	}

	by := time.Now().Add(300 * time.Millisecond)
	bounded := lastWrite(func(id string) bool { return sup.stopBy(id, by) })
	if dl, ok := bounded.Deadline(); !ok || !dl.Equal(by) {
		t.Errorf("watchdog stop: deadline %v (ok %v), want %v", dl, ok, by)
	}

	past := lastWrite(func(id string) bool { return sup.stopBy(id, time.Now().Add(-time.Second)) })
	if past.Err() == nil {
		t.Error("a stop bounded by a past moment left time for a last write")
	}
}
