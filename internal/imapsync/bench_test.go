package imapsync_test

// Benchmarks of issue 5 (BENCHMARKS.md, "IMAP runner"): one imapsync.Runner
// (one sync worker's runner) driving thousands of real mailsync.Jobs
// against an IMAP server in another process (benchserver_test.go), writing
// through a real fenced writer into Postgres.
//
//	go test ./imapsync -run '^$' -bench 'IMAPHot|IMAPWarm' -benchtime 1x -timeout 30m
//
// Scale and durations can be changed through the environment:
// MAILPLANE_BENCH_HOT (5000), MAILPLANE_BENCH_WARM (10000),
// MAILPLANE_BENCH_QUIET (20s), MAILPLANE_BENCH_WARM_WINDOW (30s),
// MAILPLANE_BENCH_LATENCY_SAMPLES (500); MAILPLANE_BENCH_HEAPPROFILE names a
// file for the hot runner's heap profile after the ramp. The hot benchmark
// sets the sync role's memory limit (MAILPLANE_SYNC_MEMORY_LIMIT, default
// auto) as `mailplane sync` does.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/imapsync"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/memlimit"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/sealing"
)

// benchPartitions: the worker owns this many mailbox.state partitions
// (topics.DefaultStatePartitions: a single worker owns them all); the
// mailboxes are spread over them.
const benchPartitions = 256

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// countReporter counts the failures the runner reports, by kind.
type countReporter struct {
	mu     sync.Mutex
	byKind map[string]int // kind/op
	first  string
}

func (r *countReporter) SyncFailed(_ context.Context, f imapsync.Failure) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byKind == nil {
		r.byKind = map[string]int{}
	}
	r.byKind[string(f.Err.Kind)+"/"+f.Err.Op]++
	if r.first == "" {
		r.first = f.Err.Error()
	}
}

func (r *countReporter) DisableRequested(context.Context, imapsync.DisableRequest) {}

func (r *countReporter) total() (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, v := range r.byKind {
		n += v
	}
	return n, fmt.Sprint(r.byKind, " first: ", r.first)
}

