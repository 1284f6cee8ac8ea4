package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/health"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/internal/rebuild"
	"github.com/mailplane/mailplane/topics"
)

// env is one test's broker, live schema and producer.
type env struct {
	t    *testing.T
	kcfg kafka.Config
	db   *pgtest.DB
	prod *kgo.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	kcfg := kafkatest.Config(t, 4)
	kcfg.ClientID = "rebuild-test"
	e := &env{t: t, kcfg: kcfg, db: pgtest.New(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := migrations.Apply(ctx, e.db.Pool); err != nil {
		t.Fatal(err)
	}
	// Record timestamps are the events' (past) times: no delivery
	// timeout, which kgo counts from them.
	prod, err := kafka.NewProducer(e.kcfg, kgo.RecordDeliveryTimeout(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	e.prod = prod
	return e
}

func (e *env) produce(evs ...domain.Event) {
	e.t.Helper()
	recs := make([]*kgo.Record, len(evs))
	for i, ev := range evs {
		r, err := topics.Encode(ev)
		if err != nil {
			e.t.Fatal(err)
		}
		r.Timestamp = ev.Time
		recs[i] = r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.prod.ProduceSync(ctx, kafkatest.InNamespace(e.kcfg, recs...)...).FirstErr(); err != nil {
		e.t.Fatal(err)
	}
}

// startLive runs the live projector of proj on the live schema until the
// test ends.
func (e *env) startLive(proj projections.Projection) {
	e.t.Helper()
	p, err := projections.New(e.kcfg, e.db.Pool, proj,
		projections.WithGroup(kafka.GroupConfig{SessionTimeout: kafkatest.SessionTimeout(2 * time.Second), HeartbeatInterval: 200 * time.Millisecond}),
		projections.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			e.t.Errorf("live projector: %v", err)
		}
	})
}

// ends are the end offsets of every partition of the catalog topics names,
// in the test's namespace, keyed "topic/partition" with the namespaced name.
func (e *env) ends(names ...string) map[string]int64 {
	e.t.Helper()
	names = e.kcfg.Namespace.Topics(names...)
	adm, err := kafka.NewAdmin(e.kcfg)
	if err != nil {
		e.t.Fatal(err)
	}
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lo, err := adm.ListEndOffsets(ctx, names...)
	if err == nil {
		err = lo.Error()
	}
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]int64{}
	lo.Each(func(o kadm.ListedOffset) { out[fmt.Sprintf("%s/%d", o.Topic, o.Partition)] = o.Offset })
	return out
}

// waitLive waits until the live projector of name stands at the end of
// every partition of its topics.
func (e *env) waitLive(name string, names []string) {
	e.t.Helper()
	want := e.ends(names...)
	deadline := time.Now().Add(30 * time.Second)
	for {
		rows, _ := e.db.Pool.Query(context.Background(), `SELECT topic, partition, next_offset FROM projector_offsets WHERE projector = $1`, name)
		have := map[string]int64{}
		var (
			topic string
			part  int32
			next  int64
		)
		_, err := pgx.ForEachRow(rows, []any{&topic, &part, &next}, func() error { have[fmt.Sprintf("%s/%d", topic, part)] = next; return nil })
		if err != nil {
			e.t.Fatal(err)
		}
		caught := true
		for p, end := range want {
			if end > 0 && have[p] != end {
				caught = false
			}
		}
		if caught {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the live %s projector did not catch up: at %v, ends %v", name, have, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) count(sql string, args ...any) int64 {
	e.t.Helper()
	var n int64
	if err := e.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// gen makes a realistic event stream from a fixed seed.
type gen struct {
	rng *rand.Rand
	t0  time.Time
	n   int
}

func newGen(seed uint64) *gen {
	return &gen{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), t0: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func id(kind, i int) string { return fmt.Sprintf("0000000%d-0000-4000-8000-%012x", kind, i) }

func (g *gen) event(d domain.Data) domain.Event {
	g.n++
	return domain.Event{ID: domain.NewEventID(), Type: d.EventType(), Source: "mailplane/test",
		Time: g.t0.Add(time.Duration(g.n) * time.Second), Subject: d.AggregateID(), Data: d}
}

func (g *gen) added(mailbox string) domain.Event {
	return g.event(&domain.MailboxAdded{MailboxID: mailbox, OrgID: id(3, g.rng.IntN(4)), UserID: id(4, g.rng.IntN(6)),
		Address: fmt.Sprintf("box%d@example.com", g.rng.IntN(1_000_000)), Provider: domain.ProviderSMTPIMAP, WarmupEnabled: g.rng.IntN(2) == 0,
		IMAP:              domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit, Username: fmt.Sprintf("user%d", g.rng.IntN(1000))},
		SealedCredentials: &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAAAAAAAAAAAAAA", Ciphertext: "c2VhbGVk"}})
}

// scored is a health score of mailbox; every other one (by score) carries
// evidence, so the registry's evidence is both written and cleared.
func (g *gen) scored(mailbox string, score int) *domain.MailboxHealthScored {
	d := &domain.MailboxHealthScored{MailboxID: mailbox, State: domain.HealthWatch, Score: float64(score), Reason: "bounces"}
	if score%2 == 0 {
		end := g.t0.Add(time.Duration(g.n) * time.Second)
		junk := int64(score / 4)
		d.Evidence = &domain.HealthEvidence{WindowSeconds: 7 * 86400, WindowEnd: &end, Inbox: 100 - junk, Junk: junk, MinObservations: 20,
			Rate: float64(junk) / 100, Rule: domain.HealthRuleLevel, Threshold: &domain.HealthThreshold{Rate: 0.1, State: domain.HealthWatch}}
	}
	return d
}

// registry is n events of every type the registry folds, on 12
// mailboxes, 4 orgs, 6 users and 5 workers, with duplicates (a producer's
// retry) now and then.
func (g *gen) registry(n int) []domain.Event {
	var out []domain.Event
	for i := range 12 {
		out = append(out, g.added(id(2, i)))
	}
	for len(out) < n {
		var ev domain.Event
		switch g.rng.IntN(7) {
		case 0:
			ev = g.added(id(2, g.rng.IntN(12)))
		case 1:
			ev = g.event(&domain.MailboxRemoved{MailboxID: id(2, g.rng.IntN(12)), Reason: "user deleted it"})
		case 2:
			ev = g.event(g.scored(id(2, g.rng.IntN(12)), g.rng.IntN(100)))
		case 3:
			ev = g.event(&domain.OrgPlanChanged{OrgID: id(3, g.rng.IntN(4)), Plan: domain.PlanPremium, DedicatedWorkers: g.rng.IntN(3), Paid: true, Source: fmt.Sprintf("billing-%d", g.rng.IntN(1e6))})
		case 4:
			ev = g.event(&domain.UserActive{UserID: id(4, g.rng.IntN(6)), Source: domain.ActivityLogin})
			ev.Time = ev.Time.Add(-time.Duration(g.rng.IntN(5000)) * time.Millisecond)
		case 5:
			ev = g.event(&domain.WorkerHeartbeat{WorkerID: id(1, g.rng.IntN(5)), Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP,
				Address: fmt.Sprintf("10.0.0.%d:25", g.rng.IntN(255))})
		default:
			ev = g.event(&domain.WorkerHealthSampled{WorkerID: id(1, g.rng.IntN(5)), WindowSeconds: 3600, Sends: int64(g.rng.IntN(1000)), HardBounces: int64(g.rng.IntN(10))})
		}
		out = append(out, ev)
		if g.rng.IntN(20) == 0 {
			out = append(out, ev) // the same event again
		}
	}
	return out
}

// observations is n warmup observations of 6 sending mailboxes, half of
// them landing in junk often enough to change their state.
func (g *gen) observations(n int) []domain.Event {
	var out []domain.Event
	for i := range n {
		m := g.rng.IntN(6)
		p := domain.PlacedInbox
		if m%2 == 1 && g.rng.IntN(3) > 0 {
			p = domain.PlacedJunk
		}
		at := g.t0.Add(time.Duration(i) * time.Minute)
		out = append(out, domain.Event{ID: domain.NewEventID(), Type: domain.TypeWarmupObserved, Source: "test", Time: at, Subject: id(2, m),
			Data: &domain.WarmupObserved{MailboxID: id(2, m), WarmupID: fmt.Sprintf("w-%d", i), Placement: p, LandedAt: at,
				Source: domain.ObservedBySync, RecipientMailboxID: id(2, 99)}})
	}
	return out
}

// scenario is one projection's part of the tests.
type scenario struct {
	name   string
	live   func(t *testing.T) projections.Projection
	spec   func(t *testing.T) rebuild.Spec
	stream func(g *gen) []domain.Event
	// more is a few events more.
	more func(g *gen) []domain.Event
	// later is one event naming key, applied after the swap; table holds
	// its row.
	later func(g *gen, key string) domain.Event
	table string
	// alter changes one live row by hand.
	alter string
}

var scenarios = []scenario{{
	name:   "registry",
	live:   func(*testing.T) projections.Projection { return projections.NewRegistry() },
	spec:   func(*testing.T) rebuild.Spec { return rebuild.RegistrySpec() },
	stream: func(g *gen) []domain.Event { return g.registry(400) },
	more:   func(g *gen) []domain.Event { return g.registry(30) },
	later:  func(g *gen, key string) domain.Event { return g.added(key) },
	table:  "mailboxes",
	alter:  `UPDATE mailboxes SET address = 'drifted@example.com' WHERE mailbox_id = (SELECT mailbox_id FROM mailboxes ORDER BY mailbox_id LIMIT 1)`,
}, {
	name: "health",
	live: func(t *testing.T) projections.Projection {
		s, err := health.NewScorer(domain.DefaultHealthPolicy())
		if err != nil {
			t.Fatal(err)
		}
		return s
	},
	spec: func(t *testing.T) rebuild.Spec {
		s, err := rebuild.HealthSpec(domain.DefaultHealthPolicy())
		if err != nil {
			t.Fatal(err)
		}
		return s
	},
	stream: func(g *gen) []domain.Event { return g.observations(300) },
	more:   func(g *gen) []domain.Event { return g.observations(30) },
	later: func(g *gen, key string) domain.Event {
		ev := g.observations(1)[0]
		o := ev.Data.(*domain.WarmupObserved)
		o.MailboxID, ev.Subject = key, key
		return ev
	},
	table: "mailbox_health",
	alter: `UPDATE mailbox_health SET score = score / 2 + 1 WHERE mailbox_id = (SELECT mailbox_id FROM mailbox_health ORDER BY mailbox_id LIMIT 1)`,
}}

// TestRebuildVerifySwapCleanup: for the registry and the health
// projections, a rebuild of a live projection's log verifies equal to it,
// swaps in while its projector runs (which keeps applying new events into
// the swapped-in tables), a second rebuild verifies equal again and finds
// a row altered by hand, and cleanup drops the rebuilds' schemas but no
// schema that only looks like one.
func TestRebuildVerifySwapCleanup(t *testing.T) {
	t.Parallel()
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			e := newEnv(t)
			spec := sc.spec(t)
			names := spec.Projection.Topics()
			e.startLive(sc.live(t))
			g := newGen(7)
			e.produce(sc.stream(g)...)
			e.waitLive(sc.name, names)

			allTopics := make([]string, 0)
			for _, s := range topics.Catalog(topics.Config{}) {
				allTopics = append(allTopics, s.Name)
			}
			before := e.ends(allTopics...)
			var (
				mu      sync.Mutex
				reports []rebuild.Progress
			)
			rb, err := rebuild.Start(ctx, spec, rebuild.Config{Kafka: e.kcfg, Live: e.db.Pool, Schema: e.db.Schema + "_" + sc.name + "_1",
				BatchSize: 7, ProgressEvery: time.Millisecond, Progress: func(p rebuild.Progress) { mu.Lock(); reports = append(reports, p); mu.Unlock() }})
			if err != nil {
				t.Fatal(err)
			}
			defer rb.Close()
			mu.Lock()
			last := reports[len(reports)-1]
			mu.Unlock()
			if !last.Final || last.Fraction() != 1 || last.Records != rb.Records() || rb.Records() == 0 {
				t.Errorf("last progress %+v, records %d", last, rb.Records())
			}
			// Nothing was produced to any topic by the rebuild, and for
			// health nothing was queued to publish, where the live
			// scorer queued its state changes.
			if after := e.ends(allTopics...); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("the rebuild produced records: ends before %v, after %v", before, after)
			}
			if sc.name == "health" {
				if n := e.count(`SELECT count(*) FROM event_outbox`); n == 0 {
					t.Error("the live scorer queued no state change: the stream is too tame to tell")
				}
				if n := e.count(`SELECT count(*) FROM ` + pgx.Identifier{rb.Schema(), "event_outbox"}.Sanitize()); n != 0 {
					t.Errorf("the rebuild queued %d records to publish", n)
				}
			}
			// A running rebuild's schema is not cleanup's to drop.
			if err := rebuild.Drop(ctx, e.db.Pool, rb.Schema()); err == nil || !strings.Contains(err.Error(), "in use") {
				t.Errorf("drop of a running rebuild's schema: %v", err)
			}

			// More events once the rebuild is done: the live projector is
			// ahead, and Verify catches the rebuild up to exactly where it
			// stands.
			e.produce(sc.more(g)...)
			e.waitLive(sc.name, names)
			rep, err := rb.Verify(ctx, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Equal() || len(rep.Positions) == 0 {
				t.Fatalf("rebuild differs from live: %+v", rep)
			}
			if want := e.ends(names...); !positionsAt(rep.Positions, want) {
				t.Errorf("compared at %+v, the topics end at %v", rep.Positions, want)
			}
			for _, tr := range rep.Tables {
				if tr.Table == sc.table && (tr.LiveRows == 0 || tr.Skipped != 0) {
					t.Errorf("%s: %d rows compared, %d skipped", tr.Table, tr.LiveRows, tr.Skipped)
				}
			}

			// Swap while the live projector runs, and is ahead again: the
			// swap catches the rebuild up under its lock. The projector
			// goes on applying new events, into the swapped-in tables.
			e.produce(sc.more(g)...)
			e.waitLive(sc.name, names)
			if err := rb.Swap(ctx); err != nil {
				t.Fatal(err)
			}
			if want := e.ends(names...); !positionsAt(rb.Positions(), want) {
				t.Errorf("swapped in at %+v, the topics end at %v", rb.Positions(), want)
			}
			key := id(2, 500)
			e.produce(sc.later(g, key))
			e.waitLive(sc.name, names)
			if n := e.count(`SELECT count(*) FROM `+pgx.Identifier{e.db.Schema, sc.table}.Sanitize()+` WHERE mailbox_id = $1`, key); n != 1 {
				t.Errorf("the live projector did not apply the new event into the swapped-in %s: %d rows", sc.table, n)
			}
			if n := e.count(`SELECT count(*) FROM `+pgx.Identifier{rb.Schema(), sc.table}.Sanitize()+` WHERE mailbox_id = $1`, key); n != 0 {
				t.Errorf("the new event landed in the previous projection's %s", sc.table)
			}
			if n := e.count(`SELECT count(*) FROM ` + pgx.Identifier{rb.Schema(), sc.table}.Sanitize()); n == 0 {
				t.Errorf("the previous projection's %s is empty", sc.table)
			}

			rb2, err := rebuild.Start(ctx, spec, rebuild.Config{Kafka: e.kcfg, Live: e.db.Pool, Schema: e.db.Schema + "_" + sc.name + "_2"})
			if err != nil {
				t.Fatal(err)
			}
			defer rb2.Close()
			if rep, err := rb2.Verify(ctx, 10*time.Second); err != nil || !rep.Equal() {
				t.Fatalf("after the swap, a rebuild differs from live: %v %+v", err, rep)
			}
			if _, err := e.db.Pool.Exec(ctx, sc.alter); err != nil {
				t.Fatal(err)
			}
			rep, err = rb2.Verify(ctx, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Equal() || rep.Tables[0].OnlyLive != 1 || rep.Tables[0].OnlyRebuilt != 1 || len(rep.Tables[0].Samples) != 2 {
				t.Errorf("verify after a hand edit: %+v", rep.Tables)
			}
			if sc.name == "health" {
				// What the wall-clock ticker does to a row (evaluated
				// later, on no new evidence) is not in the log: that row
				// is skipped, not compared, and said so.
				if _, err := e.db.Pool.Exec(ctx, `UPDATE mailbox_health SET last_eval = last_eval + interval '1 hour', score = 100
WHERE mailbox_id = (SELECT mailbox_id FROM mailbox_health ORDER BY mailbox_id DESC LIMIT 1)`); err != nil {
					t.Fatal(err)
				}
				rep, err = rb2.Verify(ctx, 10*time.Second)
				if err != nil || rep.Tables[0].Skipped != 1 || rep.Tables[0].OnlyLive != 1 || rep.Tables[0].OnlyRebuilt != 1 ||
					!strings.Contains(rep.Tables[0].SkipWhy, "ticker") {
					t.Errorf("verify after a tick: %v %+v", err, rep.Tables)
				}
			}
			rb.Close()
			rb2.Close()

			checkCleanup(t, e, rb.Schema(), rb2.Schema(), sc.name)
		})
	}
}

// checkCleanup: cleanup lists exactly the two rebuild schemas (newest
// first, the swapped one marked previous), keeps the newest with keep 1,
// drops them, and refuses what only looks like a rebuild schema.
func checkCleanup(t *testing.T, e *env, first, second, projection string) {
	ctx := context.Background()
	decoys := map[string]string{
		// The right name, no marker.
		e.db.Schema + "_" + projection + "_97": "",
		// The right name and a marker table of other columns.
		e.db.Schema + "_" + projection + "_98": `CREATE TABLE %s.mailplane_rebuild (id int)`,
		// The right name and a marker naming another schema (a copy).
		e.db.Schema + "_" + projection + "_99": `CREATE TABLE %[1]s.mailplane_rebuild AS SELECT * FROM ` + pgx.Identifier{first, "mailplane_rebuild"}.Sanitize(),
	}
	for name, sql := range decoys {
		id := pgx.Identifier{name}.Sanitize()
		if _, err := e.db.Pool.Exec(ctx, `CREATE SCHEMA `+id); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = e.db.Pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+id+` CASCADE`) })
		if sql != "" {
			if _, err := e.db.Pool.Exec(ctx, fmt.Sprintf(sql, id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	ls, err := rebuild.List(ctx, e.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 2 || ls[0].Schema != second || ls[1].Schema != first || ls[1].State != rebuild.StatePrevious ||
		ls[0].State != rebuild.StateBuilt || ls[0].Projection != projection || ls[0].LiveSchema != e.db.Schema {
		t.Fatalf("cleanup lists %+v, want %s (built) then %s (previous)", ls, second, first)
	}
	drop, keep := rebuild.Pick(ls, 1, 0, time.Now())
	if len(drop) != 1 || drop[0].Schema != first || len(keep) != 1 {
		t.Errorf("keep 1: drop %v keep %v", drop, keep)
	}
	if drop, _ := rebuild.Pick(ls, 0, time.Hour, time.Now()); len(drop) != 0 {
		t.Errorf("--older-than 1h picked schemas made seconds ago: %v", drop)
	}
	for _, l := range ls {
		if err := rebuild.Drop(ctx, e.db.Pool, l.Schema); err != nil {
			t.Fatal(err)
		}
	}
	for name := range decoys {
		if err := rebuild.Drop(ctx, e.db.Pool, name); err == nil {
			t.Errorf("cleanup dropped %s, which holds no marker naming it", name)
		}
	}
	if err := rebuild.Drop(ctx, e.db.Pool, e.db.Schema); err == nil {
		t.Error("cleanup dropped the live schema")
	}
	if n := e.count(`SELECT count(*) FROM pg_namespace WHERE nspname = ANY($1)`, []string{first, second}); n != 0 {
		t.Errorf("%d rebuild schemas left", n)
	}
	for name := range decoys {
		if n := e.count(`SELECT count(*) FROM pg_namespace WHERE nspname = $1`, name); n != 1 {
			t.Errorf("decoy %s is gone", name)
		}
	}
	if n := e.count(`SELECT count(*) FROM ` + pgx.Identifier{e.db.Schema, "projector_offsets"}.Sanitize()); n == 0 {
		t.Error("the live schema lost its rows")
	}
}

// TestVerifyWithoutLiveProjector: with no live projector the live side
// stays behind and verify says where, rather than comparing; a swap is
// refused while a view depends on the tables it moves, then hands the
// live schema the rebuild's rows and positions.
func TestVerifyWithoutLiveProjector(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := newEnv(t)
	e.produce(newGen(3).registry(30)...)
	rb, err := rebuild.Start(ctx, rebuild.RegistrySpec(), rebuild.Config{Kafka: e.kcfg, Live: e.db.Pool})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		rb.Close()
		_ = rebuild.Drop(context.Background(), e.db.Pool, rb.Schema())
	}()
	if !strings.HasPrefix(rb.Schema(), e.db.Schema+"_registry_") {
		t.Errorf("default schema %s", rb.Schema())
	}
	_, err = rb.Verify(ctx, 300*time.Millisecond)
	if !errors.Is(err, rebuild.ErrLiveBehind) || !strings.Contains(err.Error(), "live at offset 0") {
		t.Fatalf("verify with no live projector: %v", err)
	}

	// A view of the live schema over a table the swap would move would
	// go on reading the moved-out table: the swap is refused.
	if _, err := e.db.Pool.Exec(ctx, `CREATE VIEW my_report AS SELECT count(*) AS n FROM mailboxes`); err != nil {
		t.Fatal(err)
	}
	if err := rb.Swap(ctx); err == nil || !strings.Contains(err.Error(), "my_report") {
		t.Fatalf("swap under a dependent view: %v", err)
	}
	if _, err := e.db.Pool.Exec(ctx, `DROP VIEW my_report`); err != nil {
		t.Fatal(err)
	}
	// The live side never applied anything; the swap hands it the
	// rebuild's rows and positions.
	if err := rb.Swap(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT count(*) FROM mailboxes`); n == 0 {
		t.Error("no mailboxes in the live schema after the swap")
	}
	if n := e.count(`SELECT count(*) FROM projector_offsets WHERE projector = 'registry'`); n == 0 {
		t.Error("no registry positions in the live schema after the swap")
	}
}

// TestCheckName: only rebuild names of the projection are taken.
func TestCheckName(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{
		"public_registry_1700000000":                     true,
		"public_registry_0042":                           true,
		"public_registry_1700000000; DROP SCHEMA public": false,
		"public_placement_1":                             false, // another projection's
		"Public_registry_1":                              false,
		"public_registry_":                               false,
		"public":                                         false,
		strings.Repeat("a", 50) + "_registry_1":          false,
	} {
		if err := rebuild.CheckName(name, rebuild.Registry, "public"); (err == nil) != ok {
			t.Errorf("CheckName(%q) = %v, want ok %v", name, err, ok)
		}
	}
	if err := rebuild.CheckName("x_registry_1", rebuild.Registry, "x_registry_1"); err == nil {
		t.Error("the live schema's name was taken")
	}
	if n := rebuild.DefaultName(strings.Repeat("l", 70), rebuild.Health, time.Unix(1700000000, 0)); len(n) > 58 ||
		rebuild.CheckName(n, rebuild.Health, "") != nil {
		t.Errorf("DefaultName of a long live name: %q", n)
	}
}

// positionsAt reports whether ps stand at the ends of every partition
// holding records.
func positionsAt(ps []rebuild.Position, ends map[string]int64) bool {
	have := map[string]int64{}
	for _, p := range ps {
		have[fmt.Sprintf("%s/%d", p.Topic, p.Partition)] = p.Next
	}
	for k, end := range ends {
		if end > 0 && have[k] != end {
			return false
		}
	}
	return len(have) > 0
}

// TestHealthSwapAheadOfLiveRefused: the live scorer publishes its state
// changes, the rebuild does not; swapping in a rebuild ahead of the live
// scorer would leave the records in between unpublished for good, so the
// swap is refused and nothing moves.
func TestHealthSwapAheadOfLiveRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := newEnv(t)
	e.produce(newGen(5).observations(40)...)
	spec, err := rebuild.HealthSpec(domain.DefaultHealthPolicy())
	if err != nil {
		t.Fatal(err)
	}
	rb, err := rebuild.Start(ctx, spec, rebuild.Config{Kafka: e.kcfg, Live: e.db.Pool, Schema: e.db.Schema + "_health_1"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		rb.Close()
		_ = rebuild.Drop(context.Background(), e.db.Pool, rb.Schema())
	}()
	err = rb.Swap(ctx)
	if !errors.Is(err, rebuild.ErrLiveBehind) || !strings.Contains(err.Error(), "never publish") {
		t.Fatalf("swap of a health rebuild ahead of the live scorer: %v", err)
	}
	if n := e.count(`SELECT count(*) FROM mailbox_health`); n != 0 {
		t.Errorf("the refused swap moved %d rows into the live schema", n)
	}
	if n := e.count(`SELECT count(*) FROM ` + pgx.Identifier{rb.Schema(), "mailbox_health"}.Sanitize()); n == 0 {
		t.Error("the rebuild holds no rows")
	}
}

// TestTwoRebuildsInOneSecond: rebuilds started in the same second get
// schemas of their own (the default name was the unix second alone, and
// the second rebuild failed on "schema already exists").
func TestTwoRebuildsInOneSecond(t *testing.T) {
	t.Parallel()
	now := time.Unix(1700000000, 0)
	a, b := rebuild.DefaultName("public", rebuild.Placement, now), rebuild.DefaultName("public", rebuild.Placement, now)
	if a == b || rebuild.CheckName(a, rebuild.Placement, "") != nil || rebuild.CheckName(b, rebuild.Placement, "") != nil {
		t.Fatalf("two default names in one second: %q, %q", a, b)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := newEnv(t)
	e.produce(newGen(5).registry(10)...)
	var (
		wg   sync.WaitGroup
		rbs  [2]*rebuild.Rebuild
		errs [2]error
	)
	for i := range rbs {
		wg.Go(func() {
			rbs[i], errs[i] = rebuild.Start(ctx, rebuild.RegistrySpec(), rebuild.Config{Kafka: e.kcfg, Live: e.db.Pool})
		})
	}
	wg.Wait()
	for i, rb := range rbs {
		if errs[i] != nil {
			t.Fatalf("rebuild %d: %v", i, errs[i])
		}
		defer func() {
			rb.Close()
			_ = rebuild.Drop(context.Background(), e.db.Pool, rb.Schema())
		}()
	}
	if rbs[0].Schema() == rbs[1].Schema() {
		t.Fatalf("both rebuilds in schema %s", rbs[0].Schema())
	}
}
