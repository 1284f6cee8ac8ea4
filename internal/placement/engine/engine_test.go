package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

// fleet publishes the standard test fleet: two shared_free cold_smtp
// workers, three shared_premium oauth_api workers; org 1 free (no plan),
// org 2 premium, org 3 dedicated with one worker (which promotes an idle
// premium worker). It waits until the engine has recorded all of it.
func fleet(t *testing.T, b testBroker, p *publisher, at time.Time) []domain.Event {
	t.Helper()
	evs := p.publish(at,
		heartbeat(1, domain.TierSharedFree, domain.EgressColdSMTP),
		heartbeat(2, domain.TierSharedFree, domain.EgressColdSMTP),
		heartbeat(3, domain.TierSharedPremium, domain.EgressOAuthAPI),
		heartbeat(4, domain.TierSharedPremium, domain.EgressOAuthAPI),
		heartbeat(5, domain.TierSharedPremium, domain.EgressOAuthAPI),
	)
	waitLog(t, b, 30*time.Second, "workers registered", func(l []logEntry) bool { return hasAll(l, evs) })
	plans := p.publish(at.Add(time.Second), plan(2, domain.PlanPremium, 0), plan(3, domain.PlanDedicated, 1))
	waitLog(t, b, 30*time.Second, "plans recorded", func(l []logEntry) bool { return hasAll(l, plans) })
	return append(evs, plans...)
}

// addMailboxes publishes mailboxes from..to-1, spread over orgs 1..3 (free
// ones weigh 1 on cold_smtp, paid ones are gmail).
func addMailboxes(p *publisher, at time.Time, from, to int) []domain.Event {
	var ds []domain.Data
	for i := from; i < to; i++ {
		org := 1 + i%3
		prov := domain.ProviderGmail
		if org == 1 {
			prov = domain.ProviderSMTPIMAP
		}
		ds = append(ds, mailboxAdded(i, org, prov))
	}
	return p.publish(at, ds...)
}

func wantTier(org int) domain.Tier {
	switch org {
	case 1:
		return domain.TierSharedFree
	case 2:
		return domain.TierSharedPremium
	}
	return domain.TierDedicated
}