// benchWorld is one sync worker's runner with n jobs, not yet started.
type benchWorld struct {
	b      *testing.B
	db     *pgtest.DB
	obs    *pgx.Conn // observations, apart from the runner's pool
	reg    *prometheus.Registry
	rep    *countReporter
	runner *imapsync.Runner
	jobs   []*mailsync.Job

	kr     *sealing.Keyring
	fence  *mailsync.Fence
	epochs map[int32]int64
	host   string
	port   int
	mode   domain.TLSMode

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

const benchOwner = "bench-worker"

// newBenchWorld sets up the schema, the fence (every partition's epoch
// taken) and the runner, talking mode to srv.
func newBenchWorld(b *testing.B, srv *benchServer, mode domain.TLSMode) *benchWorld {
	b.Helper()
	ctx := b.Context()
	w := &benchWorld{b: b, db: pgtest.New(b), reg: prometheus.NewRegistry(), rep: &countReporter{}, mode: mode}
	// The runner's pool is pgtest's, MaxConns 4: pgxpool's default on this
	// 2-core machine, which is what `mailplane sync` runs with.
	if err := migrations.Apply(ctx, w.db.Pool); err != nil {
		b.Fatal(err)
	}
	obs, err := pgx.Connect(ctx, w.db.URL)
	if err != nil {
		b.Fatal(err)
	}
	w.obs = obs
	b.Cleanup(func() { _ = obs.Close(context.Background()) })
	fence := mailsync.NewFence(w.db.Pool, nil, 0)
	parts := make([]int32, benchPartitions)
	for i := range parts {
		parts[i] = int32(i)
	}
	epochs, err := fence.Acquire(ctx, benchOwner, parts)
	if err != nil {
		b.Fatal(err)
	}
	key := make([]byte, sealing.KeySize)
	for i := range key {
		key[i] = byte(i * 7)
	}
	kr, err := sealing.NewKeyring("bench-1", map[string][]byte{"bench-1": key})
	if err != nil {
		b.Fatal(err)
	}
	addr := srv.plain
	if mode != domain.TLSNone {
		addr = srv.implicit
	}
	host, portS, _ := net.SplitHostPort(addr)
	w.host = host
	w.port, _ = strconv.Atoi(portS)
	w.kr, w.fence, w.epochs = kr, fence, epochs
	// The runner's defaults (timeouts, backoff, IDLE refresh) but for the
	// CA bundle trusting the server's certificate.
	w.runner, err = imapsync.New(imapsync.Config{Keyring: kr, RootCAs: srv.cert.Pool, Reporter: w.rep, Registerer: w.reg, Transport: domain.MustTransportPolicy("127.0.0.0/8")})
	if err != nil {
		b.Fatal(err)
	}
	return w
}

// addJobs builds n jobs (mailboxes u00000...) in tier, the way a worker
// does: the mailbox.state record with sealed credentials, its partition's
// epoch and fenced writer. No connection pacing (mailsync.NewJob has none).
func (w *benchWorld) addJobs(n int, tier domain.SyncTier, pollWarm time.Duration) {
	b, kr := w.b, w.kr
	added := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		id := fmt.Sprintf("0190a1b2-c3d4-7e5f-8a9b-%012x", i)
		plain, _ := json.Marshal(domain.Credentials{Password: benchPass(i)})
		sealed, err := kr.Seal(plain, domain.CredentialsAAD(id, domain.ProviderSMTPIMAP, domain.IMAPEndpoint{Host: w.host, Port: w.port, TLS: w.mode, Username: benchUser(i)}))
		if err != nil {
			b.Fatal(err)
		}
		mb := domain.MailboxStateRecord{
			MailboxID: id, OrgID: "0190a1b2-0000-7000-8000-000000000001", UserID: fmt.Sprintf("0190a1b2-0000-7000-9000-%012x", i),
			Address: benchUser(i) + "@bench.example", Provider: domain.ProviderSMTPIMAP,
			IMAP:              domain.IMAPEndpoint{Host: w.host, Port: w.port, TLS: w.mode, Username: benchUser(i)},
			SealedCredentials: &sealed, Enabled: true, AddedAt: added,
		}
		p := int32(i % benchPartitions)
		e := w.epochs[p]
		job, _ := mailsync.NewJob(mb, p, e, benchOwner, w.fence.Writer(p, e, benchOwner, id), tier, nil)
		job.PollWarm = pollWarm
		job.PollCold = time.Hour
		w.jobs = append(w.jobs, job)
	}
}

// start runs every job; they are stopped at the end of the benchmark
// (before the schema is dropped).
func (w *benchWorld) start() {
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	for _, j := range w.jobs {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			if err := w.runner.Run(ctx, j); err != nil {
				w.b.Errorf("Run %s: %v", j.Mailbox.MailboxID, err)
			}
		}()
	}
	w.b.Cleanup(w.stop)
}

func (w *benchWorld) stop() {
	if w.cancel == nil {
		return
	}
	w.cancel()
	w.cancel = nil
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		w.b.Errorf("runners still running 30s after their context ended")
	}
}

