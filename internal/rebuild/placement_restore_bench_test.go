package rebuild

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/topics"
)

// The environment of a restore child process (see TestMain): what it
// measures (restoreModeRaw, restoreModeLog or restoreModeCheckpoint), the
// brokers, and the URL of the projection's schema.
const (
	restoreChildEnv   = "MAILPLANE_BENCH_RESTORE_CHILD"
	restoreBrokersEnv = "MAILPLANE_BENCH_RESTORE_BROKERS"
	restoreNSEnv      = "MAILPLANE_BENCH_RESTORE_NAMESPACE" // the benchmark's topic namespace
	restoreDBEnv      = "MAILPLANE_BENCH_RESTORE_DB"

	restoreModeRaw        = "raw"
	restoreModeLog        = "log"
	restoreModeCheckpoint = "checkpoint"
)

// TestMain runs the package's tests, or, in a restore child, one restore
// measured alone in its own process (so its peak RSS is the restore's, not
// the broker's or the benchmark's that hold the log).
func TestMain(m *testing.M) {
	if mode := os.Getenv(restoreChildEnv); mode != "" {
		if err := restoreChild(mode); err != nil {
			fmt.Fprintln(os.Stderr, "restore child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// restoreResult is what a restore child prints, one JSON line after
// restoreResultPrefix.
type restoreResult struct {
	Mode string `json:"mode"`
	// Seconds: the engine's own restore time (its
	// mailplane_placement_restore_seconds: checkpoint load, log tail,
	// state); for raw, the read of the log.
	Seconds float64 `json:"seconds"`
	// ToActiveSeconds: from Run to Active (group join included).
	ToActiveSeconds float64 `json:"to_active_seconds"`
	Records         int64   `json:"records"` // decisions folded; raw: records read
	Bytes           int64   `json:"bytes"`   // raw: key+value+header bytes read
	Workers         int     `json:"workers"` // mailplane_placement_workers, summed
	Pending         int     `json:"pending"` // mailplane_placement_pending, summed
	// Phases: the engine's own breakdown of Seconds (checkpoint_load,
	// state_build, log_fold), in seconds.
	Phases       map[string]float64 `json:"phases,omitempty"`
	HeapInuseMiB float64            `json:"heap_inuse_mib"` // after runtime.GC, the engine still holding its state
	HeapAllocMiB float64            `json:"heap_alloc_mib"`
	VmHWMMiB     float64            `json:"vmhwm_mib"` // peak RSS of the child process
	VmRSSMiB     float64            `json:"vmrss_mib"` // RSS after the restore
	// CPUSeconds: user and system time of the whole child (getrusage):
	// less at the mercy of the machine's other work than Seconds.
	CPUSeconds float64 `json:"cpu_seconds"`
}

const restoreResultPrefix = "RESTORE-RESULT "

func restoreChild(mode string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ns, err := topics.ParseNamespace(os.Getenv(restoreNSEnv))
	if err != nil {
		return err
	}
	kcfg := kafka.Config{Brokers: strings.Split(os.Getenv(restoreBrokersEnv), ","), ClientID: "restore-bench", Namespace: ns}
	res := restoreResult{Mode: mode}
	// MAILPLANE_BENCH_RESTORE_PROFILE=<dir> writes <dir>/<mode>.cpu, the
	// CPU profile of the child from its start to its exit.
	if dir := os.Getenv("MAILPLANE_BENCH_RESTORE_PROFILE"); dir != "" {
		f, err := os.Create(filepath.Join(dir, mode+".cpu"))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var hold any // what the measured heap holds: the running engine
	switch mode {
	case restoreModeRaw:
		start := time.Now()
		n, size, err := rawReadLog(ctx, kcfg)
		if err != nil {
			return err
		}
		res.Seconds, res.Records, res.Bytes = time.Since(start).Seconds(), n, size
	case restoreModeLog, restoreModeCheckpoint:
		// The engine's log line on becoming active breaks the restore
		// down (checkpoint load, state build, log fold).
		phases := &phaseHandler{phases: map[string]float64{}}
		res.Phases = phases.phases
		opts := []engine.Option{engine.WithTickInterval(time.Hour), engine.WithLogger(slog.New(phases))}
		if mode == restoreModeCheckpoint {
			pool, err := pgxpool.New(ctx, os.Getenv(restoreDBEnv))
			if err != nil {
				return err
			}
			defer pool.Close()
			opts = append(opts, engine.WithSnapshotter(postgres.NewSnapshotter(pool)))
		}
		reg := prometheus.NewRegistry()
		eng, err := engine.New(kcfg, append(opts, engine.WithRegisterer(reg))...)
		if err != nil {
			return err
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- eng.Run(rctx) }()
		for !eng.Active() {
			select {
			case err := <-done:
				stop()
				return fmt.Errorf("engine stopped before it was active: %v", err)
			case <-ctx.Done():
				stop()
				return errors.New("engine not active within 10 minutes")
			case <-time.After(5 * time.Millisecond):
			}
		}
		res.ToActiveSeconds = time.Since(start).Seconds()
		mfs, err := reg.Gather()
		if err != nil {
			stop()
			return err
		}
		for _, mf := range mfs {
			switch mf.GetName() {
			case "mailplane_placement_restore_seconds":
				res.Seconds = mf.GetMetric()[0].GetHistogram().GetSampleSum()
			case "mailplane_placement_restore_decisions":
				res.Records = int64(mf.GetMetric()[0].GetGauge().GetValue())
			case "mailplane_placement_workers", "mailplane_placement_pending":
				sum := 0
				for _, m := range mf.GetMetric() {
					sum += int(m.GetGauge().GetValue())
				}
				if mf.GetName() == "mailplane_placement_workers" {
					res.Workers = sum
				} else {
					res.Pending = sum
				}
			}
		}
		hold = eng
		defer func() {
			stop()
			<-done
		}()
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	runtime.KeepAlive(hold)
	res.HeapInuseMiB, res.HeapAllocMiB = float64(ms.HeapInuse)/(1<<20), float64(ms.HeapAlloc)/(1<<20)
	if res.VmHWMMiB, res.VmRSSMiB, err = procMemory(); err != nil {
		return err
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return err
	}
	res.CPUSeconds = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	out, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Println(restoreResultPrefix + string(out))
	return nil
}

// phaseHandler keeps the durations of the engine's "placement engine
// active" log line: where its restore's time went.
type phaseHandler struct {
	mu     sync.Mutex
	phases map[string]float64
}

func (h *phaseHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *phaseHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *phaseHandler) WithGroup(string) slog.Handler            { return h }
func (h *phaseHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "placement engine active" {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	r.Attrs(func(a slog.Attr) bool {
		if a.Value.Kind() == slog.KindDuration {
			h.phases[a.Key] = a.Value.Duration().Seconds()
		}
		return true
	})
	return nil
}

// rawReadLog reads the decision log from its start to its end with a
// plain consumer (read_committed, nothing decoded): the limit a restore
// from the log is measured against.
func rawReadLog(ctx context.Context, kcfg kafka.Config) (records, size int64, err error) {
	adm, err := kafka.NewAdmin(kcfg)
	if err != nil {
		return 0, 0, err
	}
	log := kcfg.Topic(topics.PlacementDecisions)
	ends, err := adm.ListEndOffsets(ctx, log)
	adm.Close()
	if err != nil {
		return 0, 0, err
	}
	end, ok := ends.Lookup(log, 0)
	if !ok || end.Err != nil {
		return 0, 0, fmt.Errorf("end of the decision log: %v", end.Err)
	}
	cl, err := kafka.NewClient(kcfg, kafka.KindReader, kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{log: {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	next := int64(0)
	for next < end.Offset {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			return 0, 0, err
		}
		fs.EachRecord(func(r *kgo.Record) {
			records++
			size += int64(len(r.Key) + len(r.Value))
			for _, h := range r.Headers {
				size += int64(len(h.Key) + len(h.Value))
			}
			next = r.Offset + 1
		})
	}
	return records, size, nil
}

// procMemory reads the process's peak and current resident set sizes
// (VmHWM, VmRSS) from /proc/self/status, in MiB.
func procMemory() (hwm, rss float64, err error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmHWM" && k != "VmRSS") {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", k, err)
		}
		if k == "VmHWM" {
			hwm = kb / 1024
		} else {
			rss = kb / 1024
		}
	}
	if hwm == 0 || rss == 0 {
		return 0, 0, errors.New("no VmHWM/VmRSS in /proc/self/status")
	}
	return hwm, rss, sc.Err()
}

// runRestoreChild runs bin (this test binary, or another build of it) as
// a restore child and returns its result.
func runRestoreChild(b *testing.B, bin, mode string, kcfg kafka.Config, dbURL string) restoreResult {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 11*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), restoreChildEnv+"="+mode, restoreBrokersEnv+"="+strings.Join(kcfg.Brokers, ","), restoreNSEnv+"="+string(kcfg.Namespace), restoreDBEnv+"="+dbURL)
	if bin != os.Args[0] {
		cmd.Env = append(cmd.Env, "MAILPLANE_BENCH_RESTORE_PROFILE=") // profiles are this binary's
	}
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, b.Output()
	if err := cmd.Run(); err != nil {
		b.Fatalf("restore child %s: %v\n%s", mode, err, stdout.String())
	}
	for line := range strings.Lines(stdout.String()) {
		if rest, ok := strings.CutPrefix(line, restoreResultPrefix); ok {
			var r restoreResult
			if err := json.Unmarshal([]byte(rest), &r); err != nil {
				b.Fatalf("restore child %s: %v", mode, err)
			}
			return r
		}
	}
	b.Fatalf("restore child %s printed no result:\n%s", mode, stdout.String())
	return restoreResult{}
}

// restoreFleet makes the decision log of the decider benchmark's fleet
// (internal/placement's plBenchBuild: 10,000 workers, 2,000 shared free
// and 8,000 shared premium, 60 % oauth_api, 30 % cold_smtp, 10 %
// warmup_only, all past the age ramp; 20,000 orgs, 10 % free, 2 %
// dedicated with 2 workers each; 1,000,000 mailboxes, 25 % smtp, 25 % smtp
// with warmup, 50 % gmail/outlook, the first 2 % scored watch) with the
// pure decider, then a tail of tail inputs: a new mailbox added and an old
// one removed, in turns.
func restoreFleet(mailboxes, tail int) (log, tailDs []domain.PlacementDecision) {
	const workers, orgs = 10_000, 20_000
	st := placement.NewState(placement.Config{})
	now := t0
	var out []domain.PlacementDecision
	apply := func(d domain.Data) { out = append(out, st.Apply(placement.Input{At: now, Event: d})...) }
	hb := func(i int) *domain.WorkerHeartbeat {
		tier := domain.TierSharedPremium
		if i%5 == 0 {
			tier = domain.TierSharedFree
		}
		egress := domain.EgressOAuthAPI
		switch i % 10 {
		case 6, 7, 8:
			egress = domain.EgressColdSMTP
		case 9:
			egress = domain.EgressWarmupOnly
		}
		return &domain.WorkerHeartbeat{WorkerID: workerID(i), Tier: tier, Egress: egress, Address: fmt.Sprintf("10.%d.%d.%d:25", i/65536, i/256%256, i%256)}
	}
	for i := range workers {
		apply(hb(i))
	}
	now = now.Add(15 * 24 * time.Hour)
	for i := range workers {
		apply(hb(i))
	}
	for o := range orgs {
		ev := &domain.OrgPlanChanged{OrgID: orgID(o), Plan: domain.PlanPremium, Paid: true, Source: "bench"}
		switch {
		case o%10 == 0:
			continue // no plan: free
		case o%50 == 1:
			ev.Plan, ev.DedicatedWorkers = domain.PlanDedicated, 2
		}
		apply(ev)
	}
	added := func(i int) *domain.MailboxAdded {
		p := domain.ProviderSMTPIMAP
		switch i % 4 {
		case 2:
			p = domain.ProviderGmail
		case 3:
			p = domain.ProviderOutlook
		}
		org := orgID(i % orgs)
		return &domain.MailboxAdded{MailboxID: mailboxID(i), OrgID: org, UserID: org, Address: fmt.Sprintf("box%d@example.com", i), Provider: p, WarmupEnabled: i%4 == 1}
	}
	for i := range mailboxes {
		apply(added(i))
		if i < mailboxes/50 { // risky ones first, while idle workers exist to promote
			apply(&domain.MailboxHealthScored{MailboxID: mailboxID(i), State: domain.HealthWatch, Score: 60, Reason: "bench"})
		}
	}
	log, out = out, nil
	for i := range tail {
		now = now.Add(time.Millisecond)
		if i%2 == 0 {
			apply(added(mailboxes + i))
		} else {
			apply(&domain.MailboxRemoved{MailboxID: mailboxID(i), Reason: "bench"})
		}
	}
	return log, out
}

// restoreMailboxes is BenchmarkEngineRestore1M's fleet size: 1,000,000, or
// MAILPLANE_BENCH_RESTORE_MAILBOXES.
func restoreMailboxes(b *testing.B) int {
	b.Helper()
	s := os.Getenv("MAILPLANE_BENCH_RESTORE_MAILBOXES")
	if s == "" {
		return 1_000_000
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1000 {
		b.Fatalf("MAILPLANE_BENCH_RESTORE_MAILBOXES=%q: want a count of at least 1000", s)
	}
	return n
}

// BenchmarkEngineRestore1M (issue 13) restores a placement engine for the
// fleet of 1,000,000 mailboxes and 10,000 workers: the decider's decisions
// for it are produced into the decision log, the placement projection is
// rebuilt from that log (the checkpoint), and a tail of 10,000 inputs'
// decisions appended. Each measurement is a fresh child process running
// the engine (engine.New, Run, until Active): (a) with LogSnapshotter,
// the whole log folded; (b) with the projection's Snapshotter, the
// checkpoint loaded from Postgres and the tail folded; and the limit, (c)
// the same log read with a plain consumer, nothing decoded. Each reports
// the engine's restore seconds, heap in use after GC with the engine
// holding its state, and the child's peak RSS (VmHWM). The work is done
// once whatever b.N is; run it with -benchtime 1x.
func BenchmarkEngineRestore1M(b *testing.B) {
	ctx := context.Background()
	start := time.Now()
	ds, tail := restoreFleet(restoreMailboxes(b), 10_000)
	b.Logf("decider: %d decisions for the fleet, %d for the tail, in %s", len(ds), len(tail), time.Since(start).Round(time.Millisecond))
	start = time.Now()
	kcfg := benchLog(b, ds)
	b.Logf("produced in %s", time.Since(start).Round(time.Millisecond))

	db := pgtest.New(b)
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		b.Fatal(err)
	}
	start = time.Now()
	schema := db.Schema + "_placement_1"
	rb, err := Start(ctx, PlacementSpec(), Config{Kafka: kcfg, Live: db.Pool, Schema: schema, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer rb.Drop(context.Background())
	if rb.Records() != int64(len(ds)) {
		b.Fatalf("rebuilt %d decisions of %d", rb.Records(), len(ds))
	}
	b.Logf("checkpoint: projection rebuilt from %d decisions in %s", rb.Records(), time.Since(start).Round(time.Millisecond))
	appendLog(b, kcfg, tail)
	logLen := int64(len(ds) + len(tail))
	commitEngineOffsets(b, kcfg)
	ds, tail = nil, nil
	runtime.GC()

	b.ResetTimer()
	// MAILPLANE_BENCH_RESTORE_COMPARE names another build of this test
	// binary (the code before a change): its children run right after
	// this binary's, on the same log and checkpoint, so both face the same
	// machine (which other work shares). MAILPLANE_BENCH_RESTORE_ROUNDS
	// repeats the whole sequence.
	bins := []string{os.Args[0]}
	if c := os.Getenv("MAILPLANE_BENCH_RESTORE_COMPARE"); c != "" {
		bins = append(bins, c)
	}
	rounds := 1
	if s := os.Getenv("MAILPLANE_BENCH_RESTORE_ROUNDS"); s != "" {
		var err error
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 {
			b.Fatalf("MAILPLANE_BENCH_RESTORE_ROUNDS=%q: want a count of at least 1", s)
		}
	}
	ckURL := pgtest.URLWithSchema(b, schema)
	var first [3]restoreResult // this binary's first round: the reported metrics
	for round := range rounds {
		for i, bin := range bins {
			raw := runRestoreChild(b, bin, restoreModeRaw, kcfg, "")
			fromLog := runRestoreChild(b, bin, restoreModeLog, kcfg, "")
			fromCk := runRestoreChild(b, bin, restoreModeCheckpoint, kcfg, ckURL)
			if raw.Records != logLen || fromLog.Records != logLen || fromCk.Records != logLen-rb.Records() {
				b.Fatalf("%s: records: raw %d, from the log %d (want %d), from the checkpoint %d (want %d)",
					bin, raw.Records, fromLog.Records, logLen, fromCk.Records, logLen-rb.Records())
			}
			// Both restores hold the same state: the same workers and pending mailboxes.
			if fromLog.Workers != 10_000 || fromCk.Workers != fromLog.Workers || fromCk.Pending != fromLog.Pending {
				b.Fatalf("%s: workers %d from the log, %d from the checkpoint (want 10000); pending %d and %d",
					bin, fromLog.Workers, fromCk.Workers, fromLog.Pending, fromCk.Pending)
			}
			b.Logf("round %d, %s: both restores: %d workers, %d mailboxes pending", round+1, bin, fromLog.Workers, fromLog.Pending)
			for _, r := range []restoreResult{raw, fromLog, fromCk} {
				b.Logf("%-10s %8.3f s (to active %6.3f s; checkpoint load %6.3f s, state %6.3f s, log %6.3f s; child CPU %6.2f s), %8d records, heap in use %7.1f MiB (alloc %7.1f), peak RSS %7.1f MiB, RSS after %7.1f MiB",
					r.Mode, r.Seconds, r.ToActiveSeconds, r.Phases["checkpoint_load"], r.Phases["state_build"], r.Phases["log_fold"], r.CPUSeconds,
					r.Records, r.HeapInuseMiB, r.HeapAllocMiB, r.VmHWMMiB, r.VmRSSMiB)
			}
			if round == 0 && i == 0 {
				first = [3]restoreResult{raw, fromLog, fromCk}
				b.Logf("log: %d records, %.1f MiB (keys, values, headers)", raw.Records, float64(raw.Bytes)/(1<<20))
			}
		}
	}
	b.StopTimer()
	raw, fromLog, fromCk := first[0], first[1], first[2]
	b.ReportMetric(fromLog.Seconds, "log-s")
	b.ReportMetric(fromCk.Seconds, "checkpoint-s")
	b.ReportMetric(raw.Seconds, "raw-read-s")
	b.ReportMetric(fromLog.CPUSeconds, "log-cpu-s")
	b.ReportMetric(fromCk.CPUSeconds, "checkpoint-cpu-s")
	b.ReportMetric(raw.CPUSeconds, "raw-read-cpu-s")
	b.ReportMetric(fromLog.HeapInuseMiB, "log-heap-MiB")
	b.ReportMetric(fromCk.HeapInuseMiB, "checkpoint-heap-MiB")
	b.ReportMetric(fromLog.VmHWMMiB, "log-peak-rss-MiB")
	b.ReportMetric(fromCk.VmHWMMiB, "checkpoint-peak-rss-MiB")
}

// commitEngineOffsets commits the engine group's input offsets at 0, as
// the transactions that wrote a real log would have: an engine refuses to
// restore a non-empty log whose group has none (checkOffsets).
func commitEngineOffsets(b *testing.B, kcfg kafka.Config) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm, err := kafka.NewAdmin(kcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer adm.Close()
	offs := make(kadm.Offsets)
	for _, t := range topics.DomainTopics() {
		offs.Add(kadm.Offset{Topic: kcfg.Topic(t), Partition: 0, At: 0, LeaderEpoch: -1})
	}
	resp, err := adm.CommitOffsets(ctx, kcfg.Group(engine.DefaultGroup), offs)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		b.Fatal(err)
	}
}
