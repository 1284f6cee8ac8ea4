package placement

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// The benchmark fleet: 10,000 workers (2,000 shared free, 8,000 shared
// premium; 60 % oauth_api, 30 % cold_smtp, 10 % warmup_only; all past the
// age ramp), 20,000 orgs (10 % free, 2 % dedicated with 2 workers each, the
// rest premium), 1,000,000 mailboxes (25 % smtp, 25 % smtp with warmup,
// 50 % gmail/outlook; the first 2 % scored watch, so risky pools exist:
// pools are promoted from idle workers, which exist only before the
// lowest-utilisation rule has spread mailboxes over the whole fleet).
const (
	plBenchWorkers   = 10_000
	plBenchOrgs      = 20_000
	plBenchMailboxes = 1_000_000
)

type plBenchFleet struct {
	s       *State
	now     time.Time
	next    int // next mailbox number
	setup   time.Duration
	setupDs int
	heapMB  float64
}

var (
	plBenchOnce sync.Once
	plBench     *plBenchFleet
)

func plBenchMailboxAdded(i int) *domain.MailboxAdded {
	org := plOrg(i % plBenchOrgs)
	p := domain.ProviderSMTPIMAP
	switch i % 4 {
	case 2:
		p = domain.ProviderGmail
	case 3:
		p = domain.ProviderOutlook
	}
	return &domain.MailboxAdded{MailboxID: plMailbox(i), OrgID: org, UserID: org, Address: "a@b.c", Provider: p, WarmupEnabled: i%4 == 1}
}

func plBenchBuild(tb testing.TB) *plBenchFleet {
	plBenchOnce.Do(func() {
		f := &plBenchFleet{s: NewState(Config{}), now: plT0}
		s := f.s
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
			return &domain.WorkerHeartbeat{WorkerID: plWorker(i), Tier: tier, Egress: egress, Address: "10.0.0.1:25"}
		}
		for i := range plBenchWorkers {
			s.Apply(Input{At: f.now, Event: hb(i)})
		}
		f.now = f.now.Add(15 * 24 * time.Hour)
		for i := range plBenchWorkers {
			s.Apply(Input{At: f.now, Event: hb(i)})
		}
		for o := range plBenchOrgs {
			ev := &domain.OrgPlanChanged{OrgID: plOrg(o), Plan: domain.PlanPremium, Paid: true, Source: "bench"}
			switch {
			case o%10 == 0:
				continue // no plan: free
			case o%50 == 1:
				ev.Plan, ev.DedicatedWorkers = domain.PlanDedicated, 2
			}
			s.Apply(Input{At: f.now, Event: ev})
		}
		start := time.Now()
		for i := range plBenchMailboxes {
			f.setupDs += len(s.Apply(Input{At: f.now, Event: plBenchMailboxAdded(i)}))
			if i < plBenchMailboxes/50 { // risky ones first, while idle workers exist to promote
				f.setupDs += len(s.Apply(Input{At: f.now, Event: &domain.MailboxHealthScored{MailboxID: plMailbox(i), State: domain.HealthWatch, Score: 60, Reason: "bench"}}))
			}
		}
		f.setup = time.Since(start)
		f.next = plBenchMailboxes
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		f.heapMB = float64(ms.HeapAlloc) / (1 << 20)
		plBench = f
	})
	w, m, refused := plBench.s.Counts()
	if w != plBenchWorkers || m < plBenchMailboxes || refused != 0 {
		tb.Fatalf("bench fleet: %d workers, %d mailboxes, %d refused", w, m, refused)
	}
	return plBench
}

// BenchmarkPlacementMailboxAdded measures the decider on mailbox.added
// against the full fleet: one input, one assigned decision (a few on
// promotions), folded. The fleet grows by b.N mailboxes.
func BenchmarkPlacementMailboxAdded(b *testing.B) {
	f := plBenchBuild(b)
	b.Logf("fleet: %d workers, %d mailboxes; setup %d decisions in %s (%.0f decisions/s); heap %.0f MB",
		plBenchWorkers, plBenchMailboxes, f.setupDs, f.setup.Round(time.Millisecond), float64(f.setupDs)/f.setup.Seconds(), f.heapMB)
	ins := make([]Input, b.N)
	for i := range ins {
		ins[i] = Input{At: f.now, Event: plBenchMailboxAdded(f.next + i)}
	}
	f.next += b.N
	decisions := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := range ins {
		decisions += len(f.s.Apply(ins[i]))
	}
	b.StopTimer()
	b.ReportMetric(float64(decisions)/b.Elapsed().Seconds(), "decisions/s")
}

// BenchmarkPlacementAddRemove measures a steady fleet: each op adds a
// mailbox and removes the oldest one the benchmark added (two inputs, two
// decisions).
func BenchmarkPlacementAddRemove(b *testing.B) {
	f := plBenchBuild(b)
	first := f.next
	adds := make([]Input, b.N)
	removes := make([]Input, b.N)
	for i := range adds {
		adds[i] = Input{At: f.now, Event: plBenchMailboxAdded(f.next + i)}
		removes[i] = Input{At: f.now, Event: &domain.MailboxRemoved{MailboxID: plMailbox(first + i), Reason: "bench"}}
	}
	f.next += b.N
	decisions := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := range adds {
		decisions += len(f.s.Apply(adds[i]))
		decisions += len(f.s.Apply(removes[i]))
	}
	b.StopTimer()
	b.ReportMetric(float64(decisions)/b.Elapsed().Seconds(), "decisions/s")
}

// TestPlacementBenchFleetInvariants checks the benchmark fleet itself once
// (skipped in -short): the invariants hold at 1,000,000 mailboxes.
func TestPlacementBenchFleetInvariants(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the 1,000,000-mailbox fleet")
	}
	f := plBenchBuild(t)
	if err := Invariants(f.s); err != nil {
		t.Fatal(err)
	}
	dedicated := 0
	for _, w := range f.s.workers {
		if w.tier == domain.TierDedicated {
			dedicated++
		}
	}
	t.Logf("fleet built in %s; %d dedicated workers; heap %.0f MB", f.setup.Round(time.Millisecond), dedicated, f.heapMB)
}

// BenchmarkStateFromSnapshot1M measures the engine's restore from a
// checkpoint once the checkpoint is loaded: NewStateFromSnapshot of the
// benchmark fleet (1,000,000 mailboxes, 10,000 workers), the state the
// restored engine decides on. Its mailboxes come in a shuffled order
// (fixed seed), as a sequential scan of the projection hands them over.
func BenchmarkStateFromSnapshot1M(b *testing.B) {
	f := plBenchBuild(b)
	snap := f.s.Snapshot()
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(snap.Mailboxes), func(i, j int) {
		snap.Mailboxes[i], snap.Mailboxes[j] = snap.Mailboxes[j], snap.Mailboxes[i]
	})
	want := f.s.Snapshot()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		st, err := NewStateFromSnapshot(Config{}, snap)
		if err != nil {
			b.Fatal(err)
		}
		if w, m, _ := st.Counts(); w != len(want.Workers) || m != len(want.Mailboxes) {
			b.Fatalf("restored %d workers and %d mailboxes, want %d and %d", w, m, len(want.Workers), len(want.Mailboxes))
		}
	}
}
