package placement

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// plRandomWorkerID is a random canonical UUID, as a flood of made-up
// worker ids would send.
func plRandomWorkerID(r *rand.Rand) string {
	return fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", r.Uint32(), r.IntN(1<<16), r.IntN(1<<12), r.IntN(1<<12), r.Int64N(1<<48))
}

// TestPlacementForgetsDeadWorkers: a flood of random worker ids that
// heartbeat once (some taking mailboxes) all die, stay known while the
// retention runs, and are forgotten by the first tick past it, so the
// state returns to the live set; from then on a tick visits none of them.
// Folding the log under another retention restores the same state (the
// fold does not read the configuration), and a forgotten id that
// heartbeats again registers as a new worker.
func TestPlacementForgetsDeadWorkers(t *testing.T) {
	t.Parallel()
	const flood = 500
	// Hundreds of workers silent at once would hold liveness
	// (TestPlacementLivenessHold...): here they must die.
	cfg := Config{HeartbeatInterval: 10 * time.Second, WorkerRetention: 24 * time.Hour, LivenessHoldMinWorkers: plNoHold}
	h := newPlHarness(t, cfg)
	r := rand.New(rand.NewPCG(9, 9))
	live := []int{1, 2, 3}
	beatLive := func() {
		for _, w := range live {
			h.hb(w, domain.TierSharedPremium, domain.EgressOAuthAPI)
		}
	}
	beatLive()
	h.plan(1, domain.PlanPremium, 0, true)

	ids := map[string]bool{}
	start := h.now // no flood worker is seen before
	for i := range flood {
		id := plRandomWorkerID(r)
		ids[id] = true
		h.advance(time.Duration(r.IntN(200)) * time.Millisecond)
		tier := []domain.Tier{domain.TierSharedFree, domain.TierSharedPremium, ""}[r.IntN(3)]
		h.apply(&domain.WorkerHeartbeat{WorkerID: id, Tier: tier, Egress: domain.EgressColdSMTP, Address: "198.51.100.7:25"})
		if i%25 == 0 {
			h.add(i, 1, domain.ProviderSMTPIMAP, false) // some land on flood workers
		}
	}
	if n, _, _ := h.live.Counts(); n != flood+len(live) {
		t.Fatalf("%d workers after the flood, want %d", n, flood+len(live))
	}
	onFlood := 0
	for _, m := range h.live.Snapshot().Mailboxes {
		if ids[m.WorkerID] {
			onFlood++
		}
	}
	if onFlood == 0 {
		t.Fatal("no mailbox landed on a flood worker: the scenario does not test dying with mailboxes")
	}

	// The flood dies; the live workers keep beating. Up to the retention
	// nothing is forgotten.
	for h.now.Add(10*time.Minute).Sub(start) <= cfg.WorkerRetention {
		h.advance(10 * time.Minute)
		beatLive()
		h.tick()
	}
	if got := len(plOf[*domain.PlacementWorkerDied](h.log)); got != flood {
		t.Fatalf("%d workers died, want %d", got, flood)
	}
	if got := len(plOf[*domain.PlacementWorkerForgotten](h.log)); got != 0 {
		t.Fatalf("%d workers forgotten within the retention", got)
	}
	for _, m := range h.live.Snapshot().Mailboxes {
		if ids[m.WorkerID] {
			t.Fatalf("mailbox %s still on dead flood worker %s", m.ID, m.WorkerID)
		}
	}

	// Past the retention, one tick forgets every one of them.
	h.advance(30 * time.Minute)
	beatLive()
	ds := h.tick()
	forgotten := plOf[*domain.PlacementWorkerForgotten](ds)
	if len(forgotten) != flood {
		t.Fatalf("the tick past the retention forgot %d workers, want %d: %s", len(forgotten), flood, plTypes(ds))
	}
	for _, f := range forgotten {
		if !ids[f.WorkerID] || f.Reason != domain.ReasonRetentionExpired || f.RetentionSeconds != 24*3600 {
			t.Fatalf("unexpected forgotten decision %s", plJSON(f))
		}
		if h.now.Sub(f.LastSeen) <= cfg.WorkerRetention {
			t.Fatalf("worker %s forgotten %s after its last heartbeat, within the retention", f.WorkerID, h.now.Sub(f.LastSeen))
		}
		delete(ids, f.WorkerID)
	}
	if len(ids) != 0 {
		t.Fatalf("%d flood workers never forgotten", len(ids))
	}
	if n, _, _ := h.live.Counts(); n != len(live) {
		t.Fatalf("%d workers after the retention, want the %d live ones", n, len(live))
	}
	if a, d := len(h.live.liveBySeen.items), len(h.live.deadBySeen.items); a != len(live) || d != 0 {
		t.Fatalf("the tick's heaps hold %d live and %d dead workers, want %d and 0", a, d, len(live))
	}
	h.advance(time.Hour)
	beatLive()
	if ds := h.tick(); len(ds) != 0 {
		t.Fatalf("a later tick decided %s", plTypes(ds))
	}

	// The fold does not depend on the retention configured.
	other := NewState(Config{WorkerRetention: 1000 * time.Hour})
	for _, d := range h.log {
		if err := other.ApplyDecision(d); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(other.Snapshot(), h.live.Snapshot()) {
		t.Fatal("folding the log under another retention restores another state")
	}

	// A forgotten id heartbeating again is a new worker.
	ds = h.apply(&domain.WorkerHeartbeat{WorkerID: forgotten[0].WorkerID, Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Address: "198.51.100.7:25"})
	if reg := plOf[*domain.PlacementWorkerRegistered](ds); len(reg) != 1 || reg[0].WorkerID != forgotten[0].WorkerID {
		t.Fatalf("a forgotten worker's heartbeat decided %s, want worker_registered", plJSON(ds))
	}
	if v, ok := h.live.Worker(forgotten[0].WorkerID); !ok || !v.FirstSeen.Equal(h.now) || !v.Live {
		t.Fatalf("re-registered worker %+v, want first seen now", v)
	}
}

// TestPlacementForgetRefusesInconsistent: the fold refuses to forget a
// worker that is unknown, live, holds mailboxes or was seen at another
// time, and changes nothing when it refuses.
func TestPlacementForgetRefusesInconsistent(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{HeartbeatInterval: 10 * time.Second, WorkerRetention: time.Hour})
	h.hb(1, domain.TierSharedFree, domain.EgressColdSMTP)
	h.hb(2, domain.TierSharedFree, domain.EgressColdSMTP)
	h.add(1, 1, domain.ProviderSMTPIMAP, false)
	seen1 := h.worker(1).LastSeen
	at := h.now.Add(2 * time.Hour)
	forget := func(id string, last time.Time) *domain.PlacementWorkerForgotten {
		return &domain.PlacementWorkerForgotten{PlacementMeta: placementMeta(at, domain.ReasonRetentionExpired), WorkerID: id, LastSeen: last, RetentionSeconds: 3600}
	}
	before := h.live.Snapshot()
	for name, d := range map[string]*domain.PlacementWorkerForgotten{
		"unknown":       forget(plWorker(9), seen1),
		"live, holding": forget(plWorker(1), seen1),
		"live, idle":    forget(plWorker(2), seen1),
	} {
		if err := h.live.ApplyDecision(d); err == nil {
			t.Errorf("%s: forgotten", name)
		}
	}
	if !reflect.DeepEqual(before, h.live.Snapshot()) {
		t.Error("a refused worker_forgotten changed the state")
	}
	// Worker 2 dies; forgetting it with the wrong last_seen is refused.
	h.advance(time.Minute)
	h.hb(1, domain.TierSharedFree, domain.EgressColdSMTP)
	h.tick()
	if v := h.worker(2); v.Live {
		t.Fatal("worker 2 did not die")
	}
	before = h.live.Snapshot()
	if err := h.live.ApplyDecision(forget(plWorker(2), seen1.Add(time.Second))); err == nil {
		t.Error("forgotten with another last_seen")
	}
	if !reflect.DeepEqual(before, h.live.Snapshot()) {
		t.Error("a refused worker_forgotten changed the state")
	}
	if err := Invariants(h.live); err != nil {
		t.Fatal(err)
	}
}

