package rebuild

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/topics"
)

// benchDecisions makes about n decisions with the pure decider: a fleet of
// oauth_api workers (half shared_free, half shared_premium, one per 1,000
// decisions) ramped to full capacity, 100 orgs (half premium), then
// mailboxes: mostly added (gmail, weight 0.05), some scored worse or
// better (band changes, with moves or refusals), some removed.
func benchDecisions(n int) []domain.PlacementDecision {
	st := placement.NewState(placement.Config{})
	r := rand.New(rand.NewPCG(1, 2))
	at := t0
	var out []domain.PlacementDecision
	apply := func(d domain.Data) {
		at = at.Add(time.Millisecond)
		out = append(out, st.Apply(placement.Input{At: at, Event: d})...)
	}
	workers := max(10, n/1000)
	for round := range 2 {
		for i := range workers {
			tier := domain.TierSharedFree
			if i%2 == 1 {
				tier = domain.TierSharedPremium
			}
			apply(&domain.WorkerHeartbeat{WorkerID: workerID(i), Tier: tier, Egress: domain.EgressOAuthAPI, Address: fmt.Sprintf("10.1.%d.%d:25", i/250, i%250)})
		}
		if round == 0 {
			at = at.Add(15 * 24 * time.Hour) // full capacity
		}
	}
	for i := range 100 {
		if i%2 == 0 {
			apply(&domain.OrgPlanChanged{OrgID: orgID(i), Plan: domain.PlanPremium, Paid: true, Source: "bench"})
		}
	}
	next := 0
	for len(out) < n {
		switch x := r.IntN(100); {
		case x < 90 || next < 100:
			apply(&domain.MailboxAdded{MailboxID: mailboxID(next), OrgID: orgID(next % 100), UserID: orgID(next % 100), Provider: domain.ProviderGmail})
			next++
		case x < 95:
			state := []domain.HealthState{domain.HealthWatch, domain.HealthQuarantined, domain.HealthHealthy}[r.IntN(3)]
			apply(&domain.MailboxHealthScored{MailboxID: mailboxID(r.IntN(next)), State: state, Score: 50, Reason: "bench"})
		default:
			apply(&domain.MailboxRemoved{MailboxID: mailboxID(r.IntN(next)), Reason: "bench"})
		}
	}
	return out
}

// benchLog writes ds to the decision log and returns the brokers.
func benchLog(b *testing.B, ds []domain.PlacementDecision) kafka.Config {
	b.Helper()
	kcfg := kafkatest.Config(b, 4)
	kcfg.ClientID = "bench"
	appendLog(b, kcfg, ds)
	return kcfg
}

