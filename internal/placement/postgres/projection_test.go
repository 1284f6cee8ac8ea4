package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/internal/workerapi"
	"github.com/mailplane/mailplane/topics"
)

// Test ids are canonical UUIDs whose first group names the kind.
func workerID(i int) string  { return fmt.Sprintf("00000001-0000-4000-8000-%012x", i) }
func mailboxID(i int) string { return fmt.Sprintf("00000002-0000-4000-8000-%012x", i) }
func orgID(i int) string     { return fmt.Sprintf("00000003-0000-4000-8000-%012x", i) }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// WorkerRetention is short enough for random runs to forget dead workers.
var testConfig = placement.Config{HeartbeatInterval: 20 * time.Second, BandDwell: 2 * time.Minute, WorkerRetention: 60 * time.Hour}

// inputGen generates random but plausible inputs over a small universe (8
// workers, 5 orgs, 40 mailboxes) so that capacity runs out, pools fill,
// workers die and come back, and plans change under load. Times carry
// nanoseconds, which timestamptz would lose.
type inputGen struct {
	r      *rand.Rand
	tier   map[int]domain.Tier
	egress map[int]domain.Egress
	stop   map[int]bool
	silent map[int]bool
}

func newInputGen(seed uint64) *inputGen {
	return &inputGen{
		r:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		tier: map[int]domain.Tier{}, egress: map[int]domain.Egress{}, stop: map[int]bool{}, silent: map[int]bool{},
	}
}

func (g *inputGen) pick(n int) int { return 1 + g.r.IntN(n) }

func (g *inputGen) next(now *time.Time) placement.Input {
	r := g.r
	switch x := r.IntN(1000); {
	case x < 10:
		*now = now.Add(time.Duration(1+r.IntN(3)) * 24 * time.Hour)
	case x < 60:
		*now = now.Add(time.Duration(1+r.IntN(10)) * time.Minute)
	default:
		*now = now.Add(time.Duration(r.IntN(4000))*time.Millisecond + time.Duration(r.IntN(1000)))
	}
	in := placement.Input{At: *now}
	switch x := r.IntN(100); {
	case x < 32:
		w := g.pick(8)
		if r.IntN(100) < 3 {
			g.silent[w] = !g.silent[w]
		}
		if g.silent[w] {
			return in // a tick instead
		}
		if _, ok := g.tier[w]; !ok || r.IntN(100) < 4 {
			g.tier[w] = []domain.Tier{domain.TierSharedFree, domain.TierSharedPremium, domain.TierSharedPremium, ""}[r.IntN(4)]
		}
		if _, ok := g.egress[w]; !ok || r.IntN(100) < 3 {
			g.egress[w] = []domain.Egress{domain.EgressColdSMTP, domain.EgressColdSMTP, domain.EgressWarmupOnly, domain.EgressOAuthAPI}[r.IntN(4)]
		}
		if r.IntN(100) < 5 {
			g.stop[w] = !g.stop[w]
		}
		in.Event = &domain.WorkerHeartbeat{WorkerID: workerID(w), Tier: g.tier[w], Egress: g.egress[w], Address: fmt.Sprintf("10.0.0.%d:25", w), Stopping: g.stop[w]}
	case x < 45:
		// tick
	case x < 65:
		org := g.pick(5)
		in.Event = &domain.MailboxAdded{
			MailboxID: mailboxID(g.pick(40)), OrgID: orgID(org), UserID: orgID(org), Address: "a@b.c",
			Provider:      []domain.Provider{domain.ProviderSMTPIMAP, domain.ProviderSMTPIMAP, domain.ProviderGmail, domain.ProviderOutlook}[r.IntN(4)],
			WarmupEnabled: r.IntN(3) == 0,
		}
	case x < 72:
		in.Event = &domain.MailboxRemoved{MailboxID: mailboxID(g.pick(40)), Reason: "gone"}
	case x < 86:
		st := []domain.HealthState{domain.HealthHealthy, domain.HealthHealthy, domain.HealthHealthy, domain.HealthWatch,
			domain.HealthThrottled, domain.HealthQuarantined, domain.HealthBlocked}[r.IntN(7)]
		in.Event = &domain.MailboxHealthScored{MailboxID: mailboxID(g.pick(40)), State: st, Score: float64(r.IntN(101)), Reason: "sweep"}
	case x < 92:
		p := []domain.Plan{domain.PlanFree, domain.PlanPremium, domain.PlanPremium, domain.PlanDedicated, domain.PlanDedicated}[r.IntN(5)]
		n := 0
		if p == domain.PlanDedicated || r.IntN(5) == 0 {
			n = r.IntN(4)
		}
		in.Event = &domain.OrgPlanChanged{OrgID: orgID(g.pick(5)), Plan: p, DedicatedWorkers: n, Paid: r.IntN(8) != 0, Source: "evt"}
	default:
		sends := []int64{0, 50, 1000, 10000}[r.IntN(4)]
		in.Event = &domain.WorkerHealthSampled{
			WorkerID: workerID(g.pick(8)), WindowSeconds: 3600, Sends: sends,
			HardBounces: sends * int64(r.IntN(12)) / 100, Complaints: sends * int64(r.IntN(12)) / 1000,
		}
	}
	return in
}

