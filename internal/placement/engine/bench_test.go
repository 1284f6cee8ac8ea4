package engine

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/producer"
)

// benchFleet registers 100 shared premium oauth_api workers (capacity 100
// each, 2,000 gmail mailboxes of weight 0.05) and a premium org, and waits
// until the engine has them.
func benchFleet(b *testing.B, tb testBroker, p *publisher) {
	b.Helper()
	var ds []domain.Data
	for i := range 100 {
		ds = append(ds, heartbeat(i, domain.TierSharedPremium, domain.EgressOAuthAPI))
	}
	ds = append(ds, plan(2, domain.PlanPremium, 0))
	evs := p.publish(t0, ds...)
	waitLog(b, tb, 60*time.Second, "bench fleet", func(l []logEntry) bool { return hasAll(l, evs) })
}

// commitTracker records, per input event id, when its transaction committed.
type commitTracker struct {
	mu        sync.Mutex
	committed map[string]time.Time
	decisions int
	txns      int
	cond      *sync.Cond
}

func newCommitTracker() *commitTracker {
	c := &commitTracker{committed: map[string]time.Time{}}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *commitTracker) hook(cm Commit) {
	c.mu.Lock()
	for _, in := range cm.Inputs {
		c.committed[in.EventID] = cm.At
	}
	c.decisions += cm.Decisions
	c.txns++
	c.mu.Unlock()
	c.cond.Broadcast()
}

func (c *commitTracker) wait(b *testing.B, ids []string, timeout time.Duration) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	go func() {
		time.Sleep(timeout)
		c.cond.Broadcast()
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		for _, ok := c.committed[id]; !ok; _, ok = c.committed[id] {
			if time.Now().After(deadline) {
				b.Fatalf("timed out waiting for %d inputs to commit (%d committed)", len(ids), len(c.committed))
			}
			c.cond.Wait()
		}
	}
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// BenchmarkEngineLatency publishes mailbox.added at a steady 1,000/s (b.N
// events; -benchtime=10000x for ten seconds) through the standard producer
// options (acks=all, 2 ms linger) and measures each event from the start
// of its publish to the commit of the transaction holding its decision.
func BenchmarkEngineLatency(b *testing.B) {
	tb := newTestBroker(b)
	p := newPublisher(b, tb)
	tr := newCommitTracker()
	startEngine(b, tb, WithCommitted(tr.hook), WithClock(func() time.Time { return t0 }))
	benchFleet(b, tb, p)

	kc, err := kafka.NewProducer(tb.kcfg("bench-publisher"))
	if err != nil {
		b.Fatal(err)
	}
	defer kc.Close()
	pc := producer.New(kc, producer.WithSource("bench"), producer.WithNamespace(tb.ns))
	sent := make([]time.Time, b.N)
	ids := make([]string, b.N)
	var perr error
	var pmu sync.Mutex
	var wg sync.WaitGroup

	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if d := time.Until(start.Add(time.Duration(i) * time.Millisecond)); d > 0 {
			time.Sleep(d)
		}
		ev := p.event(t0.Add(time.Minute), mailboxAdded(i, 2, domain.ProviderGmail))
		recs, err := pc.Prepare([]domain.Event{ev})
		if err != nil {
			b.Fatal(err)
		}
		ids[i] = ev.ID
		sent[i] = time.Now()
		wg.Add(1)
		kc.Produce(context.Background(), recs[0], func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				pmu.Lock()
				perr = err
				pmu.Unlock()
			}
		})
	}
	wg.Wait()
	if perr != nil {
		b.Fatal(perr)
	}
	tr.wait(b, ids, 60*time.Second)
	b.StopTimer()

	lat := make([]time.Duration, b.N)
	tr.mu.Lock()
	for i, id := range ids {
		lat[i] = tr.committed[id].Sub(sent[i])
	}
	txns := tr.txns
	tr.mu.Unlock()
	slices.Sort(lat)
	b.ReportMetric(float64(percentile(lat, 0.50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	b.ReportMetric(float64(b.N)/float64(txns), "inputs/txn")
	b.Logf("n=%d over %s: p50 %s p99 %s max %s, %d transactions", b.N, time.Since(start).Round(time.Millisecond),
		percentile(lat, 0.50), percentile(lat, 0.99), lat[len(lat)-1], txns)
}

// BenchmarkEngineThroughput publishes b.N mailbox.added as fast as the
// producer goes (batches of 1,000) to a running engine and measures from
// the first publish to the commit of the last decision.
func BenchmarkEngineThroughput(b *testing.B) {
	tb := newTestBroker(b)
	p := newPublisher(b, tb)
	tr := newCommitTracker()
	startEngine(b, tb, WithCommitted(tr.hook), WithClock(func() time.Time { return t0 }))
	benchFleet(b, tb, p)
	tr.mu.Lock()
	base := tr.decisions
	tr.mu.Unlock()

	ids := make([]string, 0, b.N)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i += 1000 {
		var ds []domain.Data
		for j := i; j < min(i+1000, b.N); j++ {
			ds = append(ds, mailboxAdded(j, 2, domain.ProviderGmail))
		}
		for _, ev := range p.publish(t0.Add(time.Minute), ds...) {
			ids = append(ids, ev.ID)
		}
	}
	published := time.Since(start)
	tr.wait(b, ids, 5*time.Minute)
	took := time.Since(start)
	b.StopTimer()
	tr.mu.Lock()
	decisions, txns := tr.decisions-base, tr.txns
	tr.mu.Unlock()
	b.ReportMetric(float64(decisions)/took.Seconds(), "decisions/s")
	b.ReportMetric(float64(b.N)/float64(txns), "inputs/txn")
	b.Logf("n=%d: published in %s, all decided and committed in %s: %.0f decisions/s, %d transactions",
		b.N, published.Round(time.Millisecond), took.Round(time.Millisecond), float64(decisions)/took.Seconds(), txns)
}

// BenchmarkEngineRestore measures a restore with LogSnapshotter: the fold
// of a decision log of about b.N decisions (b.N mailbox assignments plus
// the fleet) read back from the broker.
func BenchmarkEngineRestore(b *testing.B) {
	tb := newTestBroker(b)
	p := newPublisher(b, tb)
	tr := newCommitTracker()
	_, stop := startEngine(b, tb, WithCommitted(tr.hook), WithClock(func() time.Time { return t0 }))
	benchFleet(b, tb, p)
	var ids []string
	for i := 0; i < b.N; i += 1000 {
		var ds []domain.Data
		for j := i; j < min(i+1000, b.N); j++ {
			ds = append(ds, mailboxAdded(j, 2, domain.ProviderGmail))
		}
		for _, ev := range p.publish(t0.Add(time.Minute), ds...) {
			ids = append(ids, ev.ID)
		}
	}
	tr.wait(b, ids, 5*time.Minute)
	stop()

	b.ResetTimer()
	start := time.Now()
	r, err := restore(context.Background(), tb.kcfg("restore"), placement.Config{}, LogSnapshotter{})
	took := time.Since(start)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(r.decisions)/took.Seconds(), "decisions/s")
	b.Logf("restored %d decisions (log end %d) in %s", r.decisions, r.end, took.Round(time.Millisecond))
}