// TestEngineEndToEnd: heartbeats, plans and mailbox.added go in; the
// decision log holds every registration, the plan records, the dedicated
// promotion and binding, one assignment per mailbox on a worker of the
// right tier; and the log is exactly what the pure decider makes from the
// same inputs in the same order, folding to the same state.
func TestEngineEndToEnd(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	var commits []Commit
	clock := newFakeClock(t0)
	e, _ := startEngine(t, b, WithRegisterer(reg), WithClock(clock.Now),
		WithTickInterval(20*time.Millisecond),
		WithCommitted(func(c Commit) { mu.Lock(); commits = append(commits, c); mu.Unlock() }))
	p := newPublisher(t, b)

	fleet(t, b, p, t0)
	if !e.Active() {
		t.Fatal("the only engine is not active")
	}
	// Inputs are decided at their record timestamp, bounded by the
	// engine's clock: it reads the time they are published at.
	clock.Set(t0.Add(2 * time.Second))
	boxes := addMailboxes(p, t0.Add(2*time.Second), 0, 24)
	l := waitLog(t, b, 30*time.Second, "mailboxes decided", func(l []logEntry) bool { return hasAll(l, boxes) })

	assigned := map[string]*domain.PlacementAssigned{}
	for _, en := range l {
		if a, ok := en.d.Data.(*domain.PlacementAssigned); ok {
			if assigned[a.MailboxID] != nil {
				t.Fatalf("mailbox %s assigned twice", a.MailboxID)
			}
			assigned[a.MailboxID] = a
		}
	}
	for i := 0; i < 24; i++ {
		a := assigned[mailboxID(i)]
		if a == nil {
			t.Fatalf("mailbox %d has no assigned decision; log:%s", i, groupJSON(t, l))
		}
		if want := wantTier(1 + i%3); a.Tier != want {
			t.Errorf("mailbox %d (org %d) on tier %s, want %s", i, 1+i%3, a.Tier, want)
		}
		if a.Reason != domain.ReasonMailboxAdded || a.At != t0.Add(2*time.Second) {
			t.Errorf("mailbox %d: reason %s at %s", i, a.Reason, a.At)
		}
	}
	if n := count[*domain.PlacementWorkerRegistered](l); n != 5 {
		t.Errorf("%d workers registered, want 5", n)
	}
	if n := count[*domain.PlacementWorkerPromoted](l); n != 1 {
		t.Errorf("%d promotions, want 1 (org 3's dedicated worker)", n)
	}
	if n := count[*domain.PlacementDedicatedBound](l); n != 1 {
		t.Errorf("%d dedicated bindings, want 1", n)
	}
	st := verifyLog(t, b, l, p.events(), placement.Config{})
	if _, mailboxes, refused := st.Counts(); mailboxes != 24 || refused != 0 {
		t.Errorf("state: %d mailboxes, %d refused", mailboxes, refused)
	}

	// Metrics: the log's decisions by kind, the workers by tier/pool/health,
	// the engine active, a latency observation per deciding input.
	if got := metricValue(e.m.decisions.WithLabelValues("assigned", "mailbox_added")); got != 24 {
		t.Errorf("decisions_total{assigned,mailbox_added} = %v", got)
	}
	if got := metricValue(e.m.promotions); got != 1 {
		t.Errorf("promotions_total = %v", got)
	}
	if got := metricValue(e.m.active); got != 1 {
		t.Errorf("engine_active = %v", got)
	}
	if got := metricValue(e.m.workers.WithLabelValues("dedicated", "clean", "healthy")); got != 1 {
		t.Errorf("workers{dedicated,clean,healthy} = %v", got)
	}
	if got := metricValue(e.m.workers.WithLabelValues("shared_premium", "clean", "healthy")); got != 2 {
		t.Errorf("workers{shared_premium,clean,healthy} = %v", got)
	}
	if got := metricValue(e.m.workers.WithLabelValues("shared_free", "clean", "healthy")); got != 2 {
		t.Errorf("workers{shared_free,clean,healthy} = %v", got)
	}
	mu.Lock()
	inputs := 0
	for _, c := range commits {
		inputs += len(c.Inputs)
	}
	mu.Unlock()
	// One latency sample per input, as the interactive consumer; every
	// input partition it owns caught up.
	sts, err := sla.Statuses(reg)
	if err != nil || len(sts) != 1 || sts[0].Consumer.Name != sla.PlacementEngine {
		t.Fatalf("consumer statuses %+v (%v), want the placement engine's", sts, err)
	}
	if n := sts[0].Applied; n != uint64(inputs) {
		t.Errorf("latency histogram: %d observations, want one per input (%d)", n, inputs)
	}
	for _, pl := range sts[0].Partitions {
		if pl.Records != 0 {
			t.Errorf("input partition %s/%d behind after every input was decided: %+v", pl.Topic, pl.Partition, pl)
		}
	}
	if inputs != 31 {
		t.Errorf("the commit hook saw %d inputs, want 31", inputs)
	}
}

// TestEngineTicksExpireDeadWorkers: ticks carry the injected clock's time;
// a worker whose heartbeats stopped is declared dead by a tick and its
// mailboxes move to the live worker; the tick's decisions are in the log
// with the tick's time and replay exactly.
func TestEngineTicksExpireDeadWorkers(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	clock := newFakeClock(t0)
	startEngine(t, b, WithClock(clock.Now), WithTickInterval(20*time.Millisecond))
	p := newPublisher(t, b)

	hbs := p.publish(t0, heartbeat(1, domain.TierSharedPremium, domain.EgressOAuthAPI), heartbeat(2, domain.TierSharedPremium, domain.EgressOAuthAPI))
	waitLog(t, b, 30*time.Second, "workers", func(l []logEntry) bool { return hasAll(l, hbs) })
	pl := p.publish(t0, plan(2, domain.PlanPremium, 0))
	waitLog(t, b, 30*time.Second, "plan", func(l []logEntry) bool { return hasAll(l, pl) })
	var ds []domain.Data
	for i := range 6 {
		ds = append(ds, mailboxAdded(i, 2, domain.ProviderGmail))
	}
	boxes := p.publish(t0, ds...)
	waitLog(t, b, 30*time.Second, "mailboxes", func(l []logEntry) bool { return hasAll(l, boxes) })

	// Worker 1 heartbeats 20 s later (the engine's clock reads that time:
	// a record is never decided later than the clock); worker 2 is silent.
	// Once the engine has the heartbeat, the clock moves to 31 s and the
	// next tick expires 2 (silent for more than the 30 s window), not 1.
	mid := t0.Add(20 * time.Second)
	clock.Set(mid)
	hb := p.publish(mid, heartbeat(1, domain.TierSharedPremium, domain.EgressOAuthAPI))
	// It changes nothing: heard, not recorded.
	waitFor(t, 30*time.Second, "heartbeat heard", func() bool { return b.tr.Decided(hb) })
	later := t0.Add(31 * time.Second)
	clock.Set(later)
	l := waitLog(t, b, 30*time.Second, "worker 2 dead", func(l []logEntry) bool {
		return count[*domain.PlacementWorkerDied](l) == 1
	})
	var died *domain.PlacementWorkerDied
	for _, en := range l {
		if d, ok := en.d.Data.(*domain.PlacementWorkerDied); ok {
			died = d
			if !en.d.Cause.IsTick() || !en.d.Time().Equal(later) {
				t.Errorf("worker_died cause %+v at %s, want a tick at %s", en.d.Cause, en.d.Time(), later)
			}
		}
	}
	if died.WorkerID != workerID(2) {
		t.Errorf("worker %s died, want worker 2", died.WorkerID)
	}
	st := verifyLog(t, b, l, p.events(), placement.Config{})
	if got := st.WorkerMailboxes(workerID(1)); len(got) != 6 {
		t.Errorf("worker 1 has %d mailboxes after worker 2 died, want 6", len(got))
	}
}

