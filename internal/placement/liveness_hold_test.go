package placement

import (
	"reflect"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// plFleet registers n premium OAuth workers (capacity 100 each on day 1)
// and places mailboxes mailboxes on them, all heard at the harness's time.
func plFleet(t *testing.T, cfg Config, n, mailboxes int) *plHarness {
	t.Helper()
	h := newPlHarness(t, cfg)
	h.plan(1, domain.PlanPremium, 0, true)
	for w := 1; w <= n; w++ {
		h.hb(w, domain.TierSharedPremium, domain.EgressOAuthAPI)
	}
	for m := 1; m <= mailboxes; m++ {
		h.add(m, 1, domain.ProviderGmail, false)
	}
	return h
}

// beat heartbeats the given workers with their attributes.
func (h *plHarness) beat(workers ...int) {
	h.t.Helper()
	for _, w := range workers {
		v := h.worker(w)
		h.apply(&domain.WorkerHeartbeat{WorkerID: v.ID, Tier: v.BaseTier, Egress: v.Egress, Address: v.Address, Stopping: v.Stopping})
	}
}

// placements returns where every mailbox sits.
func (h *plHarness) placements() map[string]string {
	out := map[string]string{}
	for _, m := range h.live.Snapshot().Mailboxes {
		out[m.ID] = m.WorkerID
	}
	return out
}

func plCount[T domain.PlacementDecision](ds []domain.PlacementDecision) int { return len(plOf[T](ds)) }

// The whole fleet falling silent at once (the API, Postgres or the network
// in between down) holds liveness: one liveness_held, no death and no
// mailbox leaving its worker for three windows; explicit events still act;
// heartbeats flowing again resume it, and a worker that stays silent dies
// a whole window after the resume, its mailboxes moving then.
func TestPlacementLivenessHoldFleetSilent(t *testing.T) {
	t.Parallel()
	h := plFleet(t, Config{HeartbeatInterval: 10 * time.Second}, 6, 24)
	all := []int{1, 2, 3, 4, 5, 6}
	for range 3 {
		h.advance(10 * time.Second)
		h.beat(all...)
		h.tick()
	}
	before := h.placements()
	silentFrom := h.now
	// Silence: ticks every 2 s for three windows.
	var held []*domain.PlacementLivenessHeld
	for range 45 {
		h.advance(2 * time.Second)
		ds := h.tick()
		held = append(held, plOf[*domain.PlacementLivenessHeld](ds)...)
		if n := plCount[*domain.PlacementWorkerDied](ds) + plCount[*domain.PlacementMigrated](ds) + plCount[*domain.PlacementRefused](ds); n != 0 {
			t.Fatalf("%s into the silence: %s", h.now.Sub(silentFrom), plJSON(ds))
		}
	}
	if len(held) != 1 {
		t.Fatalf("%d liveness_held decisions, want 1", len(held))
	}
	if d := held[0]; d.Silent != 6 || d.Live != 6 || d.SharePermille != 1000 || d.ThresholdPermille != DefaultLivenessHoldPermille ||
		d.MinWorkers != DefaultLivenessHoldMinWorkers || d.Reason != domain.ReasonFleetSilent || !d.At.After(silentFrom.Add(30*time.Second)) {
		t.Fatalf("held: %s", plJSON(d))
	}
	if got := h.placements(); !reflect.DeepEqual(got, before) {
		t.Fatalf("mailboxes moved during the hold:\n%v\n%v", before, got)
	}
	if v := h.live.Liveness(); !v.Holding || !v.HeldSince.Equal(held[0].At) {
		t.Fatalf("liveness %+v", v)
	}
	// Explicit events still act while holding: a removal removes, a
	// stopping heartbeat drains (worker 6 was heard: it is not silent).
	if ds := h.remove(1); plCount[*domain.PlacementUnassigned](ds) != 1 {
		t.Fatalf("removal while holding: %s", plJSON(ds))
	}
	ds := h.stop(6)
	if v := h.worker(6); plCount[*domain.PlacementMigrated](ds) == 0 || !v.Stopping || v.Mailboxes != 0 {
		t.Fatalf("worker 6 not drained: %+v", v)
	}
	// Heartbeats flow again from all but worker 3 (it died in the outage):
	// the next tick resumes.
	h.advance(time.Second)
	h.beat(1, 2, 4, 5, 6)
	h.advance(time.Second)
	ds = h.tick()
	res := plOf[*domain.PlacementLivenessResumed](ds)
	if len(res) != 1 || res[0].Silent != 1 || res[0].Live != 6 || res[0].Reason != domain.ReasonHeartbeatsResumed || !res[0].HeldSince.Equal(held[0].At) || len(ds) != 1 {
		t.Fatalf("resume: %s", plJSON(ds))
	}
	resumed := h.now
	// Worker 3 gets a whole window from the resume, then dies as usual
	// (no second hold: it was silent through the hold).
	for h.now.Before(resumed.Add(30 * time.Second)) {
		h.advance(2 * time.Second)
		if h.now.Sub(resumed)%(10*time.Second) == 0 {
			h.beat(1, 2, 4, 5, 6)
		}
		if !h.now.After(resumed.Add(30 * time.Second)) {
			if ds := h.tick(); len(ds) != 0 {
				t.Fatalf("%s after the resume: %s", h.now.Sub(resumed), plJSON(ds))
			}
		}
	}
	n3 := h.worker(3).Mailboxes
	h.advance(time.Millisecond)
	ds = h.tick()
	died := plOf[*domain.PlacementWorkerDied](ds)
	if len(died) != 1 || died[0].WorkerID != plWorker(3) || !died[0].LastSeen.Equal(resumed) || plCount[*domain.PlacementLivenessHeld](ds) != 0 {
		t.Fatalf("after the resume's window: %s", plJSON(ds))
	}
	if n := plCount[*domain.PlacementMigrated](ds); n != n3 || n3 == 0 {
		t.Fatalf("worker 3's %d mailboxes: %d moved: %s", n3, n, plJSON(ds))
	}
	if v := h.worker(3); v.Live || v.Mailboxes != 0 {
		t.Fatalf("worker 3: %+v", v)
	}
}

// One worker dying among many is not a blind observer: it dies at the end
// of its window and its mailboxes move at once, as before the hold
// existed. So does a worker of a fleet smaller than the minimum.
func TestPlacementLivenessOneDeathMovesAtOnce(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		workers int
		beating []int
	}{
		{"one of six", 6, []int{1, 2, 3, 4, 5}},
		{"two of five (40 %)", 5, []int{1, 2, 3}},
		{"both of a two-worker fleet", 2, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := plFleet(t, Config{HeartbeatInterval: 10 * time.Second}, c.workers, 4*c.workers)
			var silent []string
			for w := 1; w <= c.workers; w++ {
				if !containsInt(c.beating, w) {
					silent = append(silent, plWorker(w))
				}
			}
			last := h.now
			for range 3 {
				h.advance(10 * time.Second)
				h.beat(c.beating...)
				if ds := h.tick(); len(ds) != 0 {
					t.Fatalf("within the window: %s", plJSON(ds))
				}
			}
			h.advance(time.Millisecond)
			ds := h.tick()
			var died []string
			for _, d := range plOf[*domain.PlacementWorkerDied](ds) {
				died = append(died, d.WorkerID)
				if !d.LastSeen.Equal(last) {
					t.Fatalf("death %s", plJSON(d))
				}
			}
			if !reflect.DeepEqual(died, silent) || plCount[*domain.PlacementLivenessHeld](ds) != 0 {
				t.Fatalf("died %v, want %v: %s", died, silent, plJSON(ds))
			}
			for _, w := range silent {
				if v, _ := h.live.Worker(w); v.Mailboxes != 0 {
					t.Fatalf("dead worker %s keeps %d mailboxes", w, v.Mailboxes)
				}
			}
		})
	}
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// A hold that outlasts LivenessHoldMax ends (liveness_hold_expired): the
// workers silent through it then die a window later, without holding
// again, so a fleet that really lost most of its workers fails over, late.
func TestPlacementLivenessHoldExpires(t *testing.T) {
	t.Parallel()
	cfg := Config{HeartbeatInterval: 10 * time.Second, LivenessHoldMax: 5 * time.Minute}
	h := plFleet(t, cfg, 5, 10)
	// Workers 1-3 die for good; 4 and 5 keep heartbeating.
	var heldAt time.Time
	for range 40 {
		h.advance(10 * time.Second)
		h.beat(4, 5)
		for _, d := range plOf[*domain.PlacementLivenessHeld](h.tick()) {
			heldAt = d.At
		}
	}
	if heldAt.IsZero() {
		t.Fatal("three of five silent at once did not hold liveness")
	}
	v := h.live.Liveness()
	if v.Holding || !v.HeldSince.Equal(heldAt) || v.ResumedAt.Sub(heldAt) < 5*time.Minute {
		t.Fatalf("after the longest hold: %+v", v)
	}
	var dead []string
	for _, d := range h.log {
		switch d := d.(type) {
		case *domain.PlacementLivenessResumed:
			if d.Reason != domain.ReasonLivenessHoldExpired {
				t.Fatalf("resumed %s", plJSON(d))
			}
		case *domain.PlacementWorkerDied:
			dead = append(dead, d.WorkerID)
			if !d.At.After(v.ResumedAt.Add(30 * time.Second)) {
				t.Fatalf("died before the resume's window: %s", plJSON(d))
			}
		}
	}
	if want := []string{plWorker(1), plWorker(2), plWorker(3)}; !reflect.DeepEqual(dead, want) {
		t.Fatalf("died %v, want %v", dead, want)
	}
	if n := len(plOf[*domain.PlacementLivenessHeld](h.log)); n != 1 {
		t.Fatalf("%d holds", n)
	}
	for m := 1; m <= 10; m++ {
		if w := h.mailbox(m).WorkerID; w != plWorker(4) && w != plWorker(5) {
			t.Fatalf("mailbox %d on %q", m, w)
		}
	}
}

