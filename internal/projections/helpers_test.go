package projections_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/topics"
)

// broker is an in-process kfake broker (short group sessions keep restarts
// quick), or the real one in MAILPLANE_TEST_BROKERS, with the catalog in a
// namespace of the test's own.
func broker(t testing.TB) kafka.Config {
	t.Helper()
	c := kafkatest.Config(t, 4)
	c.ClientID = "projections-test"
	return c
}

// env is one test's broker, schema and producer.
type env struct {
	t    testing.TB
	kcfg kafka.Config
	db   *pgtest.DB
	prod *kgo.Client
}

func newEnv(t testing.TB) *env {
	t.Helper()
	e := &env{t: t, kcfg: broker(t), db: pgtest.New(t)}
	migrate(t, e.db.Pool)
	prod, err := kafka.NewProducer(e.kcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	e.prod = prod
	return e
}

func migrate(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
}

// testGroup gives quick group timings.
var testGroup = kafka.GroupConfig{SessionTimeout: kafkatest.SessionTimeout(2 * time.Second), HeartbeatInterval: 200 * time.Millisecond}

// projector builds a projector with a fresh registry of metrics.
func (e *env) projector(pool *pgxpool.Pool, proj projections.Projection, opts ...projections.Option) (*projections.Projector, *prometheus.Registry) {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	base := []projections.Option{
		projections.WithRegisterer(reg),
		projections.WithLogger(mailplanetest.Logger(e.t)),
		projections.WithGroup(testGroup),
	}
	p, err := projections.New(e.kcfg, pool, proj, append(base, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	return p, reg
}

// start runs p until the returned stop (also a cleanup) is called.
func start(t testing.TB, p *projections.Projector) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return 30s after cancel")
		}
	}
	t.Cleanup(stop)
	return stop
}

// produce encodes and produces events, returning the produced records (with
// partitions and offsets).
func (e *env) produce(events ...domain.Event) []*kgo.Record {
	e.t.Helper()
	recs := make([]*kgo.Record, len(events))
	for i, ev := range events {
		r, err := topics.Encode(ev)
		if err != nil {
			e.t.Fatalf("encode %s: %v", ev.Type, err)
		}
		recs[i] = r
	}
	e.produceRaw(recs...)
	return recs
}

// produceRaw produces recs, those named by the catalog into the test's
// namespace.
func (e *env) produceRaw(recs ...*kgo.Record) {
	e.t.Helper()
	kafkatest.InNamespace(e.kcfg, recs...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(recs) > 0 {
		n := min(len(recs), 1000)
		if err := e.prod.ProduceSync(ctx, recs[:n]...).FirstErr(); err != nil {
			e.t.Fatal(err)
		}
		recs = recs[n:]
	}
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, last)
}

type tp struct {
	topic     string
	partition int32
}

// endOffsets lists the end offsets of the catalog topics names in kcfg's
// namespace, keyed by catalog name.
func endOffsets(t testing.TB, kcfg kafka.Config, names []string) map[tp]int64 {
	t.Helper()
	names = kcfg.Namespace.Topics(names...)
	cl, err := kafka.NewClient(kafka.Config{Brokers: kcfg.Brokers}, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, names...)
	if err != nil {
		t.Fatal(err)
	}
	out := map[tp]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		base, _ := kcfg.Namespace.Base(o.Topic)
		out[tp{base, o.Partition}] = o.Offset
	})
	return out
}

func pgOffsets(ctx context.Context, pool *pgxpool.Pool, projector string) (map[tp]int64, error) {
	rows, err := pool.Query(ctx, `SELECT topic, partition, next_offset FROM projector_offsets WHERE projector = $1`, projector)
	if err != nil {
		return nil, err
	}
	out := map[tp]int64{}
	var (
		topic string
		part  int32
		next  int64
	)
	_, err = pgx.ForEachRow(rows, []any{&topic, &part, &next}, func() error {
		out[tp{topic, part}] = next
		return nil
	})
	return out, err
}

// waitCaughtUp waits until the projector's Postgres offsets reach the end
// of every non-empty partition of its topics.
func waitCaughtUp(t testing.TB, kcfg kafka.Config, pool *pgxpool.Pool, projector string, names []string, timeout time.Duration) {
	t.Helper()
	ends := endOffsets(t, kcfg, names)
	waitFor(t, timeout, "projector to catch up", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		pg, err := pgOffsets(ctx, pool, projector)
		if err != nil {
			return false, err
		}
		for k, end := range ends {
			if end > 0 && pg[tp{kcfg.Topic(k.topic), k.partition}] != end {
				return false, fmt.Errorf("%s[%d] at %d of %d", k.topic, k.partition, pg[k], end)
			}
		}
		return true, nil
	})
}

