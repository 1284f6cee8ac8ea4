package projections_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/topics"
)

// BenchmarkProjection projects b.N mailbox.added events (distinct
// mailboxes, so every event is a full row) from the log into Postgres, then
// COPYs the very rows it produced into an identical table in the same run:
// ratio_to_copy is the projector's share of Postgres's raw ingest rate.
// events/s counts from the projector's start (group join included);
// steady_events/s from its first commit to its last. Run it with a fixed
// count, e.g. -benchtime 100000x.
//
// Two more phases of the same run say what any projection of these events
// could reach here: replay_ratio_to_copy replays the projector's Postgres
// statements without the log (the rows COPYed in its transactions' size,
// their ids recorded in applied_events; replay_two_… on two connections
// side by side, as two lanes write), and decode_go_cpu_s/100k is the
// CPU of fetching and decoding the records alone; cpu_bound_ratio_to_copy
// is what the projection could reach were the cores never idle (cpuBound).
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
	cpu, cpuOK := newCPUMeter(b, pool)

	// Each phase starts from a checkpoint, so that one the WAL of an
	// earlier phase (or test) triggered lands in none of them: a
	// checkpoint in flight makes every page first written after it log
	// a full image, and the checkpointer competes for the cores.
	checkpoint(b, pool)
	proj := projectAll(b, e, cpu, cpuOK, opts)
	cols, data := readRows(b, pool, "mailboxes", "mailbox_id")
	checkpoint(b, pool)
	cp := copyRows(b, pool, cpu, cpuOK, cols, data)
	if int(cp.rows) != b.N {
		b.Fatalf("copied %d rows, want %d", cp.rows, b.N)
	}
	checkpoint(b, pool)
	perTx := b.N / proj.batches
	rowsOnly := replayStatements(b, pool, cpu, cpuOK, cols, data, perTx, replay{writers: 1})
	checkpoint(b, pool)
	replayed := replayStatements(b, pool, cpu, cpuOK, cols, data, perTx, replay{ids: true, writers: 1})
	checkpoint(b, pool)
	sideBySide := replayStatements(b, pool, cpu, cpuOK, cols, data, perTx, replay{ids: true, writers: 2})
	decodeCPU := decodeLog(b, e, b.N)

	per := 100_000 / float64(b.N)
	if cpuOK {
		// CPU per 100,000 rows on each side: the projection's Postgres
		// work against the COPY's, and the process's (projector and the
		// in-process broker serving its fetches).
		b.ReportMetric(proj.pgCPU.Seconds()*per, "pg_cpu_s/100k")
		b.ReportMetric(cp.pgCPU.Seconds()*per, "copy_pg_cpu_s/100k")
		if proj.pgCPU > 0 {
			b.ReportMetric(cp.pgCPU.Seconds()/proj.pgCPU.Seconds(), "pg_cpu_ratio")
		}
		b.ReportMetric(replayed.pgCPU.Seconds()*per, "replay_pg_cpu_s/100k")
		b.ReportMetric(sideBySide.pgCPU.Seconds()*per, "replay_two_pg_cpu_s/100k")
		b.ReportMetric(rowsOnly.pgCPU.Seconds()*per, "replay_rows_pg_cpu_s/100k")
	}
	b.ReportMetric(proj.goCPU.Seconds()*per, "go_cpu_s/100k")
	b.ReportMetric(decodeCPU.Seconds()*per, "decode_go_cpu_s/100k")
	rate, copyRate, replayRate := float64(b.N)/proj.secs, float64(b.N)/cp.secs, float64(b.N)/replayed.secs
	b.ReportMetric(rate, "events/s")
	b.ReportMetric(proj.steady, "steady_events/s")
	b.ReportMetric(copyRate, "copy_rows/s")
	b.ReportMetric(rate/copyRate, "ratio_to_copy")
	b.ReportMetric(proj.steady/copyRate, "steady_ratio_to_copy")
	b.ReportMetric(replayRate/copyRate, "replay_ratio_to_copy")
	b.ReportMetric(float64(b.N)/rowsOnly.secs/copyRate, "replay_rows_ratio_to_copy")
	b.ReportMetric(float64(b.N)/sideBySide.secs/copyRate, "replay_two_ratio_to_copy")
	b.ReportMetric(float64(b.N)/float64(proj.batches), "events/tx")
	b.ReportMetric(proj.firstCommit, "first_commit_s")
	if cpuOK {
		b.ReportMetric(cpuBound(b.N, proj.pgCPU, decodeCPU)/copyRate, "cpu_bound_ratio_to_copy")
	}
}