// appendLog appends ds to the decision log.
func appendLog(b *testing.B, kcfg kafka.Config, ds []domain.PlacementDecision) {
	b.Helper()
	// No delivery timeout: it counts from the record's timestamp, which is
	// the decision's (past) time.
	cl, err := kafka.NewClient(kafka.Config{Brokers: kcfg.Brokers}, kafka.KindProducer, kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(100_000))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	const chunk = 50_000
	for i := 0; i < len(ds); i += chunk {
		recs := make([]*kgo.Record, 0, chunk)
		for j, d := range ds[i:min(i+chunk, len(ds))] {
			r, err := topics.EncodeDecision(topics.Decision{ID: domain.NewEventID(), Source: "bench", Data: d,
				Cause: topics.Cause{ID: topics.CauseTick, Type: topics.CauseTick, Index: 0, Count: 1}})
			if err != nil {
				b.Fatalf("decision %d: %v", i+j, err)
			}
			recs = append(recs, r)
		}
		if err := cl.ProduceSync(ctx, kafkatest.InNamespace(kcfg, recs...)...).FirstErr(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplayPlacement rebuilds the placement projection from a
// decision log of b.N decisions into a fresh schema (schema, migrations,
// read, decode, fold, write, commit: RebuildPlacement's wall time), then
// COPYs the very rows it wrote into another fresh schema, the limit the
// rebuild is measured against. Run with -benchtime 1000000x for the
// figure in BENCHMARKS.md.
func BenchmarkReplayPlacement(b *testing.B) {
	ds := benchDecisions(b.N)
	kcfg := benchLog(b, ds)
	db := pgtest.New(b)
	ctx := context.Background()
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	start := time.Now()
	rb, err := Start(ctx, PlacementSpec(), Config{Kafka: kcfg, Live: db.Pool, Schema: db.Schema + "_placement_1",
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	took := time.Since(start)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	defer rb.Drop(context.Background())
	if rb.Records() != int64(len(ds)) {
		b.Fatalf("rebuilt %d decisions of %d", rb.Records(), len(ds))
	}

	// How long an engine takes to restore from this projection.
	lstart := time.Now()
	ck, err := postgres.NewSnapshotter(rb.Pool()).Load(ctx)
	if err != nil {
		b.Fatal(err)
	}
	loaded := time.Since(lstart)
	if _, err := placement.NewStateFromSnapshot(placement.Config{}, ck.State); err != nil {
		b.Fatal(err)
	}
	b.Logf("restore from the projection: %d workers, %d mailboxes loaded in %s, state rebuilt in %s more",
		len(ck.State.Workers), len(ck.State.Mailboxes), loaded.Round(time.Millisecond), (time.Since(lstart) - loaded).Round(time.Millisecond))

	copyTook, rows := rawCopy(b, rb.Pool())
	b.ReportMetric(float64(len(ds))/took.Seconds(), "decisions/s")
	b.ReportMetric(took.Seconds(), "replay-s")
	b.ReportMetric(copyTook.Seconds(), "copy-s")
	b.ReportMetric(copyTook.Seconds()/took.Seconds(), "copy/replay")
	b.Logf("%d decisions: replay %s (applying %s), %.0f decisions/s; raw COPY of its %d rows %s (%.0f rows/s); ratio %.2f",
		len(ds), took.Round(time.Millisecond), rb.Took().Round(time.Millisecond), float64(len(ds))/took.Seconds(),
		rows, copyTook.Round(time.Millisecond), float64(rows)/copyTook.Seconds(), copyTook.Seconds()/took.Seconds())
}

// rawCopy reads every row the rebuild wrote and COPYs them into a fresh
// migrated schema's tables, timing only the COPYs (in one transaction, as
// a replay would at best).
func rawCopy(b *testing.B, src *pgxpool.Pool) (time.Duration, int) {
	b.Helper()
	ctx := context.Background()
	dst := pgtest.New(b)
	if err := migrations.Apply(ctx, dst.Pool); err != nil {
		b.Fatal(err)
	}
	tables := []struct {
		name string
		cols []string
	}{
		{"placement_workers", []string{"worker_id", "base_tier", "tier", "egress", "address", "pool", "dedicated_org", "releasing", "health",
			"first_seen_ns", "last_seen_ns", "live", "stopping", "load_milli", "capacity", "mailboxes", "decision_offset"}},
		{"placement_orgs", []string{"org_id", "plan", "dedicated_workers", "paid", "source", "plan_since_ns", "decision_offset"}},
		{"placement_mailboxes", []string{"mailbox_id", "org_id", "worker_id", "band", "weight_milli", "candidate", "candidate_since_ns",
			"pending_reason", "pending_since_ns", "assigned_at", "decision_offset"}},
		{"placement_history", []string{"mailbox_id", "decision_offset", "decision_id", "type", "reason", "at",
			"from_worker", "to_worker", "from_band", "to_band", "cause", "detail", "health"}},
		{"placement_assignment_changes", []string{"worker_id", "decision_offset", "mailbox_id", "change"}},
		{"placement_checkpoint", []string{"singleton", "next_offset", "last_decision_id"}},
	}
	data := make([][][]any, len(tables))
	total := 0
	for i, t := range tables {
		rows, err := src.Query(ctx, "SELECT "+joinCols(t.cols)+" FROM "+t.name)
		if err != nil {
			b.Fatal(err)
		}
		for rows.Next() {
			v, err := rows.Values()
			if err != nil {
				b.Fatal(err)
			}
			data[i] = append(data[i], v)
		}
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		total += len(data[i])
	}
	start := time.Now()
	err := pgx.BeginFunc(ctx, dst.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return err
		}
		for i, t := range tables {
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{t.name}, t.cols, pgx.CopyFromRows(data[i])); err != nil {
				return fmt.Errorf("copy %s: %w", t.name, err)
			}
		}
		return nil
	})
	took := time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	return took, total
}

func joinCols(cols []string) string {
	s := ""
	for i, c := range cols {
		if i > 0 {
			s += ", "
		}
		s += c
	}
	return s
}

// BenchmarkEventToProjectedRow measures, at a steady 1,000 mailbox.added
// per second (10 every 10 ms), the time from publishing an event to the
// commit of the projection transaction holding its decision: producer →
// domain topic → engine transaction → decision log → placement projector
// → Postgres. b.N events; run with -benchtime 10000x.
func BenchmarkEventToProjectedRow(b *testing.B) {
	e := newEnv(b)
	var mu sync.Mutex
	projected := map[string]time.Time{}
	p, err := postgres.NewProjector(e.kcfg, e.db.Pool, postgres.WithCommitted(func(c postgres.Commit) {
		mu.Lock()
		for _, r := range c.Records {
			if _, ok := projected[r.Decision.Cause.ID]; !ok {
				projected[r.Decision.Cause.ID] = c.At
			}
		}
		mu.Unlock()
	}))
	if err != nil {
		b.Fatal(err)
	}
	runUntil(b, "placement projector", p.Run)
	e.engine(engine.WithClock(time.Now))
	now := time.Now()
	var fleet []domain.Data
	for i := range 100 {
		fleet = append(fleet, &domain.WorkerHeartbeat{WorkerID: workerID(i), Tier: domain.TierSharedPremium, Egress: domain.EgressOAuthAPI, Address: "10.0.0.1:25"})
	}
	fleet = append(fleet, &domain.OrgPlanChanged{OrgID: orgID(1), Plan: domain.PlanPremium, Paid: true, Source: "bench"})
	e.publish(now, fleet...)
	e.settle(e.db.Pool)

	published := make(map[string]time.Time, b.N)
	b.ResetTimer()
	tick := time.NewTicker(10 * time.Millisecond)
	for i := 0; i < b.N; {
		<-tick.C
		var evs []domain.Event
		for j := i; j < min(i+10, b.N); j++ {
			d := mailboxAdded(j, 1, domain.ProviderGmail, false)
			evs = append(evs, domain.Event{ID: domain.NewEventID(), Type: d.EventType(), Source: "bench", Time: time.Now(), Subject: d.AggregateID(), Data: d})
		}
		at := time.Now()
		if _, err := e.pub.Publish(context.Background(), evs...); err != nil {
			b.Fatal(err)
		}
		for _, ev := range evs {
			published[ev.ID] = at
		}
		i += len(evs)
	}
	tick.Stop()
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		n := 0
		for id := range published {
			if _, ok := projected[id]; ok {
				n++
			}
		}
		mu.Unlock()
		if n == len(published) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d events projected after 60s", n, len(published))
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.StopTimer()
	lat := make([]time.Duration, 0, len(published))
	mu.Lock()
	for id, at := range published {
		lat = append(lat, projected[id].Sub(at))
	}
	mu.Unlock()
	slices.Sort(lat)
	pct := func(q float64) time.Duration { return lat[min(len(lat)-1, int(q*float64(len(lat))))] }
	b.ReportMetric(float64(pct(0.50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(pct(0.99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	b.Logf("%d events at 1,000/s: publish → projected row p50 %s, p99 %s, max %s", len(lat), pct(0.5), pct(0.99), lat[len(lat)-1])
}

// BenchmarkPlacementProjectorBacklog measures the live placement projector
// (postgres.Projector, default batches of 20,000, rows read back and merged
// through the indexed tables) catching up a decision log of b.N decisions.
func BenchmarkPlacementProjectorBacklog(b *testing.B) {
	ds := benchDecisions(b.N)
	kcfg := benchLog(b, ds)
	db := pgtest.New(b)
	ctx := context.Background()
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	var once sync.Once
	p, err := postgres.NewProjector(kcfg, db.Pool, postgres.WithCommitted(func(c postgres.Commit) {
		if c.NextOffset >= int64(len(ds)) {
			once.Do(func() { close(done) })
		}
	}))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	runUntil(b, "placement projector", p.Run)
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		b.Fatal("the projector did not catch up")
	}
	took := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(len(ds))/took.Seconds(), "decisions/s")
	b.Logf("%d decisions projected in %s: %.0f decisions/s", len(ds), took.Round(time.Millisecond), float64(len(ds))/took.Seconds())
}
