package rebuild

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/placement/postgres"
)

// checkProjection checks the projection in pool against the decider's
// state: invariants 3 and 4 on the tables, and the state the engine would
// restore from it equals the decider's.
func checkProjection(t testing.TB, pool *pgxpool.Pool, want *placement.State) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := postgres.CheckInvariants(ctx, tx); err != nil {
		t.Fatalf("projection: %v", err)
	}
	ck, err := postgres.LoadSnapshot(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := placement.NewStateFromSnapshot(placementConfig, ck.State)
	if err != nil {
		t.Fatalf("restoring from the projection: %v", err)
	}
	if a, b := st.Snapshot(), want.Snapshot(); !reflect.DeepEqual(a, b) {
		t.Fatalf("the projection restores to\n%s\nthe decider's state is\n%s", mailplanetest.MustJSON(t, a), mailplanetest.MustJSON(t, b))
	}
}

func rebuild(t testing.TB, e *env, schema string, progress func(Progress)) *Rebuild {
	t.Helper()
	rb, err := Start(context.Background(), PlacementSpec(), Config{
		Kafka: e.kcfg, Live: e.db.Pool, Schema: schema, BatchSize: 37, Progress: progress, ProgressEvery: 5 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	t.Cleanup(func() { _ = rb.Drop(context.Background()) })
	return rb
}

func verifyEqual(t testing.TB, rb *Rebuild) Report {
	t.Helper()
	rep, err := rb.Verify(context.Background(), 30*time.Second)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	if !rep.Equal() {
		var b strings.Builder
		rep.Format(&b)
		t.Fatalf("the rebuild differs from the live projection:\n%s", b.String())
	}
	return rep
}

// TestRebuildPlacementEqualsLive: random scenarios run through the real
// engine (kfake) with the live placement projector (Postgres). After every
// round invariants 3 and 4 hold on the projected tables; the projection
// restores to exactly the state of the pure decider fed the same inputs;
// a rebuild from offset 0 into a fresh schema equals the live projection
// row for row (also after the live side pruned assignment changes, and
// with dead workers forgotten in the log); the
// rebuild swaps in while the projector runs, which goes on from the
// rebuild's offset; and a second rebuild equals the swapped-in one.
func TestRebuildPlacementEqualsLive(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	forgotten := 0
	t.Cleanup(func() {
		if forgotten == 0 && !t.Failed() {
			t.Error("no worker was forgotten in the scenarios: replay is not checked with worker_forgotten in the log")
		}
	})
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t)
			e.engine()
			e.projector(e.db.Pool)
			s := newScenario(e, seed)
			// Five rounds, and more (up to ten) while the log is short: a
			// liveness hold spares the deaths a round would otherwise
			// decide, and whether one starts depends on the engine's ticks.
			l := e.readLog()
			for r := 0; r < 5 || (len(l) < 100 && r < 10); r++ {
				s.round(40)
				checkProjection(t, e.db.Pool, e.verifyLog(e.settledLog(e.db.Pool)))
				l = e.readLog()
			}
			if len(l) < 100 {
				t.Fatalf("only %d decisions: the scenario is too tame", len(l))
			}
			mu.Lock()
			forgotten += countDecisions[*domain.PlacementWorkerForgotten](l)
			mu.Unlock()
			if seed == 1 {
				// The live side pruned old assignment changes; the
				// rebuild adopts its horizon before comparing.
				if _, err := postgres.PruneChanges(ctx, e.db.Pool, l[len(l)/2].offset); err != nil {
					t.Fatal(err)
				}
			}

			var mu sync.Mutex
			var reports []Progress
			rb := rebuild(t, e, e.db.Schema+"_placement_1", func(p Progress) { mu.Lock(); reports = append(reports, p); mu.Unlock() })
			if rb.Records() != int64(len(l)) {
				t.Errorf("the rebuild applied %d decisions, the log holds %d", rb.Records(), len(l))
			}
			mu.Lock()
			last := reports[len(reports)-1]
			mu.Unlock()
			if !last.Final || last.Records != int64(len(l)) || last.Fraction() != 1 {
				t.Errorf("last progress report %+v", last)
			}

			// More inputs while the rebuild waits: Verify catches it up
			// to exactly where the live projection stands.
			s.round(20)
			end := e.settle(e.db.Pool)
			rep := verifyEqual(t, rb)
			if rep.Positions[0].Next != end {
				t.Errorf("compared at %d, the log ends at %d", rep.Positions[0].Next, end)
			}
			for _, tr := range rep.Tables {
				if tr.Table == "placement_mailboxes" && tr.LiveRows == 0 {
					t.Error("no mailboxes compared")
				}
			}

			// Swap while the engine and the projector run.
			s.round(10)
			if err := rb.Swap(ctx); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				s.round(30)
				checkProjection(t, e.db.Pool, e.verifyLog(e.settledLog(e.db.Pool)))
			}
			var n int
			if err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{rb.Schema(), "placement_checkpoint"}.Sanitize()).Scan(&n); err != nil || n != 1 {
				t.Errorf("the previous projection is not in %s: %d rows, %v", rb.Schema(), n, err)
			}
			var token int64
			if err := e.db.Pool.QueryRow(ctx, `SELECT next_offset FROM projector_offsets WHERE projector = 'placement'`).Scan(&token); err != nil || token != e.logEnd() {
				t.Errorf("projector_offsets says %d (%v), the log ends at %d", token, err, e.logEnd())
			}

			rb2 := rebuild(t, e, e.db.Schema+"_placement_2", nil)
			verifyEqual(t, rb2)

			// A live row altered by hand: the verify finds that row.
			if _, err := e.db.Pool.Exec(ctx, `UPDATE placement_workers SET capacity = capacity + 1
WHERE worker_id = (SELECT worker_id FROM placement_workers ORDER BY worker_id LIMIT 1)`); err != nil {
				t.Fatal(err)
			}
			rep, err := rb2.Verify(ctx, 30*time.Second)
			if err != nil || rep.Equal() {
				t.Fatalf("verify of an altered live projection: %v, equal %v", err, rep.Equal())
			}
			for _, tr := range rep.Tables {
				if want := int64(map[bool]int{true: 1}[tr.Table == "placement_workers"]); tr.OnlyLive != want || tr.OnlyRebuilt != want {
					t.Errorf("%s: %d only live, %d only rebuilt, want %d", tr.Table, tr.OnlyLive, tr.OnlyRebuilt, want)
				}
			}

			// Cleanup sees both rebuild schemas (the swapped one holding the
			// previous projection) and drops neither while its rebuild runs.
			ls, err := List(ctx, e.db.Pool)
			if err != nil || len(ls) != 2 || ls[0].Schema != rb2.Schema() || ls[0].State != StateBuilt ||
				ls[1].Schema != rb.Schema() || ls[1].State != StatePrevious {
				t.Fatalf("rebuild schemas: %+v, %v", ls, err)
			}
			if err := Drop(ctx, e.db.Pool, rb2.Schema()); err == nil {
				t.Error("cleanup dropped the schema of a running rebuild")
			}
			rb2.Close()
			if err := Drop(ctx, e.db.Pool, rb2.Schema()); err != nil {
				t.Error(err)
			}
		})
	}
}

