package rehearsal_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // servePprof
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/imapsync"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/memlimit"
	"github.com/mailplane/mailplane/internal/sealing"
)

// Environment of a sync worker process of the rehearsal.
const (
	envWorker   = "MAILPLANE_REHEARSAL_WORKER" // "1": be a sync worker
	envBroker   = "MAILPLANE_REHEARSAL_BROKER" // a file: be the broker, its address written there
	envBrokers  = "MAILPLANE_REHEARSAL_BROKERS"
	envDB       = "MAILPLANE_REHEARSAL_DATABASE_URL"
	envID       = "MAILPLANE_REHEARSAL_ID"
	envStatus   = "MAILPLANE_REHEARSAL_STATUS"
	envKey      = "MAILPLANE_REHEARSAL_KEY" // hex sealing key
	envRunner   = "MAILPLANE_REHEARSAL_RUNNER"
	envRate     = "MAILPLANE_REHEARSAL_CONNECT_RATE"
	envSession  = "MAILPLANE_REHEARSAL_SESSION"
	envNoWrites = "MAILPLANE_REHEARSAL_NO_WRITES"
	envLogLevel = "MAILPLANE_REHEARSAL_LOG_LEVEL" // the workers' slog level (warn)
	envOut      = "MAILPLANE_REHEARSAL_OUT"       // a directory: each worker's whole output goes to <id>.log there
	envPprof    = "MAILPLANE_REHEARSAL_PPROF"     // "1": serve net/http/pprof (block and mutex profiles on); its address in <out>/<id>.pprof
	workerUp    = "rehearsal worker: ready"
	keyID       = "rehearsal-1"
)

// workerStatus is what a worker process reports in its status file: the
// mailboxes running (by fleet index), each with its partition and epoch,
// and when each running mailbox was first seen hot in its current run.
type workerStatus struct {
	ID       string          `json:"id"`
	PID      int             `json:"pid"`
	At       time.Time       `json:"at"`
	Idx      []int32         `json:"idx"`
	Part     []int32         `json:"part"`
	Epoch    []int64         `json:"epoch"`
	Tiers    map[string]int  `json:"tiers"`
	HotAt    map[int32]int64 `json:"hot_at"` // unix ns
	Starts   int             `json:"starts"`
	Overlaps int             `json:"overlaps"`
	Version  int             `json:"version"`
	// Failures counts the IMAP runner's failed attempts by kind and op.
	Failures map[string]int `json:"failures"`
}

// freshness is written beside the status every 50 ms: the status of
// Version still holds At.
type freshness struct {
	At      time.Time `json:"at"`
	Version int       `json:"version"`
}

// failureCounter is the IMAP runner's Reporter: it counts failures by
// kind and operation, for the status.
type failureCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (f *failureCounter) SyncFailed(_ context.Context, fl imapsync.Failure) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[string]int{}
	}
	f.n[string(fl.Err.Kind)+"/"+fl.Err.Op]++
}

func (f *failureCounter) DisableRequested(context.Context, imapsync.DisableRequest) {}

func (f *failureCounter) snapshot() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.n))
	for k, v := range f.n {
		out[k] = v
	}
	return out
}

// run is one running mailbox in a worker process.
type run struct {
	part  int32
	epoch int64
	tier  domain.SyncTier
	hotAt int64
}

// tracker wraps the worker's runner and keeps what is running, the way a
// status page would: it is how the parent sees ownership without asking
// the runner (the IMAP runner keeps no such list).
type tracker struct {
	inner    mailsync.Runner
	failures *failureCounter

	mu       sync.Mutex
	running  map[int32]*run
	starts   int
	overlaps int
	version  int
}