func newDB(t testing.TB) *pgtest.DB {
	t.Helper()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	return db
}

func applyRecords(t testing.TB, pool *pgxpool.Pool, recs []postgres.Record, next int64) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return postgres.New("").ApplyDecisions(ctx, tx, recs, next)
	})
	if err != nil {
		t.Fatalf("apply %d decisions up to %d: %v", len(recs), next, err)
	}
}

// restored loads the projection as the engine would restore it.
func restored(t testing.TB, pool *pgxpool.Pool) (*placement.State, postgres.Checkpoint) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	ck, err := postgres.LoadSnapshot(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := placement.NewStateFromSnapshot(testConfig, ck.State)
	if err != nil {
		t.Fatalf("restore from the projection: %v", err)
	}
	return st, postgres.Checkpoint{NextOffset: ck.NextOffset, LastDecisionID: ck.LastDecisionID}
}

// sameOverSimpleProtocol loads the snapshot again over the simple
// protocol (as behind a transaction pooler), where Postgres answers in
// text rather than the binary uuids and bigints LoadSnapshot decodes by
// hand, and wants the same checkpoint.
func sameOverSimpleProtocol(t testing.TB, pool *pgxpool.Pool, want engine.Checkpoint) {
	t.Helper()
	ctx := context.Background()
	cfg := pool.Config().ConnConfig.Copy()
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	got, err := postgres.LoadSnapshot(ctx, tx)
	if err != nil {
		t.Fatalf("over the simple protocol: %v", err)
	}
	byID := func(a, b placement.MailboxView) int { return strings.Compare(a.ID, b.ID) }
	slices.SortFunc(got.State.Mailboxes, byID)
	want.State.Mailboxes = slices.Clone(want.State.Mailboxes)
	slices.SortFunc(want.State.Mailboxes, byID)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the snapshot over the simple protocol\n%s\nover the extended one\n%s", toJSON(got), toJSON(want))
	}
}

func toJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// boundary is the state at a checkpoint that ends an input: the token a
// worker polling then would hold, and every worker's mailboxes.
type boundary struct {
	token   int64
	workers map[string][]string
}

// TestPlacementProjectionFoldsLikeTheDecider runs random inputs through the
// pure decider and projects its decisions in random batches (cut anywhere,
// also inside one input's decisions, with offset gaps where transaction
// markers sit). After every batch the projection, restored as the engine
// restores it, equals the fold of the decisions so far; at every input
// boundary invariants 3 and 4 hold on the tables and the pending view
// agrees with the decider's pending placements; at the end the worker
// API's change answers since every earlier token are exact, and projecting
// the same log in one batch writes the very same rows. The runs forget
// dead workers (their rows deleted) and register some of them again.
func TestPlacementProjectionFoldsLikeTheDecider(t *testing.T) {
	t.Parallel()
	const seeds, steps = 12, 500
	var mu sync.Mutex
	forgotten, held, resumed := 0, 0, 0
	t.Cleanup(func() {
		if forgotten == 0 && !t.Failed() {
			t.Errorf("no worker was forgotten in %d random runs: the retention is not exercised", seeds)
		}
		if (held == 0 || resumed == 0) && !t.Failed() {
			t.Errorf("liveness held %d times and resumed %d times in %d random runs: placement_liveness is not exercised", held, resumed, seeds)
		}
	})
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			types := runRandom(t, seed, steps)
			mu.Lock()
			forgotten += types[domain.TypePlacementWorkerForgotten]
			held += types[domain.TypePlacementLivenessHeld]
			resumed += types[domain.TypePlacementLivenessResumed]
			mu.Unlock()
		})
	}
}