// TestPlacementWorkerRetentionBounds: the retention is 7 days by default,
// never shorter than liveness (a worker is not forgotten before it dies)
// and always something a worker_forgotten decision can record.
func TestPlacementWorkerRetentionBounds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in, want time.Duration
	}{
		{0, 7 * 24 * time.Hour},
		{-time.Hour, 7 * 24 * time.Hour},
		{time.Nanosecond, 30 * time.Second}, // the default liveness window
		{36 * time.Hour, 36 * time.Hour},
		{100 * 365 * 24 * time.Hour, domain.MaxWorkerRetentionSeconds * time.Second},
	} {
		got := NewState(Config{WorkerRetention: c.in}).Config().WorkerRetention
		if got != c.want {
			t.Errorf("WorkerRetention %s: %s, want %s", c.in, got, c.want)
		}
		d := &domain.PlacementWorkerForgotten{PlacementMeta: placementMeta(plT0, domain.ReasonRetentionExpired), WorkerID: plWorker(1),
			LastSeen: plT0.Add(-got - time.Second), RetentionSeconds: int64(got / time.Second)}
		if ps := d.Validate(); len(ps) > 0 {
			t.Errorf("WorkerRetention %s: the decision it makes is invalid: %s", c.in, ps)
		}
	}
}

// TestPlacementForgetSpreadsOverTicks: a burst of workers expiring
// together is forgotten over several ticks, at most MaxForgetPerTick per
// tick and the longest silent first, so no tick's transaction grows with
// the burst.
func TestPlacementForgetSpreadsOverTicks(t *testing.T) {
	t.Parallel()
	const n, per = 250, 100
	h := newPlHarness(t, Config{HeartbeatInterval: 10 * time.Second, WorkerRetention: time.Hour, MaxForgetPerTick: per, LivenessHoldMinWorkers: plNoHold})
	order := make([]string, n) // by last heartbeat
	for i := range n {
		h.advance(time.Millisecond)
		id := plWorker(n - i) // ids in the reverse order of the heartbeats
		order[i] = id
		h.apply(&domain.WorkerHeartbeat{WorkerID: id, Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP})
	}
	h.advance(2 * time.Hour)
	var got []string
	for _, want := range []int{per, per, n - 2*per, 0} {
		f := plOf[*domain.PlacementWorkerForgotten](h.tick())
		if len(f) != want {
			t.Fatalf("a tick forgot %d workers, want %d", len(f), want)
		}
		for _, d := range f {
			got = append(got, d.WorkerID)
		}
		h.advance(time.Second)
	}
	if !reflect.DeepEqual(got, order) {
		t.Fatalf("forgotten in order %v, want the longest silent first %v", got[:5], order[:5])
	}
	if w, _, _ := h.live.Counts(); w != 0 {
		t.Fatalf("%d workers left", w)
	}
}
