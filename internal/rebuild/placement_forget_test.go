package rebuild

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/internal/workerapi"
)

// workersGauge sums mailplane_placement_workers over its series: the
// workers the active engine's state holds.
func workersGauge(t testing.TB, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "mailplane_placement_workers" {
			for _, m := range mf.GetMetric() {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// TestEngineForgetsWorkerFlood: 1,000 random worker ids heartbeat once
// (some take mailboxes) next to three real workers, and die. Within the
// retention the engine and the projection still know them; the first tick
// past it forgets every one (worker_forgotten, a tick's decisions), after
// which the engine's state, its workers gauge and the projection hold the
// three live workers only, later ticks decide nothing about the flood, the
// worker API answers a forgotten worker with no assignments, the log is
// exactly what the pure decider makes, and a rebuild from the log equals
// the live projection. An engine restored from the projection registers a
// forgotten id that heartbeats again as a new worker.
func TestEngineForgetsWorkerFlood(t *testing.T) {
	t.Parallel()
	const flood = 1000
	ctx := context.Background()
	e := newEnv(t)
	// A liveness window of an hour: the clock walks to the retention in
	// half-hour steps, the real workers heartbeating at each, so they stay
	// live across the jumps while the silent flood dies and is forgotten.
	e.cfg.HeartbeatInterval = 20 * time.Minute
	// A thousand ids falling silent at once next to three live workers
	// would hold liveness for up to LivenessHoldMax and then die
	// (placement's TestPlacementLivenessHoldExpires); here the flood must
	// die at its window.
	e.cfg.LivenessHoldMinWorkers = 1 << 30
	pool := e.db.Pool
	reg := prometheus.NewRegistry()
	stopEngine := e.engine(engine.WithRegisterer(reg))
	e.projector(pool)

	real := func(at time.Time) []domain.Event {
		var hbs []domain.Data
		for i := 1; i <= 3; i++ {
			hbs = append(hbs, &domain.WorkerHeartbeat{WorkerID: workerID(i), Tier: domain.TierSharedPremium, Egress: domain.EgressOAuthAPI, Address: fmt.Sprintf("10.0.0.%d:25", i)})
		}
		return e.publish(at, hbs...)
	}
	// beat walks the engine's clock to at in steps of half the liveness
	// window, the real workers heartbeating at each step. The engine
	// decides an input at its record timestamp but never after its own
	// clock, so the clock moves first; a tick at a step finds the real
	// workers' last heartbeat half a window old, still live.
	step := e.cfg.HeartbeatInterval * 3 / 2
	cur := t0
	beat := func(at time.Time) {
		t.Helper()
		// Even steps, each at least a heartbeat interval.
		n := (at.Sub(cur) + step - 1) / step
		if n < 1 {
			return
		}
		// Whole seconds: record timestamps carry milliseconds.
		each := (at.Sub(cur) / n).Truncate(time.Second)
		if each < e.cfg.HeartbeatInterval {
			t.Fatalf("beat(%s): a step of %s is shorter than the heartbeat interval", at, each)
		}
		for i := time.Duration(1); i <= n; i++ {
			cur = cur.Add(each)
			if i == n {
				cur = at
			}
			e.clock.Set(cur)
			// Heard, not recorded: the engine committed them.
			e.waitDecided(real(cur))
		}
	}
	real(t0)
	e.publish(t0, &domain.OrgPlanChanged{OrgID: orgID(1), Plan: domain.PlanPremium, Paid: true, Source: "evt"})

	r := rand.New(rand.NewPCG(1000, 1))
	floodIDs := map[string]bool{}
	var hbs []domain.Data
	for range flood {
		id := fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", r.Uint32(), r.IntN(1<<16), r.IntN(1<<12), r.IntN(1<<12), r.Int64N(1<<48))
		floodIDs[id] = true
		hbs = append(hbs, &domain.WorkerHeartbeat{WorkerID: id, Tier: domain.TierSharedPremium, Egress: domain.EgressColdSMTP, Address: "198.51.100.7:25"})
	}
	e.clock.Set(t0.Add(time.Second))
	e.publish(t0.Add(time.Second), hbs...)
	var boxes []domain.Data
	for mb := range 20 {
		boxes = append(boxes, mailboxAdded(mb, 1, domain.ProviderSMTPIMAP, false))
	}
	e.clock.Set(t0.Add(2 * time.Second))
	e.publish(t0.Add(2*time.Second), boxes...)
	e.settledLog(pool)
	if n := countWorkers(t, pool); n != flood+3 {
		t.Fatalf("the projection holds %d workers after the flood, want %d", n, flood+3)
	}
	onFlood := 0
	st := e.verifyLog(e.readLog())
	for _, v := range st.Snapshot().Mailboxes {
		if floodIDs[v.WorkerID] {
			onFlood++
		}
	}
	if onFlood == 0 {
		t.Fatal("no mailbox was placed on a flood worker")
	}

	// The flood dies; just within the retention it is still known.
	beat(t0.Add(2 * time.Hour))
	waitDecisions[*domain.PlacementWorkerDied](t, e, flood)
	l := e.settledLog(pool)
	if n := countDecisions[*domain.PlacementWorkerDied](l); n != flood {
		t.Fatalf("%d workers died, want %d", n, flood)
	}
	within := t0.Add(time.Second + placementConfig.WorkerRetention)
	beat(within)
	l = e.settledLog(pool)
	if n := countDecisions[*domain.PlacementWorkerForgotten](l); n != 0 {
		t.Fatalf("%d workers forgotten within the retention", n)
	}
	if n := countWorkers(t, pool); n != flood+3 {
		t.Fatalf("the projection holds %d workers within the retention, want %d", n, flood+3)
	}

	// Past it, a tick forgets the whole flood.
	past := within.Add(step)
	beat(past)
	waitDecisions[*domain.PlacementWorkerForgotten](t, e, flood)
	l = e.settledLog(pool)
	forgottenAt := int64(-1)
	for _, en := range l {
		if f, ok := en.d.Data.(*domain.PlacementWorkerForgotten); ok {
			if !floodIDs[f.WorkerID] || !en.d.Cause.IsTick() || f.Reason != domain.ReasonRetentionExpired {
				t.Fatalf("offset %d: unexpected %+v (cause %+v)", en.offset, f, en.d.Cause)
			}
			delete(floodIDs, f.WorkerID)
			forgottenAt = en.offset
		}
	}
	if len(floodIDs) != 0 {
		t.Fatalf("%d flood workers not forgotten", len(floodIDs))
	}
	st = e.verifyLog(l)
	if n, _, _ := st.Counts(); n != 3 {
		t.Fatalf("the decider holds %d workers, want the 3 live ones", n)
	}
	checkProjection(t, pool, st)
	if n := countWorkers(t, pool); n != 3 {
		t.Fatalf("the projection holds %d workers, want 3", n)
	}
	// The engine updates its gauge after its commit returns, which may
	// be after the projector has applied the decisions.
	deadline := time.Now().Add(30 * time.Second)
	for workersGauge(t, reg) != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("mailplane_placement_workers sums to %v, want 3", workersGauge(t, reg))
		}
		time.Sleep(10 * time.Millisecond)
	}
	var gone string
	for _, en := range l {
		if f, ok := en.d.Data.(*domain.PlacementWorkerForgotten); ok {
			gone = f.WorkerID
			break
		}
	}
	res, err := postgres.NewStore(pool).Assignments(ctx, gone, workerapi.Token{})
	if err != nil || !res.Full || len(res.Mailboxes) != 0 {
		t.Fatalf("a forgotten worker's assignments: %+v %v, want an empty full list", res, err)
	}

	// Later ticks decide nothing about the flood.
	later := past.Add(time.Hour)
	beat(later)
	l = e.settledLog(pool)
	for _, en := range l {
		if en.offset > forgottenAt && en.d.Cause.IsTick() {
			t.Fatalf("offset %d: a later tick decided %s", en.offset, en.d.Data.EventType())
		}
	}

	// Replay equals live, forgotten workers and all.
	verifyEqual(t, rebuild(t, e, e.db.Schema+"_placement_1", nil))

	// An engine restored from the projection no longer knows the
	// forgotten ids: one heartbeating again is a new worker.
	stopEngine()
	e.engine(engine.WithSnapshotter(postgres.NewSnapshotter(pool)))
	again := later.Add(time.Minute) // within liveness of the real workers: a tick first decides nothing
	e.publish(again, &domain.WorkerHeartbeat{WorkerID: gone, Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Address: "198.51.100.7:25"})
	e.clock.Set(again)
	deadline = time.Now().Add(60 * time.Second)
	for !e.engineCaughtUp() {
		if time.Now().After(deadline) {
			t.Fatalf("the restored engine did not decide the heartbeat:%s", e.engineBehind())
		}
		time.Sleep(20 * time.Millisecond)
	}
	l = e.settledLog(pool)
	last := l[len(l)-1].d.Data
	if reg, ok := last.(*domain.PlacementWorkerRegistered); !ok || reg.WorkerID != gone {
		t.Fatalf("a forgotten worker's heartbeat decided %s %s, want worker_registered", last.EventType(), mailplanetest.MustJSON(t, last))
	}
	checkProjection(t, pool, e.verifyLog(l))
}

// countWorkers counts the projection's worker rows.
func countWorkers(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM placement_workers`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func countDecisions[T domain.PlacementDecision](l []logEntry) int {
	n := 0
	for _, en := range l {
		if _, ok := en.d.Data.(T); ok {
			n++
		}
	}
	return n
}

// waitDecisions waits until the log holds n decisions of type T: a tick
// decides after the clock moved, which settling alone (a log standing
// still for a moment) may not wait for on a busy machine.
func waitDecisions[T domain.PlacementDecision](t testing.TB, e *env, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := countDecisions[T](e.readLog())
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			var zero T
			t.Fatalf("the log holds %d %T decisions after 60s, want %d", got, zero, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