func (tr *tracker) Run(ctx context.Context, job *mailsync.Job) error {
	idx, ok := mailboxIndex(job.Mailbox.MailboxID)
	if !ok {
		return fmt.Errorf("mailbox %s is not of the rehearsal", job.Mailbox.MailboxID)
	}
	r := &run{part: job.Partition, epoch: job.Epoch}
	tr.mu.Lock()
	if tr.running == nil {
		tr.running = map[int32]*run{}
	}
	if _, dup := tr.running[idx]; dup {
		tr.overlaps++
	}
	tr.running[idx] = r
	tr.starts++
	tr.version++
	tr.mu.Unlock()
	defer func() {
		tr.mu.Lock()
		if tr.running[idx] == r {
			delete(tr.running, idx)
		}
		tr.version++
		tr.mu.Unlock()
	}()
	// Watch the tier: the time a mailbox turns hot is the far end of the
	// user.active -> hot latency.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for {
			t, changed := job.Tier()
			tr.mu.Lock()
			if r.tier != t {
				r.tier = t
				if t == domain.SyncTierHot && r.hotAt == 0 {
					r.hotAt = time.Now().UnixNano()
				}
				tr.version++
			}
			tr.mu.Unlock()
			select {
			case <-changed:
			case <-wctx.Done():
				return
			}
		}
	}()
	return tr.inner.Run(ctx, job)
}

func (tr *tracker) status(id string) (workerStatus, int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	s := workerStatus{ID: id, PID: os.Getpid(), At: time.Now(), Tiers: map[string]int{}, HotAt: map[int32]int64{},
		Starts: tr.starts, Overlaps: tr.overlaps, Version: tr.version, Failures: tr.failures.snapshot()}
	s.Idx = make([]int32, 0, len(tr.running))
	s.Part = make([]int32, 0, len(tr.running))
	s.Epoch = make([]int64, 0, len(tr.running))
	for idx, r := range tr.running {
		s.Idx = append(s.Idx, idx)
		s.Part = append(s.Part, r.part)
		s.Epoch = append(s.Epoch, r.epoch)
		s.Tiers[string(r.tier)]++
		if r.hotAt != 0 {
			s.HotAt[idx] = r.hotAt
		}
	}
	return s, tr.version
}

func (tr *tracker) currentVersion() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.version
}

func writeAtomic(path string, b []byte) {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err == nil {
		_ = os.Rename(tmp, path)
	}
}

func mailboxID(i int) string { return fmt.Sprintf("0190a1b2-c3d4-7e5f-8a9b-%012x", i) }
func userID(i int) string    { return fmt.Sprintf("0190a1b2-0000-7000-9000-%012x", i) }

func mailboxIndex(id string) (int32, bool) {
	if len(id) != 36 {
		return 0, false
	}
	n, err := strconv.ParseInt(id[24:], 16, 32)
	return int32(n), err == nil
}

func keyring() *sealing.Keyring {
	key, err := hex.DecodeString(os.Getenv(envKey))
	if err != nil {
		log.Fatalf("rehearsal key: %v", err)
	}
	kr, err := sealing.NewKeyring(keyID, map[string][]byte{keyID: key})
	if err != nil {
		log.Fatal(err)
	}
	return kr
}

func envDur(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}

