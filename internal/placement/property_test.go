package placement

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// plGen generates random but plausible inputs over a small universe (8
// workers, 5 orgs, 40 mailboxes) so that capacity runs out, pools fill,
// workers die and come back, and plans change under load.
type plGen struct {
	r      *rand.Rand
	tier   map[int]domain.Tier
	egress map[int]domain.Egress
	stop   map[int]bool
	silent map[int]bool
}

func newPlGen(seed uint64) *plGen {
	return &plGen{
		r:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		tier: map[int]domain.Tier{}, egress: map[int]domain.Egress{}, stop: map[int]bool{}, silent: map[int]bool{},
	}
}

var plPropertyConfig = Config{HeartbeatInterval: 20 * time.Second, BandDwell: 2 * time.Minute, WorkerRetention: 60 * time.Hour}

func (g *plGen) pick(n int) int { return 1 + g.r.IntN(n) }

func (g *plGen) next(now *time.Time) Input {
	r := g.r
	switch x := r.IntN(1000); {
	case x < 10:
		*now = now.Add(time.Duration(1+r.IntN(3)) * 24 * time.Hour)
	case x < 60:
		*now = now.Add(time.Duration(1+r.IntN(10)) * time.Minute)
	default:
		*now = now.Add(time.Duration(r.IntN(4000)) * time.Millisecond)
	}
	in := Input{At: *now}
	switch x := r.IntN(100); {
	case x < 32:
		w := g.pick(8)
		if r.IntN(100) < 3 {
			g.silent[w] = !g.silent[w]
		}
		if g.silent[w] {
			return in // a tick instead
		}
		if _, ok := g.tier[w]; !ok || r.IntN(100) < 4 {
			g.tier[w] = []domain.Tier{domain.TierSharedFree, domain.TierSharedPremium, domain.TierSharedPremium, ""}[r.IntN(4)]
		}
		if _, ok := g.egress[w]; !ok || r.IntN(100) < 3 {
			g.egress[w] = []domain.Egress{domain.EgressColdSMTP, domain.EgressColdSMTP, domain.EgressWarmupOnly, domain.EgressOAuthAPI}[r.IntN(4)]
		}
		if r.IntN(100) < 5 {
			g.stop[w] = !g.stop[w]
		}
		tier := g.tier[w]
		if r.IntN(200) == 0 {
			tier = domain.TierDedicated // refused, decides nothing
		}
		in.Event = &domain.WorkerHeartbeat{WorkerID: plWorker(w), Tier: tier, Egress: g.egress[w], Address: fmt.Sprintf("10.0.0.%d:25", w), Stopping: g.stop[w]}
	case x < 45:
		// tick
	case x < 65:
		org := g.pick(5)
		in.Event = &domain.MailboxAdded{
			MailboxID: plMailbox(g.pick(40)), OrgID: plOrg(org), UserID: plOrg(org), Address: "a@b.c",
			Provider: []domain.Provider{domain.ProviderSMTPIMAP, domain.ProviderSMTPIMAP, domain.ProviderGmail, domain.ProviderOutlook}[r.IntN(4)], WarmupEnabled: r.IntN(3) == 0,
		}
	case x < 72:
		in.Event = &domain.MailboxRemoved{MailboxID: plMailbox(g.pick(40)), Reason: "gone"}
	case x < 86:
		st := []domain.HealthState{domain.HealthHealthy, domain.HealthHealthy, domain.HealthHealthy, domain.HealthWatch, domain.HealthThrottled, domain.HealthQuarantined, domain.HealthBlocked}[r.IntN(7)]
		in.Event = &domain.MailboxHealthScored{MailboxID: plMailbox(g.pick(40)), State: st, Score: float64(r.IntN(101)), Reason: "sweep"}
	case x < 91:
		p := []domain.Plan{domain.PlanFree, domain.PlanPremium, domain.PlanPremium, domain.PlanDedicated, domain.PlanDedicated}[r.IntN(5)]
		n := 0
		if p == domain.PlanDedicated || r.IntN(5) == 0 {
			n = r.IntN(4)
		}
		in.Event = &domain.OrgPlanChanged{OrgID: plOrg(g.pick(5)), Plan: p, DedicatedWorkers: n, Paid: r.IntN(8) != 0, Source: "evt"}
	case x < 98:
		sends := []int64{0, 50, 1000, 10000}[r.IntN(4)]
		in.Event = &domain.WorkerHealthSampled{
			WorkerID: plWorker(g.pick(8)), WindowSeconds: 3600, Sends: sends,
			HardBounces: sends * int64(r.IntN(12)) / 100, Complaints: sends * int64(r.IntN(12)) / 1000,
		}
	default:
		in.Event = &domain.UserActive{UserID: plOrg(1), Source: domain.ActivityLogin}
	}
	return in
}

