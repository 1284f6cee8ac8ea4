package engine

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/placement"
)

// withTicked calls fn after each tick the engine decides.
func withTicked(fn func(time.Time)) Option { return func(c *config) { c.ticked = fn } }

// tickWatch remembers the times of the ticks the engine decided.
type tickWatch struct {
	mu    sync.Mutex
	ticks []time.Time
}

func (w *tickWatch) ticked(at time.Time) {
	w.mu.Lock()
	w.ticks = append(w.ticks, at)
	w.mu.Unlock()
}

func (w *tickWatch) reached(at time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range w.ticks {
		if !t.Before(at) {
			return true
		}
	}
	return false
}

// tickedAt moves the engine's clock to at and waits until the engine has
// decided a tick at that time. (A tick that decides nothing writes
// nothing: the decision log cannot show it.)
func tickedAt(t *testing.T, clock *fakeClock, w *tickWatch, at time.Time) {
	t.Helper()
	clock.Set(at)
	waitFor(t, 30*time.Second, "a tick at "+at.Format(time.RFC3339), func() bool { return w.reached(at) })
}

func liveFleet(t *testing.T, b testBroker, p *publisher, workers, mailboxes int) {
	t.Helper()
	var hbs []domain.Data
	for i := 1; i <= workers; i++ {
		hbs = append(hbs, heartbeat(i, domain.TierSharedPremium, domain.EgressOAuthAPI))
	}
	evs := p.publish(t0, hbs...)
	evs = append(evs, p.publish(t0, plan(1, domain.PlanPremium, 0))...)
	var ds []domain.Data
	for i := range mailboxes {
		ds = append(ds, mailboxAdded(i, 1, domain.ProviderGmail))
	}
	evs = append(evs, p.publish(t0, ds...)...)
	waitLog(t, b, 30*time.Second, "the fleet placed", func(l []logEntry) bool { return hasAll(l, evs) })
}

// TestEngineHoldsLivenessWhenEveryHeartbeatStops: every heartbeat stops
// for three liveness windows (the API down): no worker dies, no mailbox
// leaves its worker, one liveness_held decision, the holding gauge at 1.
// The engine is replaced mid-hold: its successor, restored from the log,
// keeps holding (gauge 1, no second hold, still no death). Heartbeats
// flow again but for one worker that died meanwhile: a
// liveness_resumed decision, the gauge back at 0, and that worker dies a
// window after the resume, its mailboxes moving in the same tick.
func TestEngineHoldsLivenessWhenEveryHeartbeatStops(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	clock := newFakeClock(t0)
	var w tickWatch
	e, stop := startEngine(t, b, WithClock(clock.Now), WithTickInterval(20*time.Millisecond), withTicked(w.ticked))
	p := newPublisher(t, b)
	liveFleet(t, b, p, 4, 12)

	// Three windows (30 s each, the default) of silence, in steps.
	for s := 10; s <= 95; s += 5 {
		tickedAt(t, clock, &w, t0.Add(time.Duration(s)*time.Second))
	}
	l := readLog(t, b)
	if n := count[*domain.PlacementLivenessHeld](l); n != 1 {
		t.Fatalf("%d liveness_held decisions, want 1:%s", n, groupJSON(t, l))
	}
	if n := count[*domain.PlacementWorkerDied](l) + count[*domain.PlacementRefused](l) + count[*domain.PlacementMigrated](l) + count[*domain.PlacementUnassigned](l); n != 0 {
		t.Fatalf("the silence moved mailboxes or killed workers:%s", groupJSON(t, l))
	}
	for _, en := range l {
		if d, ok := en.d.Data.(*domain.PlacementLivenessHeld); ok && (d.Silent != 4 || d.Live != 4 || !en.d.Cause.IsTick()) {
			t.Fatalf("held %s, cause %+v", mailplanetest.MustJSON(t, d), en.d.Cause)
		}
	}
	if g := testutil.ToFloat64(e.m.holding); g != 1 {
		t.Fatalf("mailplane_placement_liveness_holding %v while holding", g)
	}
	if c := testutil.ToFloat64(e.m.holds); c != 1 {
		t.Fatalf("mailplane_placement_liveness_holds_total %v", c)
	}

	// A new engine takes over in the middle of the hold and keeps holding.
	stop()
	e, _ = startEngine(t, b, WithClock(clock.Now), WithTickInterval(20*time.Millisecond), withTicked(w.ticked))
	for s := 100; s <= 160; s += 5 {
		tickedAt(t, clock, &w, t0.Add(time.Duration(s)*time.Second))
	}
	l = readLog(t, b)
	if count[*domain.PlacementLivenessHeld](l) != 1 || count[*domain.PlacementLivenessResumed](l) != 0 || count[*domain.PlacementWorkerDied](l) != 0 {
		t.Fatalf("after the takeover mid-hold:%s", groupJSON(t, l))
	}
	if g := testutil.ToFloat64(e.m.holding); g != 1 {
		t.Fatalf("the new engine's holding gauge %v", g)
	}

	// Heartbeats flow again from workers 1-3; worker 4 is gone.
	back := t0.Add(165 * time.Second)
	clock.Set(back)
	beat := func(at time.Time) {
		p.publish(at, heartbeat(1, domain.TierSharedPremium, domain.EgressOAuthAPI),
			heartbeat(2, domain.TierSharedPremium, domain.EgressOAuthAPI), heartbeat(3, domain.TierSharedPremium, domain.EgressOAuthAPI))
	}
	beat(back)
	l = waitLog(t, b, 30*time.Second, "liveness resumed", func(l []logEntry) bool { return count[*domain.PlacementLivenessResumed](l) == 1 })
	var resumed time.Time
	for _, en := range l {
		if d, ok := en.d.Data.(*domain.PlacementLivenessResumed); ok {
			resumed = d.At
			if d.Silent != 1 || d.Live != 4 || d.Reason != domain.ReasonHeartbeatsResumed {
				t.Fatalf("resumed %s", mailplanetest.MustJSON(t, d))
			}
		}
	}
	waitFor(t, 30*time.Second, "the holding gauge at 0", func() bool { return testutil.ToFloat64(e.m.holding) == 0 })
	for s := 10; s <= 30; s += 10 {
		clock.Set(resumed.Add(time.Duration(s) * time.Second))
		beat(resumed.Add(time.Duration(s) * time.Second))
	}
	clock.Set(resumed.Add(31 * time.Second))
	l = waitLog(t, b, 30*time.Second, "worker 4 dead", func(l []logEntry) bool { return count[*domain.PlacementWorkerDied](l) == 1 })
	st := verifyLog(t, b, l, p.events(), placement.Config{})
	if v, _ := st.Worker(workerID(4)); v.Live || v.Mailboxes != 0 {
		t.Fatalf("worker 4 after the resume's window: %+v", v)
	}
	if n := count[*domain.PlacementLivenessHeld](l); n != 1 {
		t.Fatalf("%d holds", n)
	}
	for i := range 12 {
		if v, _ := st.Mailbox(mailboxID(i)); v.WorkerID == "" || v.WorkerID == workerID(4) {
			t.Fatalf("mailbox %d: %+v", i, v)
		}
	}
}

