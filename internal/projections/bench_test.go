package projections_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/topics"
)

// BenchmarkProjection projects b.N mailbox.added events (distinct
// mailboxes, so every event is a full row) from the log into Postgres, then
// COPYs the very rows it produced into an identical table in the same run:
// the ratio is the projector's share of Postgres's raw ingest rate.
// events/s counts from the projector's start (group join included);
// steady_events/s from its first commit to its last. Run it with a fixed
// count, e.g. -benchtime 100000x.
func BenchmarkProjection(b *testing.B) { benchProjection(b) }

// BenchmarkProjectionSerialWrites is BenchmarkProjection with
// WithSerialWrites: one transaction at a time.
func BenchmarkProjectionSerialWrites(b *testing.B) {
	benchProjection(b, projections.WithSerialWrites())
}

func benchProjection(b *testing.B, opts ...projections.Option) {
	e := newEnv(b)
	g := newGen(1, 1)
	evs := make([]domain.Event, b.N)
	for i := range evs {
		evs[i] = g.added(g.uuid())
	}
	e.produce(evs...)
	pool := e.db.Pool
	ctx := context.Background()

	var mu sync.Mutex
	applied, batches := 0, 0
	var first, last time.Time
	firstN := 0
	done := make(chan struct{})
	p, _ := e.projector(pool, projections.NewRegistry(), append(opts, projections.WithCommitted(func(events []domain.Event) {
		mu.Lock()
		applied += len(events)
		batches++
		last = time.Now()
		if first.IsZero() {
			first, firstN = last, len(events)
		}
		if applied == b.N {
			close(done)
		}
		mu.Unlock()
	}))...)
	cpu, cpuOK := newCPUMeter(b, pool)
	var pg0, go0 time.Duration
	if cpuOK {
		pg0 = cpu.postgres(b)
	}
	go0 = processCPU(b)
	b.ResetTimer()
	start := time.Now()
	stop := start2(b, p)
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		b.Fatalf("projected %d of %d", applied, b.N)
	}
	projectSecs := time.Since(start).Seconds()
	b.StopTimer()
	goCPU := processCPU(b) - go0
	var pgCPU time.Duration
	if cpuOK {
		pgCPU = cpu.postgres(b) - pg0
	}
	stop()
	// Steady state: from the first commit to the last, so joining the
	// group and the first fetch (a fixed cost) do not count.
	steady := float64(b.N-firstN) / last.Sub(first).Seconds()

	// The limit: the same rows, COPYed straight into the same table shape.
	_, err := pool.Exec(ctx, `create table mailboxes_copy (like mailboxes including all)`)
	must(b, err)
	rows, err := pool.Query(ctx, `select * from mailboxes`)
	must(b, err)
	cols := make([]string, 0)
	for _, f := range rows.FieldDescriptions() {
		cols = append(cols, f.Name)
	}
	var data [][]any
	for rows.Next() {
		vals, err := rows.Values()
		must(b, err)
		data = append(data, vals)
	}
	must(b, rows.Err())
	var copyPG0 time.Duration
	if cpuOK {
		copyPG0 = cpu.postgres(b)
	}
	copyStart := time.Now()
	tx, err := pool.Begin(ctx)
	must(b, err)
	n, err := tx.CopyFrom(ctx, pgx.Identifier{"mailboxes_copy"}, cols, pgx.CopyFromRows(data))
	must(b, err)
	must(b, tx.Commit(ctx))
	copySecs := time.Since(copyStart).Seconds()
	if cpuOK {
		// CPU per 100,000 rows on each side: the projection's Postgres
		// work against the COPY's, and the process's (projector and the
		// in-process broker serving its fetches).
		per := 100_000 / float64(b.N)
		copyPG := (cpu.postgres(b) - copyPG0).Seconds() * per
		b.ReportMetric(pgCPU.Seconds()*per, "pg_cpu_s/100k")
		b.ReportMetric(copyPG, "copy_pg_cpu_s/100k")
		if pgCPU > 0 {
			b.ReportMetric(copyPG/(pgCPU.Seconds()*per), "pg_cpu_ratio")
		}
	}
	b.ReportMetric(goCPU.Seconds()*100_000/float64(b.N), "go_cpu_s/100k")
	if int(n) != b.N {
		b.Fatalf("copied %d rows, want %d", n, b.N)
	}
	rate, copyRate := float64(b.N)/projectSecs, float64(b.N)/copySecs
	b.ReportMetric(rate, "events/s")
	b.ReportMetric(steady, "steady_events/s")
	b.ReportMetric(copyRate, "copy_rows/s")
	b.ReportMetric(rate/copyRate, "ratio_to_copy")
	b.ReportMetric(steady/copyRate, "steady_ratio_to_copy")
	b.ReportMetric(float64(b.N)/float64(batches), "events/tx")
}

// BenchmarkPublishToProjected produces b.N events of every type at a steady
// 2,000 events/s and reports the time from the produce call to the commit
// of the transaction that projected each one (p50, p99). Run it with a fixed
// count, e.g. -benchtime 20000x (10 s).
func BenchmarkPublishToProjected(b *testing.B) {
	const rate = 2000
	e := newEnv(b)
	g := newGen(2, 5000)
	evs := g.events(b.N)
	var mu sync.Mutex
	sent := make(map[string]time.Time, b.N)
	lat := make([]time.Duration, 0, b.N)
	done := make(chan struct{})
	seen := 0
	p, _ := e.projector(e.db.Pool, projections.NewRegistry(), projections.WithCommitted(func(events []domain.Event) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range events {
			if t0, ok := sent[ev.ID]; ok {
				lat = append(lat, now.Sub(t0))
			}
		}
		seen += len(events)
		if seen == len(evs) {
			close(done)
		}
	}))
	start2(b, p)
	// Warm the group: wait for the assignment before the clock starts.
	warm := g.event(&domain.UserActive{UserID: g.pick(g.users), Source: domain.ActivityLogin})
	evs = append(evs, warm)
	e.produce(warm)
	waitFor(b, 30*time.Second, "warm-up event projected", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return seen == 1, nil
	})

	b.ResetTimer()
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	ctx := context.Background()
	for _, ev := range evs[:b.N] {
		<-tick.C
		rec, err := topics.Encode(ev)
		must(b, err)
		kafkatest.InNamespace(e.kcfg, rec)
		mu.Lock()
		sent[ev.ID] = time.Now()
		mu.Unlock()
		e.prod.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				b.Error(err)
			}
		})
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		b.Fatalf("projected %d of %d", seen, len(evs))
	}
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lat)
	if len(lat) == 0 {
		b.Fatal("no latencies")
	}
	q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.50), "p50_ms")
	b.ReportMetric(q(0.99), "p99_ms")
	b.ReportMetric(q(1), "max_ms")
	b.ReportMetric(rate, "events/s")
	_ = fmt.Sprint
}

// start2 is start for benchmarks (testing.TB).
func start2(tb testing.TB, p *projections.Projector) func() { return start(tb, p) }