// cpuBound is the most events/s a projection of n events could reach
// here, were its cores never idle: Postgres's CPU as the projection spent
// it (its contention included) and, for the Go side, decoding alone (the
// projector's own folding and encoding of rows left out), over every
// core. An upper bound for this configuration; one writer is also held to
// the pace of its statements on one connection (the replay).
func cpuBound(n int, pgCPU, decodeCPU time.Duration) float64 {
	return float64(runtime.NumCPU()) * float64(n) / (pgCPU + decodeCPU).Seconds()
}

// checkpoint runs a Postgres CHECKPOINT and waits for it.
func checkpoint(b *testing.B, pool *pgxpool.Pool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `CHECKPOINT`)
	must(b, err)
}

// phase is what one timed phase took: wall clock, Postgres and process
// CPU, and what it did.
type phase struct {
	secs         float64
	pgCPU, goCPU time.Duration
	rows         int64
	// Projection only: transactions, and events/s from the first
	// commit to the last.
	batches     int
	steady      float64
	firstCommit float64
}

// projectAll runs a registry projector until it has applied all b.N
// events and stops it. events/s counts from its start (group join
// included).
func projectAll(b *testing.B, e *env, cpu *cpuMeter, cpuOK bool, opts []projections.Option) phase {
	var mu sync.Mutex
	applied, batches := 0, 0
	var first, last time.Time
	firstN := 0
	done := make(chan struct{})
	p, _ := e.projector(e.db.Pool, projections.NewRegistry(), append(opts, projections.WithCommitted(func(events []domain.Event) {
		mu.Lock()
		defer mu.Unlock()
		applied += len(events)
		batches++
		last = time.Now()
		if first.IsZero() {
			first, firstN = last, len(events)
		}
		if applied == b.N {
			close(done)
		}
	}))...)
	var pg0 time.Duration
	if cpuOK {
		pg0 = cpu.postgres(b)
	}
	go0 := processCPU(b)
	b.ResetTimer()
	start := time.Now()
	stop := start2(b, p)
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		b.Fatalf("projected %d of %d", applied, b.N)
	}
	ph := phase{secs: time.Since(start).Seconds()}
	b.StopTimer()
	ph.goCPU = processCPU(b) - go0
	if cpuOK {
		ph.pgCPU = cpu.postgres(b) - pg0
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	ph.batches = batches
	// Steady state: from the first commit to the last, so joining the
	// group and the first fetch (a fixed cost) do not count.
	ph.steady = float64(b.N-firstN) / last.Sub(first).Seconds()
	ph.firstCommit = first.Sub(start).Seconds()
	return ph
}

// readRows reads every row of table in key order, and its column names.
// The COPY and the replays take the rows in that order, whatever order
// the projection left them in: for the benchmark's events it is the order
// they were published in (their ids are UUIDv7), so the limit does not
// move with how the projection's transactions happened to interleave.
func readRows(b *testing.B, pool *pgxpool.Pool, table, key string) ([]string, [][]any) {
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT * FROM `+pgx.Identifier{table}.Sanitize()+` ORDER BY `+pgx.Identifier{key}.Sanitize())
	must(b, err)
	defer rows.Close()
	var cols []string
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
	return cols, data
}

// copyRows is the limit: the rows, COPYed in one statement into a table
// of the same shape (indexes included).
func copyRows(b *testing.B, pool *pgxpool.Pool, cpu *cpuMeter, cpuOK bool, cols []string, data [][]any) phase {
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE mailboxes_copy (LIKE mailboxes INCLUDING ALL)`)
	must(b, err)
	var pg0 time.Duration
	if cpuOK {
		pg0 = cpu.postgres(b)
	}
	start := time.Now()
	tx, err := pool.Begin(ctx)
	must(b, err)
	n, err := tx.CopyFrom(ctx, pgx.Identifier{"mailboxes_copy"}, cols, pgx.CopyFromRows(data))
	must(b, err)
	must(b, tx.Commit(ctx))
	ph := phase{secs: time.Since(start).Seconds(), rows: n}
	if cpuOK {
		ph.pgCPU = cpu.postgres(b) - pg0
	}
	return ph
}

