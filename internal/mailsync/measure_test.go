package mailsync_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailsync"
)

// TestAssignLargePartition assigns one partition holding 10,000 mailboxes
// to a worker and measures the time until every runner started, and the
// memory each running mailbox costs with the recording runner (worker
// state, runner goroutine and the recorder's bookkeeping). A second worker
// then takes the partition over with database writes on, and the time until
// every runner wrote its start row at the new epoch is measured too.
func TestAssignLargePartition(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement: not in -short")
	}
	t.Parallel()
	const n = 10_000
	e := newEnv(t, 1)
	f := newFixture(80)
	mbs := make([]domain.MailboxStateRecord, n)
	for i := range mbs {
		mbs[i] = f.mailbox("", time.Hour)
	}
	e.produce(stateRecords(t, mbs...)...)
	live := ids(mbs)

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	rec := &mailsync.RecordingRunner{NoWrites: true}
	cfg := testConfig(t, "big")
	cfg.ConnectRatePerHost = 1e6 // steady state: no runner left waiting on pacing
	start := time.Now()
	m := e.start(cfg, rec)
	waitFor(t, 120*time.Second, "10,000 runners", func() (bool, string) {
		got := len(rec.Running())
		return got == n, fmt.Sprintf("%d running", got)
	})
	took := time.Since(start)
	time.Sleep(200 * time.Millisecond)
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	heap := float64(after.HeapAlloc) - float64(before.HeapAlloc)
	stacks := float64(after.StackInuse) - float64(before.StackInuse)
	t.Logf("%d mailboxes in one partition: all runners started %s after the worker started; per running mailbox: %.0f bytes heap + %.0f bytes stack = %.1f KiB (%d goroutines)",
		n, took, heap/n, stacks/n, (heap+stacks)/n/1024, runtime.NumGoroutine())
	if ok, why := exactlyOnce(t, e.db.Pool, live, m); !ok {
		t.Fatal(why)
	}
	m.stop()

	// The takeover, writing a start row per mailbox through the fence.
	rec2 := &mailsync.RecordingRunner{}
	cfg2 := testConfig(t, "big-writes")
	cfg2.ConnectRatePerHost = 1e6
	start = time.Now()
	m2 := e.start(cfg2, rec2)
	waitFor(t, 120*time.Second, "10,000 runners", func() (bool, string) {
		got := len(rec2.Running())
		return got == n, fmt.Sprintf("%d running", got)
	})
	running := time.Since(start)
	ep := epochs(t, e.db.Pool)[0]
	waitFor(t, 300*time.Second, "10,000 start rows", func() (bool, string) {
		got := count(t, e.db.Pool, `SELECT count(*) FROM sync_recorder_writes WHERE epoch = $1 AND kind = 'start'`, ep)
		return got == n, fmt.Sprintf("%d start rows", got)
	})
	t.Logf("takeover of the 10,000: all runners started after %s; all start rows written through the fence after %s (pool of %d connections)",
		running, time.Since(start), e.db.Pool.Config().MaxConns)
	m2.stop()
}

// BenchmarkEvaluateTiers evaluates the tiers of 10,000 mailboxes, as a
// worker does on every cadence tick.
func BenchmarkEvaluateTiers(b *testing.B) {
	now := time.Now()
	in := make([]domain.SyncTierInput, 10_000)
	for i := range in {
		in[i] = domain.SyncTierInput{Current: domain.SyncTierWarm, MailKnown: true,
			NewestMail: now.Add(-time.Duration(i) * time.Minute), TrackedSince: now.Add(-time.Hour), AddedAt: now.Add(-24 * time.Hour)}
		if i%10 == 0 {
			in[i].SessionAt = now.Add(-time.Minute)
		}
	}
	p := domain.SyncTierPolicy{SessionGrace: 15 * time.Minute, HotActivity: 2 * time.Hour, ColdAfter: 7 * 24 * time.Hour,
		UnknownGrace: 10 * time.Minute, HotBudget: 500}
	b.ReportAllocs()
	for b.Loop() {
		domain.EvaluateSyncTiers(now, p, in)
	}
}
