package placement

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// Test ids are canonical UUIDs whose first group names the kind.
func plWorker(i int) string  { return fmt.Sprintf("00000001-0000-4000-8000-%012x", i) }
func plMailbox(i int) string { return fmt.Sprintf("00000002-0000-4000-8000-%012x", i) }
func plOrg(i int) string     { return fmt.Sprintf("00000003-0000-4000-8000-%012x", i) }

var plT0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// plNoHold as LivenessHoldMinWorkers: liveness is never held, for tests
// whose fleets must die all at once.
const plNoHold = 1 << 30

// plHarness drives a live state and, beside it, a state restored only by
// folding the JSON of the live state's decisions. On every input it checks
// the invariants, that each decision validates and survives JSON, that each
// refusal or degraded placement was justified against the state just before
// it, and that the restored state equals the live one.
type plHarness struct {
	t        testing.TB
	live     *State
	restored *State
	now      time.Time
	log      []domain.PlacementDecision
	types    map[string]int
}

func newPlHarness(t testing.TB, cfg Config) *plHarness {
	return &plHarness{t: t, live: NewState(cfg), restored: NewState(cfg), now: plT0, types: map[string]int{}}
}

func plHarnessFrom(t testing.TB, cfg Config, snap Snapshot, now time.Time) *plHarness {
	t.Helper()
	live, err := NewStateFromSnapshot(cfg, snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := Invariants(live); err != nil {
		t.Fatalf("initial state: %v", err)
	}
	return &plHarness{t: t, live: live, restored: live.Clone(), now: now, types: map[string]int{}}
}

func (h *plHarness) apply(ev domain.Data) []domain.PlacementDecision {
	h.t.Helper()
	ds := h.live.Apply(Input{At: h.now, Event: ev})
	h.check(ds, fmt.Sprintf("%T", ev))
	return ds
}

func (h *plHarness) check(ds []domain.PlacementDecision, what string) {
	h.t.Helper()
	if err := Invariants(h.live); err != nil {
		h.t.Fatalf("after %s at %s: invariants: %v\ndecisions: %s", what, h.now, err, plJSON(ds))
	}
	for i, d := range ds {
		if ps := d.Validate(); len(ps) > 0 {
			h.t.Fatalf("after %s: decision %d %s invalid: %v", what, i, d.EventType(), ps)
		}
		raw, err := json.Marshal(d)
		if err != nil {
			h.t.Fatal(err)
		}
		back, err := domain.DecodePlacementDecision(d.EventType(), raw)
		if err != nil {
			h.t.Fatalf("decision %s: %v (%s)", d.EventType(), err, raw)
		}
		if !reflect.DeepEqual(back, d) {
			h.t.Fatalf("decision %s does not survive JSON:\n%#v\n%#v", d.EventType(), d, back)
		}
		if err := DecisionJustified(h.restored, back); err != nil {
			h.t.Fatalf("after %s: unjustified: %v\ndecisions: %s", what, err, plJSON(ds))
		}
		if err := h.restored.ApplyDecision(back); err != nil {
			h.t.Fatalf("restore: folding %s: %v", raw, err)
		}
		h.types[d.EventType()]++
	}
	h.log = append(h.log, ds...)
	if a, b := h.live.Snapshot(), h.restored.Snapshot(); !reflect.DeepEqual(a, b) {
		h.t.Fatalf("after %s: restored state differs from live:\nlive     %s\nrestored %s", what, plJSON(a), plJSON(b))
	}
}

func (h *plHarness) tick() []domain.PlacementDecision {
	h.t.Helper()
	ds := h.live.Apply(Tick(h.now))
	h.check(ds, "tick")
	return ds
}

func (h *plHarness) advance(d time.Duration) { h.now = h.now.Add(d) }

func (h *plHarness) hb(worker int, tier domain.Tier, egress domain.Egress) []domain.PlacementDecision {
	h.t.Helper()
	return h.apply(&domain.WorkerHeartbeat{WorkerID: plWorker(worker), Tier: tier, Egress: egress, Address: fmt.Sprintf("10.0.0.%d:25", worker)})
}

func (h *plHarness) stop(worker int) []domain.PlacementDecision {
	h.t.Helper()
	w := h.live.workers[plWorker(worker)]
	return h.apply(&domain.WorkerHeartbeat{WorkerID: w.id, Tier: w.baseTier, Egress: w.egress, Address: w.address, Stopping: true})
}

// mature registers the given workers 15 days ago in effect: it advances the
// clock past the age ramp and heartbeats every live worker.
func (h *plHarness) mature() {
	h.t.Helper()
	h.advance(15 * 24 * time.Hour)
	h.beatAll()
}

// beatAll heartbeats every known worker with its current attributes.
func (h *plHarness) beatAll() {
	h.t.Helper()
	for _, v := range h.live.Snapshot().Workers {
		h.apply(&domain.WorkerHeartbeat{WorkerID: v.ID, Tier: v.BaseTier, Egress: v.Egress, Address: v.Address, Stopping: v.Stopping})
	}
}

func (h *plHarness) add(mb, org int, p domain.Provider, warmup bool) []domain.PlacementDecision {
	h.t.Helper()
	return h.apply(&domain.MailboxAdded{MailboxID: plMailbox(mb), OrgID: plOrg(org), UserID: plOrg(org), Address: "a@b.c", Provider: p, WarmupEnabled: warmup})
}

func (h *plHarness) remove(mb int) []domain.PlacementDecision {
	h.t.Helper()
	return h.apply(&domain.MailboxRemoved{MailboxID: plMailbox(mb), Reason: "deleted by user"})
}

func (h *plHarness) score(mb int, st domain.HealthState) []domain.PlacementDecision {
	h.t.Helper()
	return h.apply(&domain.MailboxHealthScored{MailboxID: plMailbox(mb), State: st, Score: 50, Reason: "sweep"})
}

func (h *plHarness) plan(org int, p domain.Plan, n int, paid bool) []domain.PlacementDecision {
	h.t.Helper()
	return h.apply(&domain.OrgPlanChanged{OrgID: plOrg(org), Plan: p, DedicatedWorkers: n, Paid: paid, Source: "evt_test"})
}

func (h *plHarness) sample(worker int, sends, bounces, complaints int64) []domain.PlacementDecision {
	h.t.Helper()
	return h.apply(&domain.WorkerHealthSampled{WorkerID: plWorker(worker), WindowSeconds: 3600, Sends: sends, HardBounces: bounces, Complaints: complaints})
}

func (h *plHarness) worker(i int) WorkerView {
	h.t.Helper()
	v, ok := h.live.Worker(plWorker(i))
	if !ok {
		h.t.Fatalf("no worker %d", i)
	}
	return v
}

func (h *plHarness) mailbox(i int) MailboxView {
	h.t.Helper()
	v, ok := h.live.Mailbox(plMailbox(i))
	if !ok {
		h.t.Fatalf("no mailbox %d", i)
	}
	return v
}

// on asserts mailbox mb sits on worker w (0: pending).
func (h *plHarness) on(mb, w int) {
	h.t.Helper()
	want := ""
	if w != 0 {
		want = plWorker(w)
	}
	if got := h.mailbox(mb).WorkerID; got != want {
		h.t.Fatalf("mailbox %d on %q, want %q", mb, got, want)
	}
}

func plJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func plOf[T domain.PlacementDecision](ds []domain.PlacementDecision) []T {
	var out []T
	for _, d := range ds {
		if x, ok := d.(T); ok {
			out = append(out, x)
		}
	}
	return out
}

func plTypes(ds []domain.PlacementDecision) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = domain.ShortType(d.EventType())
	}
	return out
}