// metric sums the samples of a runner metric whose labels include want.
func (w *benchWorld) metric(name string, want map[string]string) float64 {
	mfs, err := w.reg.Gather()
	if err != nil {
		w.b.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				ok := false
				for _, lp := range m.GetLabel() {
					ok = ok || (lp.GetName() == k && lp.GetValue() == v)
				}
				if !ok {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

func (w *benchWorld) count(sql string) int {
	var n int
	if err := w.obs.QueryRow(w.b.Context(), sql).Scan(&n); err != nil {
		w.b.Fatal(err)
	}
	return n
}

// waitUntil polls cond every 250ms until it holds; it fails the benchmark
// after timeout.
func waitUntil(b *testing.B, timeout time.Duration, what string, cond func() (bool, string)) time.Duration {
	b.Helper()
	start := time.Now()
	last := ""
	for {
		ok, state := cond()
		if ok {
			return time.Since(start)
		}
		last = state
		if time.Since(start) > timeout {
			b.Fatalf("timed out after %s waiting for %s; last: %s", timeout, what, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

type memSnap struct {
	rss, heap, stack uint64 // bytes; heap: HeapInuse after a GC
	// unreturned is heap memory free in the runtime but not returned to
	// the OS yet (HeapIdle - HeapReleased): part of the RSS, no live data.
	unreturned uint64
	goroutines int
}

// snapMem snapshots the process's memory after a GC; scavenge first
// returns the freed memory to the OS (a baseline free of what an earlier
// benchmark in the same process left behind).
func snapMem(scavenge bool) memSnap {
	runtime.GC()
	if scavenge {
		debug.FreeOSMemory()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSnap{rss: uint64(vmRSSKiB()) * 1024, heap: ms.HeapInuse, stack: ms.StackInuse,
		unreturned: ms.HeapIdle - ms.HeapReleased, goroutines: runtime.NumGoroutine()}
}

// loadAvg is the machine's 1-minute load average: other work shares the
// two cores.
func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

func tlsName(m domain.TLSMode) string { return "tls=" + string(m) }

// BenchmarkIMAPHot holds MAILPLANE_BENCH_HOT (5000) mailboxes in IDLE with
// one runner, then measures the runner process's memory per hot mailbox,
// its CPU over a quiet interval, and new mail to stored row latency with
// all of them held.
func BenchmarkIMAPHot(b *testing.B) {
	for _, mode := range []domain.TLSMode{domain.TLSNone, domain.TLSImplicit} {
		b.Run(tlsName(mode), func(b *testing.B) { benchHot(b, mode) })
	}
}

func benchHot(b *testing.B, mode domain.TLSMode) {
	n := envInt("MAILPLANE_BENCH_HOT", 5000)
	quiet := envDuration("MAILPLANE_BENCH_QUIET", 20*time.Second)
	samples := envInt("MAILPLANE_BENCH_LATENCY_SAMPLES", 500)
	nofile := raiseNoFile()
	// The sync role's memory limit, as `mailplane sync` sets it: its
	// setting from the environment (MAILPLANE_SYNC_MEMORY_LIMIT), else the
	// default; GOMEMLIMIT, if the environment has it, wins.
	setting := config.SyncMemLimit.Default
	if v := os.Getenv(config.SyncMemLimit.Env); v != "" {
		setting = v
	}
	spec, err := memlimit.Parse(setting)
	if err != nil {
		b.Fatal(err)
	}
	prevLimit := debug.SetMemoryLimit(-1)
	b.Cleanup(func() { debug.SetMemoryLimit(prevLimit) })
	limit := memlimit.Apply(spec, slog.New(slog.DiscardHandler))
	b.Logf("memory limit %d MiB (%s)", limit.Bytes>>20, limit.Source)
	srv := startBenchServer(b, n)
	// PollWarm is an hour: each hot mailbox polls its special-use folders
	// once at start, on its second connection, and not again during the
	// measurement, which therefore sees the steady IDLE alone.
	w := newBenchWorld(b, srv, mode)
	before := snapMem(true)
	// Reset the peak RSS (VmHWM) to the current RSS: an earlier benchmark
	// in this process may have set it.
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	w.addJobs(n, domain.SyncTierHot, time.Hour)

	b.ResetTimer()
	w.start()
	rs := sampleRamp()
	// The server's session count, sampled during the ramp: a mailbox with
	// a second connection (a poll alongside the IDLE) shows here. Setting
	// up: connections open at the runner but not in IDLE at the server.
	peakSessions, peakSetup, peakSlots := int64(0), int64(0), 0.0
	ramp := waitUntil(b, 15*time.Minute, fmt.Sprintf("%d mailboxes in IDLE", n), func() (bool, string) {
		st := srv.stats(b)
		peakSessions = max(peakSessions, st.Sessions)
		open := int64(w.metric("mailplane_imap_connections_open", map[string]string{"tier": "hot"}))
		peakSetup = max(peakSetup, open-st.Idling)
		peakSlots = max(peakSlots, w.metric("mailplane_imap_setting_up_mailboxes", nil))
		cursors := w.count(`SELECT count(*) FROM imap_folder_cursors`)
		fails, why := w.rep.total()
		return st.Idling == int64(n) && open == int64(n) && cursors == 3*n,
			fmt.Sprintf("idling %d, open %d, cursors %d/%d, failures %d %s", st.Idling, open, cursors, 3*n, fails, why)
	})
	peak := rs.stop()
	rows := w.count(`SELECT count(*) FROM imap_messages`)
	if rows != n {
		b.Errorf("%d message rows after the first sync, want %d", rows, n)
	}
	time.Sleep(3 * time.Second) // let the ramp's garbage and sockets settle
	after := snapMem(false)     // the RSS as the OS charges it, the ramp's leftovers included
	writeHeapProfile(b)
	hwm := vmHWMKiB()

	// Quiet interval: nothing arrives; every mailbox sits in IDLE.
	conn0 := w.metric("mailplane_imap_connects_total", nil)
	fail0, _ := w.rep.total()
	st0, cpu0, t0 := srv.stats(b), int64(mailplanetest.CPUTime()), time.Now()
	time.Sleep(quiet)
	st1, cpu1, wall := srv.stats(b), int64(mailplanetest.CPUTime()), time.Since(t0)
	fail1, why := w.rep.total()
	if st1.Idling != int64(n) || w.metric("mailplane_imap_connects_total", nil) != conn0 || fail1 != fail0 {
		b.Errorf("not quiet: idling %d, %v new connections, %d new failures (%s)", st1.Idling,
			w.metric("mailplane_imap_connects_total", nil)-conn0, fail1-fail0, why)
	}
	idleCPU := float64(cpu1-cpu0) / float64(wall) * 100
	// Connections held at the server per hot mailbox in the steady state,
	// and logins per mailbox since the start (1: no reconnect, no second
	// connection for the special-use folders).
	connsPer := float64(st1.Sessions) / float64(n)
	loginsPer := float64(st1.Logins) / float64(n)
	rssQuiet := vmRSSKiB()
	// The steady state: a long-running worker collects at least every two
	// minutes (the runtime's forced GC), and each collection halves the
	// stacks that use under a quarter of their size, so the deep stacks
	// of the ramp's first syncs shrink over a few collections.
	for range 3 {
		runtime.GC()
	}
	steady := snapMem(false)
	scavenged := snapMem(true)
	srvCPU := float64(st1.CPUNanos-st0.CPUNanos) / float64(wall) * 100

	// New mail to stored row, with all n held in IDLE.
	lat := newMailLatency(b, w, srv, n, samples)
	b.StopTimer()

	perHot := func(d uint64, base uint64) float64 { return float64(int64(d)-int64(base)) / 1024 / float64(n) }
	b.ReportMetric(float64(st1.Idling), "hot_mailboxes")
	b.ReportMetric(float64(after.rss)/(1<<20), "rss_MiB")
	b.ReportMetric(float64(hwm)/1024, "peak_rss_MiB")
	b.ReportMetric(float64(peakSetup), "peak_setting_up")
	b.ReportMetric(float64(peak.objects)/(1<<20), "peak_heap_objects_MiB")
	b.ReportMetric(float64(peak.stacks)/(1<<20), "peak_stacks_MiB")
	b.ReportMetric(perHot(after.rss, before.rss), "KiB/hot_mailbox")
	b.ReportMetric(perHot(after.heap, before.heap), "heap_KiB/hot_mailbox")
	b.ReportMetric(perHot(after.stack, before.stack), "stack_KiB/hot_mailbox")
	b.ReportMetric(float64(after.goroutines-before.goroutines)/float64(n), "goroutines/hot_mailbox")
	b.ReportMetric(connsPer, "conns/hot_mailbox")
	b.ReportMetric(float64(peakSessions)/float64(n), "peak_conns/hot_mailbox")
	b.ReportMetric(loginsPer, "logins/hot_mailbox")
	b.ReportMetric(float64(after.unreturned)/(1<<20), "unreturned_heap_MiB")
	b.ReportMetric(perHot(steady.heap, before.heap), "steady_heap_KiB/hot_mailbox")
	b.ReportMetric(perHot(steady.stack, before.stack), "steady_stack_KiB/hot_mailbox")
	b.ReportMetric(float64(steady.rss)/(1<<20), "steady_rss_MiB")
	b.ReportMetric(float64(st1.RSSKiB)/1024, "server_rss_MiB")
	b.ReportMetric(float64(st1.RSSKiB)/float64(n), "server_KiB/hot_mailbox")
	b.ReportMetric(idleCPU, "idle_cpu_%")
	b.ReportMetric(srvCPU, "server_idle_cpu_%")
	b.ReportMetric(ramp.Seconds(), "ramp_s")
	b.ReportMetric(ms(lat.p50), "p50_ms")
	b.ReportMetric(ms(lat.p99), "p99_ms")
	b.ReportMetric(ms(lat.max), "max_ms")
	b.ReportMetric(0, "ns/op")
	fails, why := w.rep.total()
	b.Logf("ramp: %s; at most %d mailboxes connected and not yet in IDLE at once, %.0f holding a setup slot (sampled); memory limit %s", peak, peakSetup, peakSlots, memLimitText())
	b.Logf("%s: %d hot mailboxes in IDLE after %.1fs (failures during ramp-up: %d %s); runner RSS %.0f MiB (before %.0f MiB, peak %.0f MiB, %.0f MiB at the end of the quiet interval, %.0f MiB once freed memory is returned to the OS), "+
		"heap %.0f MiB, stacks %.0f MiB, %d goroutines; idle CPU %.2f%% of a core over %s (server %.2f%%); "+
		"free heap not yet returned to the OS %.0f MiB; after 4 collections: heap %.0f MiB, stacks %.0f MiB, RSS %.0f MiB; %.2f connections and %.2f logins per mailbox at the server (peak %.2f during the ramp); "+
		"server RSS %d MiB; RLIMIT_NOFILE %d; new mail → row over %d samples: p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms; load average %s",
		mode, st1.Idling, ramp.Seconds(), fails, why, float64(after.rss)/(1<<20), float64(before.rss)/(1<<20), float64(hwm)/1024, float64(rssQuiet)/1024, float64(scavenged.rss)/(1<<20),
		float64(after.heap)/(1<<20), float64(after.stack)/(1<<20), after.goroutines, idleCPU, wall.Round(time.Millisecond), srvCPU,
		float64(after.unreturned)/(1<<20), float64(steady.heap)/(1<<20), float64(steady.stack)/(1<<20), float64(steady.rss)/(1<<20), connsPer, loginsPer, float64(peakSessions)/float64(n),
		st1.RSSKiB/1024, nofile, len(lat.all), ms(lat.p50), ms(lat.p90), ms(lat.p99), ms(lat.max), loadAvg())
}

// rampPeak is the runtime's memory at the sample of the ramp with the
// largest RSS: heap objects (live and not yet swept garbage), the live heap
// as of the last GC, free heap kept by the runtime, goroutine stacks.
type rampPeak struct {
	rss, objects, live, free, stacks, total uint64
	goroutines                              uint64
	gcs                                     uint64
}

func (p rampPeak) String() string {
	mib := func(v uint64) float64 { return float64(v) / (1 << 20) }
	return fmt.Sprintf("peak RSS %.0f MiB sampled: heap objects %.0f MiB (live at the last GC %.0f MiB, the rest garbage), free heap kept %.0f MiB, stacks %.0f MiB, runtime total %.0f MiB, %d goroutines, %d GCs so far",
		mib(p.rss), mib(p.objects), mib(p.live), mib(p.free), mib(p.stacks), mib(p.total), p.goroutines, p.gcs)
}

type rampSampler struct {
	stopc chan struct{}
	done  chan rampPeak
}

// sampleRamp samples the RSS and runtime/metrics every 100 ms until stop,
// keeping the sample with the largest RSS.
func sampleRamp() *rampSampler {
	s := &rampSampler{stopc: make(chan struct{}), done: make(chan rampPeak, 1)}
	names := []string{"/memory/classes/heap/objects:bytes", "/gc/heap/live:bytes", "/memory/classes/heap/free:bytes",
		"/memory/classes/heap/stacks:bytes", "/memory/classes/total:bytes", "/sched/goroutines:goroutines", "/gc/cycles/total:gc-cycles",
		"/memory/classes/heap/released:bytes"}
	go func() {
		var peak rampPeak
		samples := make([]metrics.Sample, len(names))
		for i, n := range names {
			samples[i].Name = n
		}
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			rss := uint64(vmRSSKiB()) * 1024
			if rss > peak.rss {
				metrics.Read(samples)
				v := func(i int) uint64 { return samples[i].Value.Uint64() }
				peak = rampPeak{rss: rss, objects: v(0), live: v(1), free: v(2), stacks: v(3), total: v(4) - v(7), goroutines: v(5), gcs: v(6)}
			}
			select {
			case <-s.stopc:
				s.done <- peak
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *rampSampler) stop() rampPeak { close(s.stopc); return <-s.done }

// memLimitText is the runtime's soft memory limit in effect.
func memLimitText() string {
	if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 {
		return fmt.Sprintf("%.0f MiB", float64(l)/(1<<20))
	}
	return "none"
}

// writeHeapProfile writes the heap profile to MAILPLANE_BENCH_HEAPPROFILE,
// if set: where a hot mailbox's memory goes (go tool pprof -sample_index
// inuse_space).
func writeHeapProfile(b *testing.B) {
	path := os.Getenv("MAILPLANE_BENCH_HEAPPROFILE")
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

type latencies struct {
	all                []time.Duration
	p50, p90, p99, max time.Duration
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

// newMailLatency delivers samples messages, one at a time, each to the
// INBOX of a random hot mailbox in the server process, and times each from
// just before the delivery request to the commit of its row in
// imap_messages (a trigger NOTIFYs at commit; a LISTENing connection
// timestamps the notification as it arrives).
func newMailLatency(b *testing.B, w *benchWorld, srv *benchServer, n, samples int) latencies {
	ctx := b.Context()
	ch := "imapbench_" + w.db.Schema
	if _, err := w.obs.Exec(ctx, `CREATE FUNCTION bench_row_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_notify('`+ch+`', NEW.message_id); RETURN NULL; END $$;
CREATE TRIGGER bench_row_notify AFTER INSERT ON imap_messages FOR EACH ROW EXECUTE FUNCTION bench_row_notify()`); err != nil {
		b.Fatal(err)
	}
	if _, err := w.obs.Exec(ctx, "LISTEN "+ch); err != nil {
		b.Fatal(err)
	}
	type arrival struct {
		id string
		at time.Time
	}
	arrivals := make(chan arrival, 64)
	lctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nt, err := w.obs.WaitForNotification(lctx)
			if err != nil {
				return
			}
			arrivals <- arrival{strings.Trim(nt.Payload, "<>"), time.Now()}
		}
	}()
	defer func() { stop(); <-done }()

	var out latencies
	for k := range samples {
		i := rand.N(n)
		id := fmt.Sprintf("lat-%d-%d@bench.example", k, i)
		t0 := time.Now()
		if err := srv.deliver(i, "INBOX", id); err != nil {
			b.Fatal(err)
		}
		timeout := time.After(30 * time.Second)
	wait:
		for {
			select {
			case a := <-arrivals:
				if a.id == id {
					out.all = append(out.all, a.at.Sub(t0))
					break wait
				}
			case <-timeout:
				fails, why := w.rep.total()
				b.Fatalf("message %s not stored 30s after delivery (failures %d %s)", id, fails, why)
			}
		}
		time.Sleep(time.Duration(10+rand.N(20)) * time.Millisecond)
	}
	sorted := slices.Clone(out.all)
	slices.Sort(sorted)
	out.p50, out.p90, out.p99 = percentile(sorted, 0.50), percentile(sorted, 0.90), percentile(sorted, 0.99)
	out.max = sorted[len(sorted)-1]
	return out
}

// BenchmarkIMAPWarm polls MAILPLANE_BENCH_WARM (10000) warm mailboxes with
// one runner: a first round (every mailbox at once, first sync included),
// then with POLL_WARM set to 1s, so that every mailbox polls again as soon
// as it can, the sustained poll rate over MAILPLANE_BENCH_WARM_WINDOW.
// A poll is connect, LOGIN, CAPABILITY, LIST, SELECT of INBOX, Junk and
// Sent (with the fetches the runner makes: flags of INBOX's messages, new
// messages only in the first round), LOGOUT; counted by the server when
// such a session closes.
func BenchmarkIMAPWarm(b *testing.B) {
	for _, mode := range []domain.TLSMode{domain.TLSNone, domain.TLSImplicit} {
		b.Run(tlsName(mode), func(b *testing.B) { benchWarm(b, mode) })
	}
}

func benchWarm(b *testing.B, mode domain.TLSMode) {
	n := envInt("MAILPLANE_BENCH_WARM", 10000)
	window := envDuration("MAILPLANE_BENCH_WARM_WINDOW", 30*time.Second)
	const pollWarm300 = 300 * time.Second
	raiseNoFile()
	srv := startBenchServer(b, n)
	w := newBenchWorld(b, srv, mode)
	w.addJobs(n, domain.SyncTierWarm, time.Second)

	b.ResetTimer()
	w.start()
	first := waitUntil(b, 10*time.Minute, fmt.Sprintf("a first poll of %d mailboxes", n), func() (bool, string) {
		c := w.count(`SELECT count(*) FROM imap_folder_cursors`)
		fails, why := w.rep.total()
		return c == 3*n, fmt.Sprintf("cursors %d/%d, failures %d %s", c, 3*n, fails, why)
	})
	if rows := w.count(`SELECT count(*) FROM imap_messages`); rows != n {
		b.Errorf("%d message rows after the first round, want %d", rows, n)
	}
	time.Sleep(5 * time.Second) // into the steady state

	fail0, _ := w.rep.total()
	conn0 := w.metric("mailplane_imap_connects_total", nil)
	st0, cpu0, t0 := srv.stats(b), int64(mailplanetest.CPUTime()), time.Now()
	peak := int64(0)
	for time.Since(t0) < window {
		time.Sleep(time.Second)
		peak = max(peak, srv.stats(b).Sessions)
	}
	st1, cpu1, wall := srv.stats(b), int64(mailplanetest.CPUTime()), time.Since(t0)
	conn1 := w.metric("mailplane_imap_connects_total", nil)
	fail1, why := w.rep.total()
	b.StopTimer()

	rate := float64(st1.Polls-st0.Polls) / wall.Seconds()
	round := float64(n) / rate
	b.ReportMetric(float64(n), "warm_mailboxes")
	b.ReportMetric(rate, "polls/s")
	b.ReportMetric((conn1-conn0)/wall.Seconds(), "connects/s")
	b.ReportMetric(round, "round_s")
	b.ReportMetric(round/pollWarm300.Seconds(), "round/POLL_WARM")
	b.ReportMetric(first.Seconds(), "first_round_s")
	b.ReportMetric(float64(cpu1-cpu0)/float64(wall)*100, "runner_cpu_%")
	b.ReportMetric(float64(st1.CPUNanos-st0.CPUNanos)/float64(wall)*100, "server_cpu_%")
	polls := float64(st1.Polls - st0.Polls)
	b.ReportMetric(float64(cpu1-cpu0)/1e6/polls, "runner_cpu_ms/poll")
	b.ReportMetric(float64(st1.CPUNanos-st0.CPUNanos)/1e6/polls, "server_cpu_ms/poll")
	b.ReportMetric(float64(fail1-fail0), "failures")
	b.ReportMetric(0, "ns/op")
	b.Logf("%s: %d warm mailboxes; first round (all at once, first sync) %.1fs = %.0f polls/s; steady, POLL_WARM 1s, over %s: "+
		"%.0f polls/s, %.0f connects/s, so one round of %d takes %.1fs = %.3f of POLL_WARM 300s; up to %d sessions open at the server; "+
		"runner CPU %.0f%%, server CPU %.0f%% (of one core); failures in the window %d (all: %s); runner RSS %d MiB, server RSS %d MiB; load average %s",
		mode, n, first.Seconds(), float64(n)/first.Seconds(), wall.Round(time.Millisecond), rate, (conn1-conn0)/wall.Seconds(), n, round,
		round/pollWarm300.Seconds(), peak, float64(cpu1-cpu0)/float64(wall)*100, float64(st1.CPUNanos-st0.CPUNanos)/float64(wall)*100,
		fail1-fail0, why, vmRSSKiB()/1024, st1.RSSKiB/1024, loadAvg())
}
