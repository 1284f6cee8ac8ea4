package mailsync_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/topics"
)

// migrate applies the migrations.
func migrate(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
}

// env is one test's broker, schema and producer.
type env struct {
	t       testing.TB
	cluster *kfake.Cluster
	kcfg    kafka.Config
	db      *pgtest.DB
	prod    *kgo.Client
	parts   int32
	// runners, when set, is the pool members write through instead of
	// db.Pool (see withRunnerPool).
	runners *pgxpool.Pool
}

// withRunnerPool gives the members started from now on a pool of n
// connections, as a sync process has (MAILPLANE_PG_RUNNER_CONNS, 16 by
// default), rather than the test pool's four: stopping dozens of
// recording runners, each writing its stop row, then takes what it takes
// in production, not a queue on four connections.
func (e *env) withRunnerPool(n int32) {
	e.t.Helper()
	cfg, err := pgxpool.ParseConfig(e.db.URL)
	if err != nil {
		e.t.Fatal(err)
	}
	cfg.MaxConns = n
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(pool.Close)
	e.runners = pool
}

// newEnv starts an embedded broker on a free port with the catalog applied
// (parts partitions for mailbox.state and sync.tier), and a migrated
// schema.
func newEnv(t testing.TB, parts int32) *env {
	t.Helper()
	emb, err := kafka.StartEmbedded(kafka.WithPort(0), kafka.WithKfakeOptions(kfake.GroupMinSessionTimeout(100*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Close)
	e := &env{t: t, cluster: emb.Cluster, kcfg: kafka.Config{Brokers: emb.Addrs()}, db: pgtest.New(t), parts: parts}
	migrate(t, e.db.Pool)
	prod, err := kafka.NewProducer(e.kcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	e.prod = prod
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := topics.Apply(ctx, prod, topics.Catalog(topics.Config{StatePartitions: parts})); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) produce(recs ...*kgo.Record) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(recs) > 0 {
		n := min(len(recs), 5000)
		if err := e.prod.ProduceSync(ctx, recs[:n]...).FirstErr(); err != nil {
			e.t.Fatal(err)
		}
		recs = recs[n:]
	}
}

// fixture makes mailboxes and events from a fixed seed.
type fixture struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func newFixture(seed uint64) *fixture {
	return &fixture{rng: rand.New(rand.NewPCG(seed, seed^0x5deece66d))}
}

func (f *fixture) uuid() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b [16]byte
	for i := range b {
		b[i] = byte(f.rng.UintN(256))
	}
	u, _ := uuid.FromBytes(b[:])
	u[6] = (u[6] & 0x0f) | 0x40
	u[8] = (u[8] & 0x3f) | 0x80
	return u.String()
}

// mailbox returns a live mailbox of user (a fresh user if empty), added
// addedAgo ago.
func (f *fixture) mailbox(user string, addedAgo time.Duration) domain.MailboxStateRecord {
	if user == "" {
		user = f.uuid()
	}
	id := f.uuid()
	return domain.MailboxStateRecord{
		MailboxID: id, OrgID: f.uuid(), UserID: user,
		Address:  "box-" + id[:8] + "@example.com",
		Provider: domain.ProviderSMTPIMAP,
		IMAP: domain.IMAPEndpoint{Host: fmt.Sprintf("imap%d.example.com", len(id)%3), Port: 993,
			TLS: domain.TLSImplicit, Username: "u-" + id[:8]},
		SealedCredentials: &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAAAAAAAAAAAAAA", Ciphertext: "c2VhbGVk"},
		Enabled:           true,
		AddedAt:           time.Now().Add(-addedAgo).UTC().Truncate(time.Millisecond),
		SourceEventID:     domain.NewEventID(),
	}
}

func stateRecord(t testing.TB, m domain.MailboxStateRecord) *kgo.Record {
	t.Helper()
	r, err := mailboxstate.Record(topics.MailboxState, m, m.AddedAt)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func stateRecords(t testing.TB, ms ...domain.MailboxStateRecord) []*kgo.Record {
	out := make([]*kgo.Record, len(ms))
	for i, m := range ms {
		out[i] = stateRecord(t, m)
	}
	return out
}

func userActive(t testing.TB, user string, at time.Time) *kgo.Record {
	t.Helper()
	r, err := topics.Encode(domain.Event{ID: domain.NewEventID(), Type: domain.TypeUserActive, Source: "mailplane/test",
		Time: at, Subject: user, Data: &domain.UserActive{UserID: user, Source: domain.ActivityWSPing}})
	if err != nil {
		t.Fatal(err)
	}
	r.Timestamp = at // as mailplane's producer stamps it: sessions run on it
	return r
}

// testConfig gives quick group timings.
func testConfig(t testing.TB, id string) mailsync.Config {
	return mailsync.Config{
		WorkerID:          id,
		SessionTimeout:    2 * time.Second,
		HeartbeatInterval: 200 * time.Millisecond,
		RebalanceTimeout:  10 * time.Second,
		Logger:            mailplanetest.Logger(t).With("test_worker", id),
		Registerer:        prometheus.NewRegistry(),
	}
}

// member is a worker running in the test's process.
type member struct {
	w    *mailsync.Worker
	rec  *mailsync.RecordingRunner
	reg  *prometheus.Registry
	stop func()
	done chan struct{}
}

func (e *env) start(cfg mailsync.Config, rec *mailsync.RecordingRunner) *member {
	e.t.Helper()
	if rec == nil {
		rec = &mailsync.RecordingRunner{}
	}
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	kcfg := e.kcfg
	kcfg.ClientID = "sync-" + cfg.WorkerID
	pool := e.db.Pool
	if e.runners != nil {
		pool = e.runners
	}
	w, err := mailsync.New(kcfg, pool, rec, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{w: w, rec: rec, reg: reg, done: make(chan struct{})}
	errc := make(chan error, 1)
	go func() { errc <- w.Run(ctx); close(m.done) }()
	var once sync.Once
	m.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					e.t.Errorf("Run: %v", err)
				}
			case <-time.After(60 * time.Second):
				e.t.Errorf("worker %s did not stop 60s after cancel", cfg.WorkerID)
			}
		})
	}
	e.t.Cleanup(m.stop)
	return m
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s (last: %s)", timeout, what, last)
}