// TestEngineRestartRestoresFromLog: an engine stops; more inputs arrive; a
// new engine restores from the decision log and resumes from the offsets
// committed with the last transaction: nothing is decided twice, nothing
// is skipped, and the whole log is what the decider makes.
func TestEngineRestartRestoresFromLog(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	p := newPublisher(t, b)
	_, stop1 := startEngine(t, b)
	fleet(t, b, p, t0)
	first := addMailboxes(p, t0.Add(time.Minute), 0, 12)
	before := waitLog(t, b, 30*time.Second, "first mailboxes", func(l []logEntry) bool { return hasAll(l, first) })
	stop1()

	// While no engine runs: more mailboxes, a removal, a band change.
	second := addMailboxes(p, t0.Add(2*time.Minute), 12, 24)
	second = append(second, p.publish(t0.Add(3*time.Minute),
		&domain.MailboxRemoved{MailboxID: mailboxID(4), Reason: "deleted"},
		&domain.MailboxHealthScored{MailboxID: mailboxID(5), State: domain.HealthWatch, Score: 60, Reason: "sweep"},
	)...)
	time.Sleep(200 * time.Millisecond)
	if n := len(readLog(t, b)); n != len(before) {
		t.Fatalf("the log grew from %d to %d with no engine running", len(before), n)
	}

	reg := prometheus.NewRegistry()
	e2, _ := startEngine(t, b, WithRegisterer(reg))
	l := waitLog(t, b, 30*time.Second, "second mailboxes", func(l []logEntry) bool { return hasAll(l, second) })
	if got := metricValue(e2.m.restoreLen); int(got) != len(before) {
		t.Errorf("the new engine folded %v decisions, the log held %d", got, len(before))
	}
	st := verifyLog(t, b, l, p.events(), placement.Config{})
	if _, ok := st.Mailbox(mailboxID(4)); ok {
		t.Error("mailbox 4 survived its removal")
	}
	if v, _ := st.Mailbox(mailboxID(5)); v.Band != "risky" {
		t.Errorf("mailbox 5 in band %s after a watch score", v.Band)
	}
}

// TestEngineTwoInProcessOneActive: two engines in one group; exactly one is
// active and writes; when it leaves, the other takes over and continues
// the same log.
func TestEngineTwoInProcessOneActive(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	p := newPublisher(t, b)
	var mu sync.Mutex
	wrote := map[int]int{}
	hook := func(i int) Option {
		return WithCommitted(func(c Commit) { mu.Lock(); wrote[i] += c.Decisions; mu.Unlock() })
	}
	e1, stop1 := startEngine(t, b, hook(1), WithRegisterer(prometheus.NewRegistry()))
	e2, stop2 := startEngine(t, b, hook(2), WithRegisterer(prometheus.NewRegistry()))
	waitFor(t, 30*time.Second, "an active engine", func() bool { return e1.Active() || e2.Active() })
	fleet(t, b, p, t0)
	first := addMailboxes(p, t0.Add(time.Minute), 0, 10)
	waitLog(t, b, 30*time.Second, "first mailboxes", func(l []logEntry) bool { return hasAll(l, first) })
	if e1.Active() == e2.Active() {
		t.Fatalf("active: e1 %v, e2 %v", e1.Active(), e2.Active())
	}
	active, standby, stopActive, si := e1, e2, stop1, 2
	if e2.Active() {
		active, standby, stopActive, si = e2, e1, stop2, 1
	}
	mu.Lock()
	if wrote[si] != 0 {
		t.Errorf("the standby wrote %d decisions", wrote[si])
	}
	mu.Unlock()
	_ = active
	start := time.Now()
	stopActive()
	waitFor(t, 30*time.Second, "the standby to take over", standby.Active)
	t.Logf("graceful handover took %s", time.Since(start))
	second := addMailboxes(p, t0.Add(2*time.Minute), 10, 20)
	l := waitLog(t, b, 30*time.Second, "second mailboxes", func(l []logEntry) bool { return hasAll(l, second) })
	verifyLog(t, b, l, p.events(), placement.Config{})
	mu.Lock()
	defer mu.Unlock()
	if wrote[si] == 0 {
		t.Error("the new active engine wrote nothing")
	}
}