// An engine that takes over in the middle of a hold (restored from the
// fold of the log, granted liveness on its clock) keeps holding and
// decides exactly as the engine that never stopped, granted the same,
// through the rest of the hold, the resume and the deaths after it.
func TestPlacementLivenessHoldRestoreDecidesAlike(t *testing.T) {
	t.Parallel()
	cfg := Config{HeartbeatInterval: 10 * time.Second}
	h := plFleet(t, cfg, 8, 40)
	for range 40 { // silence: a hold
		h.advance(2 * time.Second)
		h.tick()
	}
	if !h.live.Liveness().Holding {
		t.Fatal("no hold")
	}
	restored, err := NewStateFromSnapshot(cfg, h.restored.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(restored.Snapshot(), h.live.Snapshot()) {
		t.Fatal("the restored state differs")
	}
	restored.GrantLiveness(h.now)
	h.live.GrantLiveness(h.now)
	var all []domain.PlacementDecision
	step := func(in Input) {
		t.Helper()
		a, b := h.live.Apply(in), restored.Apply(in)
		if plJSON(a) != plJSON(b) {
			t.Fatalf("at %s: decisions differ after the takeover:\n%s\n%s", in.At, plJSON(a), plJSON(b))
		}
		all = append(all, a...)
	}
	tick := func() { h.advance(2 * time.Second); step(Tick(h.now)) }
	beat := func(ws ...int) {
		for _, w := range ws {
			v := h.worker(w)
			step(Input{At: h.now, Event: &domain.WorkerHeartbeat{WorkerID: v.ID, Tier: v.BaseTier, Egress: v.Egress, Address: v.Address}})
		}
	}
	for range 60 { // still silent: both keep holding
		tick()
	}
	if len(all) != 0 {
		t.Fatalf("the silence went on and the engines decided %s", plJSON(all))
	}
	for range 60 { // workers 1-6 are back, 7 and 8 are gone
		if h.now.Second()%10 == 0 {
			beat(1, 2, 3, 4, 5, 6)
		}
		tick()
	}
	var got []string
	for _, d := range all {
		got = append(got, domain.ShortType(d.EventType())+" "+string(d.Meta().Reason))
	}
	if len(plOf[*domain.PlacementLivenessResumed](all)) != 1 || len(plOf[*domain.PlacementWorkerDied](all)) != 2 {
		t.Fatalf("after the silence: %v", got)
	}
	if !reflect.DeepEqual(restored.Snapshot(), h.live.Snapshot()) {
		t.Fatal("states diverged")
	}
}

// A known worker flipping its tier on every heartbeat moves its mailboxes
// at most once per TierDwell: the first change is honoured at once, the
// flips within the dwell are heard, not recorded.
func TestPlacementTierFlapBounded(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{HeartbeatInterval: 10 * time.Second})
	h.plan(1, domain.PlanPremium, 0, true)
	h.hb(1, domain.TierSharedPremium, domain.EgressOAuthAPI)
	h.hb(2, domain.TierSharedPremium, domain.EgressOAuthAPI)
	h.hb(3, domain.TierSharedFree, domain.EgressOAuthAPI)
	for m := 1; m <= 8; m++ {
		h.add(m, 1, domain.ProviderGmail, false)
	}
	mark := len(h.log)
	tiers := [2]domain.Tier{domain.TierSharedFree, domain.TierSharedPremium}
	flip := func(i int) []domain.PlacementDecision {
		h.advance(10 * time.Second)
		h.hb(2, domain.TierSharedPremium, domain.EgressOAuthAPI)
		h.hb(3, domain.TierSharedFree, domain.EgressOAuthAPI)
		return h.hb(1, tiers[i%2], domain.EgressOAuthAPI)
	}
	// 20 heartbeats over 200 s, within one dwell: the first moves the
	// mailboxes off (premium → free), the other 19 decide nothing.
	for i := range 20 {
		ds := flip(i)
		if i == 0 && (plCount[*domain.PlacementWorkerChanged](ds) != 1 || plCount[*domain.PlacementMigrated](ds) == 0) {
			t.Fatalf("the first tier change: %s", plJSON(ds))
		}
		if i > 0 && len(ds) != 0 {
			t.Fatalf("flip %d within the dwell decided %s", i, plJSON(ds))
		}
	}
	first := len(h.log) - mark
	if first > 1+8 {
		t.Fatalf("20 flips: %d decisions", first)
	}
	// An hour of flips every 10 s (360): tier changes at most once per
	// dwell, each at least a dwell after the one before.
	var changes []time.Time
	moves := 0
	for i := range 360 {
		for _, d := range flip(i) {
			switch d := d.(type) {
			case *domain.PlacementWorkerChanged:
				if d.Reason == domain.ReasonWorkerTierChanged {
					changes = append(changes, d.At)
					if !d.TierHeldUntil.Equal(d.At.Add(DefaultTierDwell)) {
						t.Fatalf("tier change %s", plJSON(d))
					}
				}
			case *domain.PlacementMigrated:
				moves++
			}
		}
	}
	if len(changes) > 13 || len(changes) < 10 {
		t.Fatalf("%d tier changes in an hour, want one per %s", len(changes), DefaultTierDwell)
	}
	for i := 1; i < len(changes); i++ {
		if changes[i].Sub(changes[i-1]) < DefaultTierDwell {
			t.Fatalf("tier changes %s apart", changes[i].Sub(changes[i-1]))
		}
	}
	// Each honoured change to free moves the 8 premium mailboxes at most once.
	if moves > 8*len(changes) {
		t.Fatalf("%d moves for %d tier changes", moves, len(changes))
	}
	t.Logf("20 flips: %d decisions; an hour of flips: %d tier changes, %d moves", first, len(changes), moves)
}