// running merges the running mailboxes of members; dup lists mailboxes
// running on more than one.
func running(ms ...*member) (all map[string]mailsync.RunInfo, dup []string) {
	all = map[string]mailsync.RunInfo{}
	for _, m := range ms {
		for id, info := range m.rec.Running() {
			if _, ok := all[id]; ok {
				dup = append(dup, id)
			}
			all[id] = info
		}
	}
	return all, dup
}

// epochs returns the current epoch of every partition.
func epochs(t testing.TB, pool *pgxpool.Pool) map[int32]int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT partition, epoch FROM sync_partitions`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var e int64
		if err := rows.Scan(&p, &e); err != nil {
			t.Fatal(err)
		}
		out[p] = e
	}
	return out
}

// exactlyOnce checks that the live mailboxes are running, each exactly
// once, each at its partition's current epoch, and nothing else runs.
func exactlyOnce(t testing.TB, pool *pgxpool.Pool, live map[string]bool, ms ...*member) (bool, string) {
	all, dup := running(ms...)
	if len(dup) > 0 {
		return false, fmt.Sprintf("%d mailboxes run twice, e.g. %s", len(dup), dup[0])
	}
	var missing, extra []string
	for id := range live {
		if _, ok := all[id]; !ok {
			missing = append(missing, id)
		}
	}
	for id := range all {
		if !live[id] {
			extra = append(extra, id)
		}
	}
	if len(missing) > 0 || len(extra) > 0 {
		return false, fmt.Sprintf("%d live mailboxes not running, %d running that are not live", len(missing), len(extra))
	}
	ep := epochs(t, pool)
	for id, info := range all {
		if ep[info.Partition] != info.Epoch {
			return false, fmt.Sprintf("mailbox %s runs at epoch %d of partition %d, current %d", id, info.Epoch, info.Partition, ep[info.Partition])
		}
	}
	return true, ""
}

// staleWrites counts writes that landed at an epoch after a later epoch of
// their partition had been taken: zero, if fencing works.
func staleWrites(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `
SELECT count(*) FROM sync_recorder_writes w
WHERE EXISTS (SELECT 1 FROM sync_partition_epochs h
              WHERE h.partition = w.partition AND h.epoch > w.epoch AND h.acquired_at <= w.written_at)`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// counterValue sums a metric's series: counter and gauge values, histogram
// sample counts.
func counterValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

func ids(ms []domain.MailboxStateRecord) map[string]bool {
	out := map[string]bool{}
	for _, m := range ms {
		out[m.MailboxID] = true
	}
	return out
}

// percentile of sorted durations.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p*float64(len(s)) + 0.5)
	return s[min(max(i-1, 0), len(s)-1)]
}
