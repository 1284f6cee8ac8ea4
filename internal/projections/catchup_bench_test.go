package projections_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
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

// catchUpEvents is the size of BenchmarkRegistryCatchUp10M's log:
// 10,000,000, or MAILPLANE_BENCH_CATCHUP_EVENTS. The
// fleet it is about stays the same whatever the count.
func catchUpEvents(b *testing.B) int {
	b.Helper()
	s := os.Getenv("MAILPLANE_BENCH_CATCHUP_EVENTS")
	if s == "" {
		return 10_000_000
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1000 {
		b.Fatalf("MAILPLANE_BENCH_CATCHUP_EVENTS=%q: want a count of at least 1000", s)
	}
	return n
}

// catchUpWindow is the dedupe window of BenchmarkRegistryCatchUp10M's
// projector: MAILPLANE_BENCH_CATCHUP_WINDOW (a duration), else the
// default, which a catch-up of minutes never reaches. A short window makes
// the projector prune while it catches up (with a 5 s transaction timeout,
// so a 10 s prune slack).
func catchUpWindow(b *testing.B) []projections.Option {
	b.Helper()
	s := os.Getenv("MAILPLANE_BENCH_CATCHUP_WINDOW")
	if s == "" {
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		b.Fatalf("MAILPLANE_BENCH_CATCHUP_WINDOW=%q: want a positive duration", s)
	}
	return []projections.Option{projections.WithDedupeWindow(d), projections.WithTxTimeout(5 * time.Second)}
}

// BenchmarkRegistryCatchUp10M (issue 13) puts 10,000,000 domain events of
// the registry's seven types (gen.next's mix) about a fleet of 1,000,000
// mailboxes, 20,000 orgs, 200,000 users and 10,000 workers into the broker,
// then times the registry projector catching up from zero to the log's end.
// The limit, measured in the same run: a raw binary COPY of every row the
// catch-up left (applied_events and the four registry tables, read out
// with COPY TO first) into copies of those tables, in one transaction. The
// work is done once whatever b.N is; run it with -benchtime 1x.
func BenchmarkRegistryCatchUp10M(b *testing.B) {
	n := catchUpEvents(b)
	e := newEnv(b)
	ctx := context.Background()

	g := newGen(13, 0)
	for range 1_000_000 {
		g.mailboxes = append(g.mailboxes, g.uuid())
	}
	for range 20_000 {
		g.orgs = append(g.orgs, g.uuid())
	}
	for range 200_000 {
		g.users = append(g.users, g.uuid())
	}
	for range 10_000 {
		g.workers = append(g.workers, g.uuid())
	}

	// Pre-encode in one goroutine while the records of the previous chunk
	// are produced: the producer's validation is not what is measured.
	pstart := time.Now()
	const chunk = 50_000
	chunks := make(chan []*kgo.Record, 2)
	var genErr error
	go func() {
		defer close(chunks)
		for i := 0; i < n; i += chunk {
			recs := make([]*kgo.Record, 0, chunk)
			for range min(chunk, n-i) {
				r, err := topics.Encode(g.next())
				if err != nil {
					genErr = err
					return
				}
				recs = append(recs, r)
			}
			chunks <- kafkatest.InNamespace(e.kcfg, recs...)
		}
	}()
	produced := 0
	for recs := range chunks {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := e.prod.ProduceSync(pctx, recs...).FirstErr()
		cancel()
		must(b, err)
		produced += len(recs)
	}
	must(b, genErr)
	if produced != n {
		b.Fatalf("produced %d of %d", produced, n)
	}
	b.Logf("%d events encoded and produced in %s", n, time.Since(pstart).Round(time.Millisecond))
	g = nil
	runtime.GC()

	var mu sync.Mutex
	applied, batches := 0, 0
	var first, last time.Time
	firstN := 0
	done := make(chan struct{})
	p, reg := e.projector(e.db.Pool, projections.NewRegistry(), append(catchUpWindow(b), projections.WithCommitted(func(events []domain.Event) {
		mu.Lock()
		defer mu.Unlock()
		applied += len(events)
		batches++
		last = time.Now()
		if first.IsZero() {
			first, firstN = last, len(events)
		}
		if applied == n {
			close(done)
		}
	}))...)
	b.ResetTimer()
	start := time.Now()
	stop := start2(b, p)
	// Progress every 30 s, logged in one line at the end (a benchmark's
	// log is cut after ten lines).
	var seen []string
	progress := time.NewTicker(30 * time.Second)
	defer progress.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-progress.C:
			mu.Lock()
			seen = append(seen, fmt.Sprintf("%s %d (kept %d)", time.Since(start).Round(time.Second), applied,
				count(b, e.db.Pool, `SELECT count(*) FROM applied_events`)))
			mu.Unlock()
		case <-time.After(time.Until(start.Add(60 * time.Minute))):
			mu.Lock()
			defer mu.Unlock()
			b.Fatalf("applied %d of %d in 60 minutes", applied, n)
		}
	}
	took := time.Since(start)
	b.StopTimer()
	stop()
	steady := float64(n-firstN) / last.Sub(first).Seconds()
	b.Logf("applied by time: %s", strings.Join(seen, ", "))
	kept := count(b, e.db.Pool, `SELECT count(*) FROM applied_events`)
	b.ReportMetric(float64(kept), "ids_kept")
	b.ReportMetric(counter(b, reg, "mailplane_projector_applied_ids_pruned_total", "projector", "registry"), "ids_pruned")

	copyTook, rows := rawCopyRegistry(b, e)
	rate, copyRate := float64(n)/took.Seconds(), float64(rows)/copyTook.Seconds()
	b.ReportMetric(took.Seconds(), "catchup-s")
	b.ReportMetric(rate, "events/s")
	b.ReportMetric(steady, "steady_events/s")
	b.ReportMetric(copyTook.Seconds(), "copy-s")
	b.ReportMetric(copyRate, "copy_rows/s")
	b.ReportMetric(copyTook.Seconds()/took.Seconds(), "copy/catchup")
	b.ReportMetric(float64(n)/float64(batches), "events/tx")
	b.Logf("%d events caught up in %s (%.0f events/s, steady %.0f, %d transactions); raw COPY of the %d rows it left: %s (%.0f rows/s); ratio %.3f",
		n, took.Round(time.Millisecond), rate, steady, batches, rows, copyTook.Round(time.Millisecond), copyRate, copyTook.Seconds()/took.Seconds())
}