// replay says what replayStatements replays: the rows alone or with
// their ids, on how many connections side by side.
type replay struct {
	ids     bool
	writers int
}

// replayStatements is the projector's Postgres work without the log: the
// same rows COPYed into a table of the same shape and, with r.ids, their
// event ids recorded by the projector's statement in an empty table of
// applied_events' shape (as applied_events was when the projection
// began), perTx rows a transaction with synchronous_commit off. On one
// connection it is what a projection with this dedupe costs Postgres at
// the least, whatever its Go side does. With r.writers connections side
// by side, each takes every r.writers-th row of a stretch of
// r.writers × perTx, so their transactions cover the same stretch of ids,
// as the projector's lanes' do.
func replayStatements(b *testing.B, pool *pgxpool.Pool, cpu *cpuMeter, cpuOK bool, cols []string, data [][]any, perTx int, r replay) phase {
	ctx := context.Background()
	table, ids := fmt.Sprintf("mailboxes_replay_%d_%t", r.writers, r.ids), fmt.Sprintf("applied_events_replay_%d_%t", r.writers, r.ids)
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (LIKE mailboxes INCLUDING ALL);
CREATE TABLE `+ids+` (LIKE applied_events INCLUDING ALL)`)
	must(b, err)
	idCol := slices.Index(cols, "last_event_id")
	if idCol < 0 {
		b.Fatal("mailboxes has no last_event_id")
	}
	// The projector's statement, into the replay's own table.
	record := strings.Replace(projections.RecordAppliedSQL, "applied_events", pgx.Identifier{ids}.Sanitize(), 1)
	perTx = max(perTx, 1)
	write := func(rows [][]any) error {
		batch := make([][16]byte, len(rows))
		for i, row := range rows {
			batch[i] = row[idCol].([16]byte)
		}
		slices.SortFunc(batch, func(a, c [16]byte) int { return bytes.Compare(a[:], c[:]) })
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, projections.AsyncCommitSQL); err != nil {
				return err
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{table}, cols, pgx.CopyFromRows(rows)); err != nil || !r.ids {
				return err
			}
			_, err := tx.Exec(ctx, record, projections.RegistryName, batch, time.Now())
			return err
		})
	}
	var pg0 time.Duration
	if cpuOK {
		pg0 = cpu.postgres(b)
	}
	start := time.Now()
	errs := make([]error, r.writers)
	var wg sync.WaitGroup
	for w := range r.writers {
		wg.Go(func() {
			stretch := r.writers * perTx
			for i := 0; i < len(data) && errs[w] == nil; i += stretch {
				var rows [][]any
				for k := i + w; k < min(i+stretch, len(data)); k += r.writers {
					rows = append(rows, data[k])
				}
				errs[w] = write(rows)
			}
		})
	}
	wg.Wait()
	must(b, errors.Join(errs...))
	ph := phase{secs: time.Since(start).Seconds(), rows: int64(len(data))}
	if cpuOK {
		ph.pgCPU = cpu.postgres(b) - pg0
	}
	return ph
}

// decodeLog reads the domain topics from the start with a plain client
// and decodes every record as the projector does (DecodeEvent), until n
// have been: the process CPU that takes is the projector's Go side at
// the least (fetching, decompressing, decoding, validating; the
// in-process broker serving the fetches included, as in go_cpu).
func decodeLog(b *testing.B, e *env, n int) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl, err := kafka.NewClient(e.kcfg, kafka.KindReader,
		kgo.ConsumeTopics(e.kcfg.Namespace.Topics(topics.DomainTopics()...)...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	must(b, err)
	defer cl.Close()
	cpu0 := processCPU(b)
	got := 0
	for got < n {
		fs := cl.PollRecords(ctx, 0)
		if err := ctx.Err(); err != nil {
			b.Fatalf("decoded %d of %d records: %v", got, n, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if _, _, err := projections.DecodeEvent(r); err != nil {
				b.Fatalf("decode: %v", err)
			}
			got++
		})
	}
	return processCPU(b) - cpu0
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