// TestEngineDeadLetters: a record that is not a valid event goes to the
// DLQ in the transaction that skips it; the engine keeps deciding.
func TestEngineDeadLetters(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	reg := prometheus.NewRegistry()
	e, _ := startEngine(t, b, WithRegisterer(reg))
	p := newPublisher(t, b)
	produceRaw(t, b, "mailplane.worker.events.v1", workerID(9), []byte(`{"worker_id":`))
	hbs := p.publish(t0, heartbeat(1, domain.TierSharedFree, domain.EgressColdSMTP))
	waitLog(t, b, 30*time.Second, "heartbeat", func(l []logEntry) bool { return hasAll(l, hbs) })
	waitFor(t, 10*time.Second, "a dead letter", func() bool {
		return metricValue(e.m.deadLetter.WithLabelValues(string(domain.CodeMissingHeader))) == 1
	})
	// The dead letter was written in a transaction, so the DLQ's last
	// offset is a commit marker: read it with control records kept (the
	// dlq package's List waits for a data record at the last offset).
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{b.ns.Topic(topics.DLQ): {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var rec *kgo.Record
	for rec == nil && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { rec = r })
	}
	if rec == nil {
		t.Fatal("no dead letter in the DLQ")
	}
	en := dlq.Parse(rec)
	if en.Consumer != DeadLetterConsumer || en.SourceTopic != b.ns.Topic(topics.WorkerEvents) || en.ErrorCode != domain.CodeMissingHeader {
		t.Fatalf("dead letter: %+v", en)
	}
}