// Holds entered and resumed in a loop (heartbeats cut for a little over
// half a window each time a window is about to run out, the rest flowing,
// as an attacker who can stall the API at will would do) do not keep a
// worker that died alive: a worker silent through a hold dies when the
// window the resume granted runs out, even if a new hold begins at that
// tick (its death recorded before the hold). Before, each new hold spared
// it again, for ever: its mailboxes never moved.
func TestPlacementLivenessHoldFlappingKillsTheDead(t *testing.T) {
	t.Parallel()
	h := plFleet(t, Config{HeartbeatInterval: 10 * time.Second}, 6, 24)
	others := []int{1, 2, 4, 5, 6}
	h.advance(10 * time.Second)
	h.beat(1, 2, 3, 4, 5, 6)
	h.tick()
	// Worker 3 dies now; the others go on, but every heartbeat is cut
	// from 10 s after a resume until a hold begins, then flows again.
	diedAt := h.now
	var resumed time.Time
	holds, deaths := 0, 0
	for h.now.Sub(diedAt) < 30*time.Minute && deaths == 0 {
		h.advance(2 * time.Second)
		holding := h.live.Liveness().Holding
		if holding || resumed.IsZero() && h.now.Sub(diedAt) < 10*time.Second || !resumed.IsZero() && h.now.Sub(resumed) < 10*time.Second {
			h.beat(others...)
		}
		for _, d := range h.tick() {
			switch d := d.(type) {
			case *domain.PlacementLivenessHeld:
				holds++
			case *domain.PlacementLivenessResumed:
				resumed = d.At
			case *domain.PlacementWorkerDied:
				if d.WorkerID != plWorker(3) {
					t.Fatalf("%s died: %s", d.WorkerID, plJSON(d))
				}
				deaths++
			}
		}
	}
	if holds == 0 {
		t.Fatal("no hold: the test shows nothing")
	}
	if deaths != 1 {
		t.Fatalf("worker 3, silent since %s, not dead after %s and %d holds", diedAt, h.now.Sub(diedAt), holds)
	}
	if limit := DefaultLivenessHoldMax + 2*30*time.Second; h.now.Sub(diedAt) > limit {
		t.Fatalf("worker 3 died %s after its last heartbeat, over %s (%d holds)", h.now.Sub(diedAt), limit, holds)
	}
	if n := h.worker(3).Mailboxes; n != 0 {
		t.Fatalf("worker 3 still holds %d mailboxes", n)
	}
	t.Logf("worker 3 died %s after its last heartbeat, after %d holds", h.now.Sub(diedAt), holds)
}