// TestEngineOneDeadWorkerMovesWithinTheWindow: under normal conditions
// (the others heartbeating) one silent worker dies at the end of its
// window and its mailboxes move in the same tick; liveness is not held.
func TestEngineOneDeadWorkerMovesWithinTheWindow(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	clock := newFakeClock(t0)
	e, _ := startEngine(t, b, WithClock(clock.Now), WithTickInterval(20*time.Millisecond))
	p := newPublisher(t, b)
	liveFleet(t, b, p, 4, 12)
	before := readLog(t, b)
	var on3 int
	st := verifyLog(t, b, before, p.events(), placement.Config{})
	on3 = len(st.WorkerMailboxes(workerID(3)))
	if on3 == 0 {
		t.Fatal("worker 3 holds nothing")
	}
	for s := 10; s <= 30; s += 10 {
		at := t0.Add(time.Duration(s) * time.Second)
		clock.Set(at)
		hbs := p.publish(at, heartbeat(1, domain.TierSharedPremium, domain.EgressOAuthAPI),
			heartbeat(2, domain.TierSharedPremium, domain.EgressOAuthAPI), heartbeat(4, domain.TierSharedPremium, domain.EgressOAuthAPI))
		waitFor(t, 30*time.Second, "heartbeats heard", func() bool { return b.tr.Decided(hbs) })
	}
	deadline := t0.Add(31 * time.Second)
	clock.Set(deadline)
	l := waitLog(t, b, 30*time.Second, "worker 3 dead", func(l []logEntry) bool { return count[*domain.PlacementWorkerDied](l) == 1 })
	var died time.Time
	moved := 0
	for _, en := range l[len(before):] {
		switch d := en.d.Data.(type) {
		case *domain.PlacementWorkerDied:
			died = d.At
			if d.WorkerID != workerID(3) {
				t.Fatalf("died %s", mailplanetest.MustJSON(t, d))
			}
		case *domain.PlacementMigrated:
			moved++
			if !d.At.Equal(died) || d.FromWorker != workerID(3) {
				t.Fatalf("moved %s, not with the death at %s", mailplanetest.MustJSON(t, d), died)
			}
		case *domain.PlacementLivenessHeld:
			t.Fatalf("one worker of four held liveness: %s", mailplanetest.MustJSON(t, d))
		}
	}
	if moved != on3 || died.After(deadline) {
		t.Fatalf("%d of worker 3's %d mailboxes moved, at %s", moved, on3, died)
	}
	if g := testutil.ToFloat64(e.m.holding); g != 0 {
		t.Fatalf("holding gauge %v", g)
	}
}