// workerMain is a sync worker process: the real mailsync worker with the
// runner the parent asks for (imap: the real IMAP runner; recording: the
// recording runner, a start and a stop row through the fence per run),
// until SIGTERM or SIGKILL.
func workerMain() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	raiseNoFile()
	cfg, err := pgxpool.ParseConfig(os.Getenv(envDB))
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxConns = 16 // MAILPLANE_PG_RUNNER_CONNS' default
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	id := os.Getenv(envID)
	level := slog.LevelWarn
	if l := os.Getenv(envLogLevel); l != "" {
		if err := level.UnmarshalText([]byte(l)); err != nil {
			log.Fatalf("%s: %v", envLogLevel, err)
		}
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("worker", id)
	// The memory limit a sync role sets by default (MAILPLANE_SYNC_MEMORY_LIMIT=auto).
	spec, err := memlimit.Parse("auto")
	if err != nil {
		log.Fatal(err)
	}
	memlimit.Apply(spec, logger)
	var inner mailsync.Runner
	failures := &failureCounter{}
	switch os.Getenv(envRunner) {
	case "imap":
		inner, err = imapsync.New(imapsync.Config{Keyring: keyring(), Logger: logger, Registerer: prometheus.NewRegistry(), Reporter: failures,
			Transport: domain.MustTransportPolicy("127.0.0.0/8")})
		if err != nil {
			log.Fatal(err)
		}
	default:
		inner = &mailsync.RecordingRunner{NoWrites: os.Getenv(envNoWrites) == "1",
			NewestMail: func(domain.MailboxStateRecord) (time.Time, bool) { return time.Time{}, true }}
	}
	tr := &tracker{inner: inner, failures: failures}
	rate, err := strconv.ParseFloat(os.Getenv(envRate), 64)
	if err != nil {
		rate = 50
	}
	session := envDur(envSession, 6*time.Second)
	w, err := mailsync.New(kafka.Config{Brokers: kafka.ParseBrokers(os.Getenv(envBrokers)), ClientID: "sync-" + id}, pool, tr, mailsync.Config{
		WorkerID:           id,
		SessionTimeout:     session,
		HeartbeatInterval:  session / 12,
		ConnectRatePerHost: rate,
		// No scheduled poll falls inside the rehearsal: every login it
		// counts comes from an ownership change (or a hot IDLE session).
		PollWarm:          30 * time.Minute,
		PollCold:          time.Hour,
		TierEvaluateEvery: 5 * time.Second,
		Logger:            logger,
		Registerer:        prometheus.NewRegistry(),
	})
	if err != nil {
		log.Fatal(err)
	}
	path := os.Getenv(envStatus)
	go func() {
		last, wrote := -1, time.Time{}
		for {
			// A status of 100,000 entries is about 2 MB: written at most
			// every 200 ms and only when it changed; the small freshness
			// file says every 50 ms that it still holds.
			v := tr.currentVersion()
			// Every 5 s regardless: the failure counts change without
			// a new version.
			if (v != last && time.Since(wrote) >= 200*time.Millisecond) || time.Since(wrote) >= 5*time.Second {
				s, sv := tr.status(id)
				b, _ := json.Marshal(s)
				writeAtomic(path, b)
				last, wrote, v = sv, time.Now(), sv
			}
			if v == last {
				b, _ := json.Marshal(freshness{At: time.Now(), Version: last})
				writeAtomic(path+".at", b)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	if os.Getenv(envPprof) == "1" {
		at := path + ".pprof"
		if dir := os.Getenv(envOut); dir != "" {
			at = filepath.Join(dir, id+".pprof")
		}
		servePprof(at)
	}
	fmt.Println(workerUp)
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
	os.Exit(0)
}

// raiseNoFile lifts RLIMIT_NOFILE to the hard limit: every hot mailbox and
// every poll in flight is a socket.
func raiseNoFile() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	rl.Cur = rl.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl)
	return rl.Cur
}

// servePprof serves net/http/pprof on a loopback port written to file,
// with the block and mutex profiles on: what an ownership change waits on
// is what the rehearsal is there to find.
func servePprof(file string) {
	runtime.SetBlockProfileRate(int(time.Millisecond))
	runtime.SetMutexProfileFraction(10)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	writeAtomic(file, []byte(ln.Addr().String()))
	go func() { _ = http.Serve(ln, nil) }()
}

// brokerMain is the rehearsal's broker process: the embedded kfake broker
// in a process of its own, as a broker is in production, so that its
// sockets and CPU are not the IMAP server's (at 100,000 mailboxes the
// login wave filled the parent's file table and the broker stopped
// accepting connections). It runs until SIGTERM.
func brokerMain(addrFile string) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	raiseNoFile()
	emb, err := kafka.StartEmbedded(kafka.WithPort(0), kafka.WithKfakeOptions(kfake.GroupMinSessionTimeout(100*time.Millisecond)))
	if err != nil {
		log.Fatal(err)
	}
	writeAtomic(addrFile, []byte(strings.Join(emb.Addrs(), ",")))
	<-ctx.Done()
	emb.Close()
	os.Exit(0)
}