func runRandom(t *testing.T, seed uint64, steps int) map[string]int {
	ctx := context.Background()
	db := newDB(t)
	pool := db.Pool
	g := newInputGen(seed)
	r := rand.New(rand.NewPCG(seed, 7))
	decider := placement.NewState(testConfig)
	folded := placement.NewState(testConfig)
	now := t0
	var all, batch []postgres.Record
	var boundaries []boundary
	off := int64(0)
	types := map[string]int{}

	flush := func(next int64, atBoundary bool) {
		t.Helper()
		applyRecords(t, pool, batch, next)
		for _, rec := range batch {
			if err := folded.ApplyDecision(rec.Decision.Data); err != nil {
				t.Fatalf("fold: %v", err)
			}
		}
		batch = batch[:0]
		st, ck := restored(t, pool)
		if ck.NextOffset != next {
			t.Fatalf("checkpoint %d, want %d", ck.NextOffset, next)
		}
		if len(all) > 0 && ck.LastDecisionID != all[len(all)-1].Decision.ID {
			t.Fatalf("checkpoint's last decision %s, want %s", ck.LastDecisionID, all[len(all)-1].Decision.ID)
		}
		if a, b := st.Snapshot(), folded.Snapshot(); !reflect.DeepEqual(a, b) {
			t.Fatalf("offset %d: the projection restores to\n%s\nthe fold of the log is\n%s", next, toJSON(a), toJSON(b))
		}
		if !atBoundary {
			return
		}
		if err := postgres.CheckInvariants(ctx, pool); err != nil {
			t.Fatalf("offset %d: %v", next, err)
		}
		checkPending(t, pool, folded)
		b := boundary{token: next, workers: map[string][]string{}}
		for i := 1; i <= 8; i++ {
			b.workers[workerID(i)] = folded.WorkerMailboxes(workerID(i))
		}
		boundaries = append(boundaries, b)
	}

	for range steps {
		in := g.next(&now)
		ds := decider.Apply(in)
		for _, d := range ds {
			types[d.EventType()]++
			rec := postgres.Record{Offset: off, Decision: topics.Decision{ID: uuid.Must(uuid.NewV7()).String(), Data: d}}
			off++
			all = append(all, rec)
			batch = append(batch, rec)
			if r.IntN(12) == 0 {
				flush(off, false) // inside an input's decisions
			}
		}
		if len(ds) > 0 {
			off++ // the engine transaction's commit marker
		}
		if r.IntN(4) == 0 {
			flush(off, true)
		}
	}
	flush(off, true)
	if err := placement.Invariants(decider); err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d: %d decisions %v", seed, len(all), types)

	checkAssignments(t, pool, boundaries, folded)

	// The same log in one batch: the very same rows.
	other := newDB(t)
	applyRecords(t, other.Pool, all, off)
	if diff := diffSchemas(t, pool, db.Schema, other.Schema); diff != "" {
		t.Fatalf("projecting in batches and in one batch differ:\n%s", diff)
	}

	// And built from memory, as a rebuild does: the very same rows.
	built := newDB(t)
	b := postgres.NewBuilder("")
	err := pgx.BeginFunc(ctx, built.Pool, func(tx pgx.Tx) error {
		for i := 0; i < len(all); i += 50 {
			if err := b.Add(all[i:min(i+50, len(all))]); err != nil {
				return err
			}
			if err := b.TakeAppendOnly().WriteAppendOnly(ctx, tx); err != nil {
				return err
			}
		}
		return b.Finish(ctx, tx, off)
	})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if diff := diffSchemas(t, pool, db.Schema, built.Schema); diff != "" {
		t.Fatalf("projecting in batches and building from memory differ:\n%s", diff)
	}
	// Once per run (a connection each): the final projection read over
	// the simple protocol too.
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	ck, err := postgres.LoadSnapshot(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	sameOverSimpleProtocol(t, pool, ck)
	return types
}

// checkPending compares the placement_pending view with the decider's
// pending placements.
func checkPending(t testing.TB, pool *pgxpool.Pool, s *placement.State) {
	t.Helper()
	var want []string
	for _, v := range s.Pending() {
		want = append(want, fmt.Sprintf("%s %s %s %d", v.ID, v.WorkerID, v.PendingReason, v.PendingSince.UnixNano()))
	}
	rows, _ := pool.Query(context.Background(), `SELECT mailbox_id::text, COALESCE(worker_id::text, ''), reason, since_ns
FROM placement_pending ORDER BY mailbox_id`)
	var got []string
	var id, w, reason string
	var since int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &w, &reason, &since}, func() error {
		got = append(got, fmt.Sprintf("%s %s %s %d", id, w, reason, since))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("placement_pending:\n%s\nthe decider's pending:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// checkAssignments asks the worker API's store, for every worker, what
// changed since every boundary's token, and checks it against the
// decider's states then and now: removed is exactly what was there and is
// gone; added holds everything new, nothing that is not there now, and the
// current details.
func checkAssignments(t testing.TB, pool *pgxpool.Pool, boundaries []boundary, now *placement.State) {
	t.Helper()
	ctx := context.Background()
	store := postgres.NewStore(pool)
	last := boundaries[len(boundaries)-1].token
	for i := 1; i <= 8; i++ {
		w := workerID(i)
		cur := now.WorkerMailboxes(w)
		full, err := store.Assignments(ctx, w, workerapi.Token{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, a := range full.Mailboxes {
			ids = append(ids, a.MailboxID)
			v, _ := now.Mailbox(a.MailboxID)
			if a.OrgID != v.OrgID || a.Band != v.Band || a.WeightMilli != v.Weight {
				t.Fatalf("worker %s: assignment %+v, state %+v", w, a, v)
			}
		}
		if !slices.Equal(ids, cur) || full.Token.Offset() != last {
			t.Fatalf("worker %s full: %v at %d, want %v at %d", w, ids, full.Token.Offset(), cur, last)
		}
		for _, b := range boundaries {
			res, err := store.Assignments(ctx, w, workerapi.TokenAt(b.token))
			if err != nil {
				t.Fatal(err)
			}
			then := b.workers[w]
			var wantRemoved []string
			for _, m := range then {
				if !slices.Contains(cur, m) {
					wantRemoved = append(wantRemoved, m)
				}
			}
			if !slices.Equal(res.Removed, wantRemoved) {
				t.Fatalf("worker %s since %d: removed %v, want %v (then %v, now %v)", w, b.token, res.Removed, wantRemoved, then, cur)
			}
			var added []string
			for _, a := range res.Added {
				added = append(added, a.MailboxID)
				if !slices.Contains(cur, a.MailboxID) {
					t.Fatalf("worker %s since %d: added %s, which is not there", w, b.token, a.MailboxID)
				}
				if v, _ := now.Mailbox(a.MailboxID); a.Band != v.Band {
					t.Fatalf("worker %s since %d: added %s with band %s, now %s", w, b.token, a.MailboxID, a.Band, v.Band)
				}
			}
			for _, m := range cur {
				if !slices.Contains(then, m) && !slices.Contains(added, m) {
					t.Fatalf("worker %s since %d: %s arrived but is not in added %v", w, b.token, m, added)
				}
			}
		}
	}
}

// tables are the placement projection's tables.
var tables = []string{
	"placement_workers", "placement_orgs", "placement_mailboxes", "placement_history",
	"placement_assignment_changes", "placement_assignment_retention", "placement_checkpoint", "placement_liveness",
}

// diffSchemas compares the placement tables of two schemas row for row
// (EXCEPT both ways) and describes the differences ("" when none).
func diffSchemas(t testing.TB, pool *pgxpool.Pool, a, b string) string {
	t.Helper()
	var out []string
	for _, table := range tables {
		ta, tb := pgx.Identifier{a, table}.Sanitize(), pgx.Identifier{b, table}.Sanitize()
		for _, dir := range [][2]string{{ta, tb}, {tb, ta}} {
			rows, _ := pool.Query(context.Background(), `SELECT row_to_json(x)::text FROM (SELECT * FROM `+dir[0]+` EXCEPT SELECT * FROM `+dir[1]+`) x LIMIT 5`)
			var s string
			if _, err := pgx.ForEachRow(rows, []any{&s}, func() error {
				out = append(out, fmt.Sprintf("%s only in %s: %s", table, dir[0], s))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return strings.Join(out, "\n")
}