// The same loop of holds across a takeover: an engine restored from the
// fold of the log right after a resume, granted liveness on its clock as
// the engine that never stopped is, decides exactly as it does, and the
// dead worker still dies (one hold later: a takeover knows no heartbeat
// of the hold before it).
func TestPlacementLivenessHoldFlappingRestoreDecidesAlike(t *testing.T) {
	t.Parallel()
	cfg := Config{HeartbeatInterval: 10 * time.Second}
	h := plFleet(t, cfg, 6, 24)
	others := []int{1, 2, 4, 5, 6}
	var restored *State
	var all []domain.PlacementDecision
	step := func(in Input) {
		t.Helper()
		a := h.live.Apply(in)
		if restored != nil {
			if b := restored.Apply(in); plJSON(a) != plJSON(b) {
				t.Fatalf("at %s: decisions differ after the takeover:\n%s\n%s", in.At, plJSON(a), plJSON(b))
			}
		}
		all = append(all, a...)
	}
	beat := func() {
		for _, w := range others {
			v := h.worker(w)
			step(Input{At: h.now, Event: &domain.WorkerHeartbeat{WorkerID: v.ID, Tier: v.BaseTier, Egress: v.Egress, Address: v.Address}})
		}
	}
	diedAt := h.now
	var resumed time.Time
	for h.now.Sub(diedAt) < 30*time.Minute && plCount[*domain.PlacementWorkerDied](all) == 0 {
		h.advance(2 * time.Second)
		if restored == nil && !resumed.IsZero() { // the takeover, a tick after the first resume
			var err error
			if restored, err = NewStateFromSnapshot(cfg, h.live.Snapshot()); err != nil {
				t.Fatal(err)
			}
			restored.GrantLiveness(h.now)
			h.live.GrantLiveness(h.now)
		}
		if h.live.Liveness().Holding || h.now.Sub(diedAt) < 10*time.Second || !resumed.IsZero() && h.now.Sub(resumed) < 10*time.Second {
			beat()
		}
		n := len(all)
		step(Tick(h.now))
		for _, d := range plOf[*domain.PlacementLivenessResumed](all[n:]) {
			resumed = d.At
		}
	}
	if restored == nil {
		t.Fatal("no resume: the test shows nothing")
	}
	died := plOf[*domain.PlacementWorkerDied](all)
	if len(died) != 1 || died[0].WorkerID != plWorker(3) {
		t.Fatalf("after %s and %d holds: died %s", h.now.Sub(diedAt), plCount[*domain.PlacementLivenessHeld](all), plJSON(died))
	}
	if !reflect.DeepEqual(restored.Snapshot(), h.live.Snapshot()) {
		t.Fatal("states diverged")
	}
	t.Logf("worker 3 died %s after its last heartbeat, after %d holds", h.now.Sub(diedAt), plCount[*domain.PlacementLivenessHeld](all))
}