// registryChecksum hashes every row of the registry tables, in key order.
func registryChecksum(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sum string
	err := pool.QueryRow(ctx, `SELECT concat_ws('/',
		(SELECT md5(coalesce(string_agg(m::text, '|' ORDER BY mailbox_id), '')) FROM mailboxes m),
		(SELECT md5(coalesce(string_agg(o::text, '|' ORDER BY org_id), '')) FROM orgs o),
		(SELECT md5(coalesce(string_agg(u::text, '|' ORDER BY user_id), '')) FROM users u),
		(SELECT md5(coalesce(string_agg(w::text, '|' ORDER BY worker_id), '')) FROM workers w))`).Scan(&sum)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

func registryCounts(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var m, o, u, w int
	err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM mailboxes), (SELECT count(*) FROM orgs),
		(SELECT count(*) FROM users), (SELECT count(*) FROM workers)`).Scan(&m, &o, &u, &w)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("mailboxes=%d orgs=%d users=%d workers=%d", m, o, u, w)
}

func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// settledCounter returns a counter once it reaches want, or after a few
// seconds: a transaction's counters move just after its commit, which is
// what waitCaughtUp sees.
func settledCounter(t testing.TB, reg *prometheus.Registry, want float64, name string, labels ...string) float64 {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := counter(t, reg, name, labels...)
		if got >= want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func counter(t testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
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
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
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

// gen makes valid domain events deterministically (aggregate ids and times
// come from the seed; event ids are fresh UUIDv7s).
type gen struct {
	rng       *rand.Rand
	t0        time.Time
	n         int
	mailboxes []string
	orgs      []string
	users     []string
	workers   []string
}

func newGen(seed uint64, keys int) *gen {
	g := &gen{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), t0: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	for range keys {
		g.mailboxes = append(g.mailboxes, g.uuid())
		g.orgs = append(g.orgs, g.uuid())
		g.users = append(g.users, g.uuid())
		g.workers = append(g.workers, g.uuid())
	}
	return g
}

func (g *gen) uuid() string {
	var b [16]byte
	for i := range b {
		b[i] = byte(g.rng.UintN(256))
	}
	u, _ := uuid.FromBytes(b[:])
	u[6] = (u[6] & 0x0f) | 0x40
	u[8] = (u[8] & 0x3f) | 0x80
	return u.String()
}

func (g *gen) pick(xs []string) string { return xs[g.rng.IntN(len(xs))] }

// event wraps d with a fresh id and the next tick of the generator's clock.
func (g *gen) event(d domain.Data) domain.Event {
	g.n++
	return domain.Event{
		ID: domain.NewEventID(), Type: d.EventType(), Source: "mailplane/test",
		Time: g.t0.Add(time.Duration(g.n) * time.Millisecond), Subject: d.AggregateID(), Data: d,
	}
}

func sealed() *domain.SealedSecret {
	return &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAAAAAAAAAAAAAA", Ciphertext: "c2VhbGVk"}
}

func (g *gen) added(mailbox string) domain.Event {
	return g.event(&domain.MailboxAdded{
		MailboxID: mailbox, OrgID: g.pick(g.orgs), UserID: g.pick(g.users),
		Address:       fmt.Sprintf("box%d@example.com", g.rng.IntN(1_000_000)),
		Provider:      []domain.Provider{domain.ProviderSMTPIMAP, domain.ProviderGmail, domain.ProviderOutlook}[g.rng.IntN(3)],
		WarmupEnabled: g.rng.IntN(2) == 0,
		IMAP: domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit,
			Username: fmt.Sprintf("user%d", g.rng.IntN(1000))},
		SealedCredentials: sealed(),
	})
}

// next returns a random valid event of any of the seven types.
func (g *gen) next() domain.Event {
	switch g.rng.IntN(7) {
	case 0:
		return g.added(g.pick(g.mailboxes))
	case 1:
		return g.event(&domain.MailboxRemoved{MailboxID: g.pick(g.mailboxes), Reason: "user deleted it"})
	case 2:
		states := []domain.HealthState{domain.HealthHealthy, domain.HealthWatch, domain.HealthThrottled, domain.HealthQuarantined, domain.HealthBlocked}
		var until *time.Time
		if g.rng.IntN(2) == 0 {
			u := g.t0.Add(time.Duration(g.rng.IntN(100)) * time.Hour)
			until = &u
		}
		return g.event(&domain.MailboxHealthScored{MailboxID: g.pick(g.mailboxes), State: states[g.rng.IntN(len(states))],
			Score: float64(g.rng.IntN(10000)) / 100, Reason: "bounces", Until: until})
	case 3:
		plans := []domain.Plan{domain.PlanFree, domain.PlanPremium, domain.PlanDedicated}
		return g.event(&domain.OrgPlanChanged{OrgID: g.pick(g.orgs), Plan: plans[g.rng.IntN(3)],
			DedicatedWorkers: g.rng.IntN(4), Paid: g.rng.IntN(2) == 0, Source: fmt.Sprintf("billing-%d", g.rng.IntN(1e6))})
	case 4:
		ev := g.event(&domain.UserActive{UserID: g.pick(g.users),
			Source: []domain.ActivitySource{domain.ActivityLogin, domain.ActivityWSConnect, domain.ActivityWSPing}[g.rng.IntN(3)]})
		// Activity arrives out of time order now and then.
		ev.Time = ev.Time.Add(-time.Duration(g.rng.IntN(5000)) * time.Millisecond)
		return ev
	case 5:
		tiers := []domain.Tier{"", domain.TierSharedFree, domain.TierSharedPremium}
		egress := []domain.Egress{domain.EgressColdSMTP, domain.EgressOAuthAPI, domain.EgressWarmupOnly}
		return g.event(&domain.WorkerHeartbeat{WorkerID: g.pick(g.workers), Tier: tiers[g.rng.IntN(3)],
			Egress: egress[g.rng.IntN(3)], Address: fmt.Sprintf("10.0.0.%d:25", g.rng.IntN(255)), Stopping: g.rng.IntN(10) == 0})
	default:
		return g.event(&domain.WorkerHealthSampled{WorkerID: g.pick(g.workers), WindowSeconds: 3600,
			Sends: int64(g.rng.IntN(1000)), HardBounces: int64(g.rng.IntN(10)), Complaints: int64(g.rng.IntN(3))})
	}
}

func (g *gen) events(n int) []domain.Event {
	out := make([]domain.Event, n)
	for i := range out {
		out[i] = g.next()
	}
	return out
}

// must fails the test on err.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// newDB is a fresh migrated schema.
func newDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	db := pgtest.New(t)
	migrate(t, db.Pool)
	return db.Pool
}

func withGroupName(g kafka.GroupConfig, name string) kafka.GroupConfig {
	g.Group = name
	return g
}