// rawCopyRegistry reads the rows of the registry's tables out with binary
// COPY TO, then times binary COPY FROM of the same bytes into empty
// copies of those tables (indexes and constraints included) in one
// transaction: Postgres's own ingest of the rows, no Go encoding.
func rawCopyRegistry(b *testing.B, e *env) (time.Duration, int) {
	b.Helper()
	ctx := context.Background()
	conn, err := e.db.Pool.Acquire(ctx)
	must(b, err)
	defer conn.Release()
	pg := conn.Conn().PgConn()
	tables := []string{"applied_events", "mailboxes", "orgs", "users", "workers"}
	data := make([]*bytes.Buffer, len(tables))
	for i, t := range tables {
		id := pgx.Identifier{t}.Sanitize()
		_, err := pg.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (LIKE %s INCLUDING ALL)", pgx.Identifier{t + "_copy"}.Sanitize(), id)).ReadAll()
		must(b, err)
		data[i] = new(bytes.Buffer)
		_, err = pg.CopyTo(ctx, data[i], "COPY "+id+" TO STDOUT (FORMAT binary)")
		must(b, err)
	}
	start := time.Now()
	rows := 0
	_, err = pg.Exec(ctx, "BEGIN").ReadAll()
	must(b, err)
	for i, t := range tables {
		tag, err := pg.CopyFrom(ctx, data[i], "COPY "+pgx.Identifier{t + "_copy"}.Sanitize()+" FROM STDIN (FORMAT binary)")
		must(b, err)
		rows += int(tag.RowsAffected())
	}
	_, err = pg.Exec(ctx, "COMMIT").ReadAll()
	must(b, err)
	return time.Since(start), rows
}