// plPropertyRun feeds steps random inputs through h, checking everything
// the harness checks after every input, and after every tick that nothing
// pending could have been placed.
func plPropertyRun(h *plHarness, seed uint64, steps int) {
	h.t.Helper()
	g := newPlGen(seed)
	for i := range steps {
		if g.r.IntN(150) == 0 {
			// An engine failover: the new engine knows only what the log
			// recorded, and grants every worker a window on its clock.
			st, err := NewStateFromSnapshot(h.live.cfg, h.restored.Snapshot())
			if err != nil {
				h.t.Fatalf("seed %d step %d: restore: %v", seed, i, err)
			}
			st.GrantLiveness(h.now)
			h.live = st
		}
		in := g.next(&h.now)
		ds := h.live.Apply(in)
		h.check(ds, fmt.Sprintf("seed %d step %d %T", seed, i, in.Event))
		if in.Event == nil {
			plCheckSettled(h, seed, i)
		}
	}
}

// plCheckSettled: after a tick every retry has run, so every refused
// mailbox has no eligible worker, every degraded one no dedicated room,
// every mailbox on a draining worker nowhere else to go, and no org is
// short of dedicated workers while an idle premium worker exists.
func plCheckSettled(h *plHarness, seed uint64, step int) {
	h.t.Helper()
	s := h.live
	for _, v := range s.Pending() {
		var d domain.PlacementDecision
		if v.WorkerID == "" {
			o := s.orgs[v.OrgID]
			d = &domain.PlacementRefused{MailboxID: v.ID, OrgID: v.OrgID, Tier: placementWantedTier(o), Band: v.Band, Weight: v.Weight}
		} else {
			d = &domain.PlacementAssigned{MailboxID: v.ID, OrgID: v.OrgID, Band: v.Band, Weight: v.Weight, Degraded: true}
		}
		if err := RefusalJustified(s, d); err != nil {
			h.t.Fatalf("seed %d step %d: after a tick, pending %s could be placed: %v", seed, step, v.ID, err)
		}
	}
	for _, w := range s.workers {
		if !w.live || !(w.stopping || w.releasing) {
			continue
		}
		for m := w.head; m != nil; m = m.wNext {
			d := &domain.PlacementRefused{MailboxID: m.id, OrgID: m.org.id, Tier: placementWantedTier(m.org), Band: m.band, Weight: m.weight, FromWorker: w.id}
			if err := RefusalJustified(s, d); err != nil {
				h.t.Fatalf("seed %d step %d: after a tick, mailbox %s could leave draining worker %s: %v", seed, step, m.id, w.id, err)
			}
		}
	}
	for _, w := range s.workers {
		if !w.live && h.now.Sub(w.lastSeen) > s.cfg.WorkerRetention {
			h.t.Fatalf("seed %d step %d: after a tick, worker %s last seen %s is dead beyond the retention and not forgotten", seed, step, w.id, w.lastSeen)
		}
	}
	for _, o := range s.shortOrgs() {
		if w := s.idleClean(domain.TierSharedPremium, nil); w != nil {
			h.t.Fatalf("seed %d step %d: org %s short while worker %s idle", seed, step, o.id, w.id)
		}
	}
}

func TestPlacementProperty(t *testing.T) {
	t.Parallel()
	const seeds, steps = 200, 500
	total := map[string]int{}
	decisions := 0
	for seed := range uint64(seeds) {
		h := newPlHarness(t, plPropertyConfig)
		plPropertyRun(h, seed, steps)
		for k, v := range h.types {
			total[k] += v
		}
		decisions += len(h.log)
	}
	for _, typ := range domain.PlacementDecisionTypes() {
		if total[typ] == 0 {
			t.Errorf("%s never decided in %d random runs", typ, seeds)
		}
	}
	t.Logf("%d seeds × %d steps: %d decisions %v", seeds, steps, decisions, total)
}

func TestPlacementDeterminism(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		a := NewState(plPropertyConfig)
		b := NewState(plPropertyConfig)
		ga, gb := newPlGen(seed), newPlGen(seed)
		na, nb := plT0, plT0
		for step := range 500 {
			da, db := a.Apply(ga.next(&na)), b.Apply(gb.next(&nb))
			if plJSON(da) != plJSON(db) {
				t.Fatalf("seed %d step %d: same input, different decisions", seed, step)
			}
		}
	}
}