// recordingSnapshotter remembers the checkpoints it handed out.
type recordingSnapshotter struct {
	engine.Snapshotter
	mu    sync.Mutex
	loads []engine.Checkpoint
}

func (r *recordingSnapshotter) Load(ctx context.Context) (engine.Checkpoint, error) {
	ck, err := r.Snapshotter.Load(ctx)
	if err == nil {
		r.mu.Lock()
		r.loads = append(r.loads, ck)
		r.mu.Unlock()
	}
	return ck, err
}

func (r *recordingSnapshotter) last(t testing.TB) engine.Checkpoint {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.loads) == 0 {
		t.Fatal("the engine never loaded a checkpoint from Postgres")
	}
	return r.loads[len(r.loads)-1]
}

// TestEngineRestoresFromPostgres: an engine restored from the placement
// projection (postgres.Snapshotter) decides exactly as one
// restored from the whole log: the whole decision log, across engines
// restored from a checkpoint behind the log's end (folding the tail) and
// at its very end (seeding tick ids from the checkpoint's last decision
// id, then deciding a tick first), is what the pure decider makes from the
// same inputs from the empty state, ids included.
func TestEngineRestoresFromPostgres(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pool := e.db.Pool
	s := newScenario(e, 42)

	stopEngine := e.engine() // restores from the log
	stopProj := e.projector(pool)
	s.round(60)
	e.settle(pool)
	stopProj()
	s.round(40) // the projection falls behind
	e.settle(nil)
	stopEngine()
	s.round(20) // and inputs wait for the next engine

	snap := &recordingSnapshotter{Snapshotter: postgres.NewSnapshotter(pool)}
	stopEngine = e.engine(engine.WithSnapshotter(snap))
	end := e.settle(nil)
	ck := snap.last(t)
	if ck.NextOffset == 0 || ck.NextOffset >= end {
		t.Fatalf("restored from offset %d, want a checkpoint behind the log's end %d", ck.NextOffset, end)
	}
	e.verifyLog(e.readLog())
	stopEngine()

	// Now restore at the log's very end, and let a tick decide first: a
	// worker falls silent past the liveness window.
	stopProj = e.projector(pool)
	end = e.settle(pool)
	stopProj()
	snap2 := &recordingSnapshotter{Snapshotter: postgres.NewSnapshotter(pool)}
	e.engine(engine.WithSnapshotter(snap2))
	waitActive := time.Now().Add(30 * time.Second)
	for {
		// Active: restored, and granted liveness on the clock as it
		// reads now (before it jumps below).
		snap2.mu.Lock()
		n := len(snap2.loads)
		snap2.mu.Unlock()
		e.mu.Lock()
		active := e.last.Active()
		e.mu.Unlock()
		if n > 0 && active {
			break
		}
		if time.Now().After(waitActive) {
			t.Fatal("the engine did not restore")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ck := snap2.last(t); ck.NextOffset != end || ck.LastDecisionID == "" {
		t.Fatalf("restored from %+v, want the log's end %d with the last decision's id", ck, end)
	}
	e.clock.Set(s.now.Add(10 * time.Minute))
	deadline := time.Now().Add(30 * time.Second)
	for {
		l := e.readLog()
		if n := len(l); n > 0 && l[n-1].offset >= end {
			for _, en := range l {
				if en.offset >= end && !en.d.Cause.IsTick() {
					t.Fatalf("after the restore at %d, a decision not a tick's: %+v", end, en.d.Cause)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no tick decided after the restore at %d", end)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.settle(nil)
	e.verifyLog(e.readLog())
}