func produceRaw(t testing.TB, b testBroker, topic, key string, value []byte) {
	t.Helper()
	kc, err := kafka.NewProducer(b.kcfg("raw"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	if err := kc.ProduceSync(t.Context(), &kgo.Record{Topic: b.ns.Topic(topic), Key: []byte(key), Value: value}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// metricValue reads a counter or gauge.
func metricValue(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// TestEngineCommitsIdleInputs: inputs that decide nothing (user.active)
// write no decision, but their offsets are committed (alone, within about
// a second), so a new engine does not read them again; and a stopped
// engine leaves the group at once.
func TestEngineCommitsIdleInputs(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	e, stop := startEngine(t, b)
	waitFor(t, 30*time.Second, "the engine active", e.Active)
	p := newPublisher(t, b)
	p.publish(t0, &domain.UserActive{UserID: orgID(1), Source: domain.ActivityLogin},
		&domain.UserActive{UserID: orgID(2), Source: domain.ActivityWSPing},
		&domain.UserActive{UserID: orgID(3), Source: domain.ActivityWSConnect})
	kc, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	adm := kadm.NewClient(kc)
	waitFor(t, 30*time.Second, "the user.active offsets committed", func() bool {
		offs, err := adm.FetchOffsets(t.Context(), b.ns.Group(DefaultGroup))
		if err != nil {
			return false
		}
		var sum int64
		offs.Each(func(o kadm.OffsetResponse) {
			if o.Topic == b.ns.Topic(topics.UserEvents) && o.Err == nil {
				sum += o.At
			}
		})
		return sum == 3
	})
	if l := readLog(t, b); len(l) != 0 {
		t.Fatalf("user.active decided %d decisions", len(l))
	}
	stop()
	gs, err := adm.DescribeGroups(t.Context(), b.ns.Group(DefaultGroup))
	if err != nil {
		t.Fatal(err)
	}
	if g := gs[b.ns.Group(DefaultGroup)]; len(g.Members) != 0 {
		t.Fatalf("the stopped engine is still a member: %+v", g.Members)
	}
}

// TestEngineAbortRestores: a transaction that does not commit (here the
// broker refuses its offset commit once) is aborted; the engine drops its
// state, restores it from the log and decides the same inputs again: the
// log holds them exactly once.
func TestEngineAbortRestores(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	if b.cluster == nil {
		t.Skip("needs kfake's fault hooks")
	}
	e, _ := startEngine(t, b)
	p := newPublisher(t, b)
	fleet(t, b, p, t0)
	refused := make(chan struct{})
	b.cluster.ControlKey(kmsg.TxnOffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r := req.(*kmsg.TxnOffsetCommitRequest)
		resp := r.ResponseKind().(*kmsg.TxnOffsetCommitResponse)
		for _, rt := range r.Topics {
			st := kmsg.NewTxnOffsetCommitResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewTxnOffsetCommitResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.UnknownServerError.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		close(refused)
		return resp, nil, true // handled once, then dropped
	})
	boxes := addMailboxes(p, t0.Add(time.Minute), 0, 15)
	<-refused
	l := waitLog(t, b, 30*time.Second, "mailboxes", func(l []logEntry) bool { return hasAll(l, boxes) })
	verifyLog(t, b, l, p.events(), placement.Config{})
	if got := metricValue(e.m.aborts.WithLabelValues("not_committed")); got != 1 {
		t.Errorf("aborts{not_committed} = %v, want 1", got)
	}
	var h dto.Metric
	if err := e.m.restore.Write(&h); err != nil || h.GetHistogram().GetSampleCount() != 2 {
		t.Errorf("%d restores, want 2 (start, abort)", h.GetHistogram().GetSampleCount())
	}
}

// flakySnapshotter fails while down is set, counting its calls.
type flakySnapshotter struct {
	down  *atomic.Bool
	calls atomic.Int32
}

func (f *flakySnapshotter) Load(ctx context.Context) (Checkpoint, error) {
	f.calls.Add(1)
	if f.down.Load() {
		return Checkpoint{}, errors.New("connect: connection refused")
	}
	return Checkpoint{}, nil
}

// TestEngineWaitsOutAnUnreadableSnapshot: while the snapshot cannot be
// read (Postgres down), the elected engine keeps its inputs and retries,
// instead of handing leadership to the standby, which would fail the same
// way: no bouncing. Once it can read, that engine becomes active.
func TestEngineWaitsOutAnUnreadableSnapshot(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	var down atomic.Bool
	down.Store(true)
	sa, sb := &flakySnapshotter{down: &down}, &flakySnapshotter{down: &down}
	reg := prometheus.NewRegistry()
	a, _ := startEngine(t, b, WithSnapshotter(sa), WithRegisterer(reg))
	deadline := time.Now().Add(30 * time.Second)
	for sa.calls.Load() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("engine a was never elected")
		}
		time.Sleep(10 * time.Millisecond)
	}
	sbEngine, _ := startEngine(t, b, WithSnapshotter(sb))
	for sa.calls.Load() < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("engine a tried to restore %d times", sa.calls.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	down.Store(false)
	for !a.Active() {
		if time.Now().After(deadline) {
			t.Fatal("engine a did not become active once the snapshot could be read")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := sb.calls.Load(); n != 0 || sbEngine.Active() {
		t.Errorf("the standby restored %d times (active %v): leadership bounced", n, sbEngine.Active())
	}
	if got := metricValue(a.m.restoreFailures); got < 4 {
		t.Errorf("restore failures counted %v, want at least 4", got)
	}
}

// TestEngineSkipsRecordsRedrivenForOthers: a record redriven from the DLQ
// for another consumer (the registry) is not an input: the engine decides
// the worker's next heartbeat on the same partition, never the redriven one.
func TestEngineSkipsRecordsRedrivenForOthers(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	startEngine(t, b)
	p := newPublisher(t, b)
	ev := p.event(t0, heartbeat(7, domain.TierSharedFree, domain.EgressColdSMTP))
	src, err := topics.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	kafkatest.InNamespace(b.kcfg(""), src)
	dead := dlq.Parse(dlq.NewRecord(b.ns, src, dlq.Failure{Consumer: "registry", Code: domain.CodeInvalid, Err: "check violation", Attempts: 3}))
	redriven := dlq.RedriveRecord(dead, domain.NewEventID())
	kc, err := kafka.NewProducer(b.kcfg("redrive")) // partitions by key: the heartbeat's partition
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	if err := kc.ProduceSync(t.Context(), redriven).FirstErr(); err != nil {
		t.Fatal(err)
	}
	later := p.publish(t0.Add(time.Second), heartbeat(7, domain.TierSharedFree, domain.EgressColdSMTP))
	waitLog(t, b, 30*time.Second, "the later heartbeat decided", func(l []logEntry) bool { return hasAll(l, later) })
	if decidedCauses(readLog(t, b))[ev.ID] {
		t.Fatal("the engine decided a record redriven for the registry")
	}
}
