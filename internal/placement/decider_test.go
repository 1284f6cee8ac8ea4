package placement

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

func TestPlacementWeights(t *testing.T) {
	t.Parallel()
	cases := []struct {
		p      domain.Provider
		warmup bool
		want   int64
	}{
		{domain.ProviderSMTPIMAP, false, 1000},
		{domain.ProviderSMTPIMAP, true, 400},
		{domain.ProviderGmail, false, 50},
		{domain.ProviderGmail, true, 50}, // OAuth takes precedence over warmup
		{domain.ProviderOutlook, false, 50},
		{domain.ProviderOutlook, true, 50},
	}
	for _, c := range cases {
		if got := Weight(c.p, c.warmup); got != c.want {
			t.Errorf("Weight(%s, %v) = %d, want %d", c.p, c.warmup, got, c.want)
		}
	}
}

func TestPlacementCapacity(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	cases := []struct {
		e    domain.Egress
		h    domain.HealthState
		age  time.Duration
		want int64
	}{
		{domain.EgressColdSMTP, domain.HealthHealthy, 0, 4},              // 16 × 1 × 0.25
		{domain.EgressColdSMTP, domain.HealthHealthy, 23 * time.Hour, 4}, // whole days only
		{domain.EgressColdSMTP, domain.HealthHealthy, 7 * day, 10},       // 16 × 0.625
		{domain.EgressColdSMTP, domain.HealthHealthy, 14 * day, 16},
		{domain.EgressColdSMTP, domain.HealthHealthy, 400 * day, 16},
		{domain.EgressOAuthAPI, domain.HealthHealthy, 14 * day, 400},
		{domain.EgressOAuthAPI, domain.HealthWatch, 14 * day, 300},
		{domain.EgressOAuthAPI, domain.HealthThrottled, 14 * day, 200},
		{domain.EgressOAuthAPI, domain.HealthQuarantined, 14 * day, 100},
		{domain.EgressOAuthAPI, domain.HealthBlocked, 14 * day, 1}, // at least 1
		{domain.EgressOAuthAPI, domain.HealthHealthy, 0, 100},
		{domain.EgressWarmupOnly, domain.HealthHealthy, 0, 6}, // floor(6.25)
		{domain.EgressWarmupOnly, domain.HealthHealthy, 14 * day, 25},
		{domain.EgressColdSMTP, domain.HealthQuarantined, 0, 1}, // floor(1) = 1
		{domain.EgressColdSMTP, domain.HealthHealthy, -day, 4},  // clock skew: age 0
	}
	for _, c := range cases {
		if got := Capacity(c.e, c.h, plT0, plT0.Add(c.age)); got != c.want {
			t.Errorf("Capacity(%s, %s, %s) = %d, want %d", c.e, c.h, c.age, got, c.want)
		}
	}
	// Through the state: no sends in the window means multiplier 1.
	h := newPlHarness(t, Config{})
	h.hb(1, domain.TierSharedPremium, domain.EgressOAuthAPI)
	h.mature()
	if c := h.worker(1).Capacity; c != 400 {
		t.Fatalf("mature oauth worker capacity %d", c)
	}
	h.sample(1, 1000, 0, 4) // 0.4 % complaints: throttled
	if v := h.worker(1); v.Health != domain.HealthThrottled || v.Capacity != 200 {
		t.Fatalf("after sample: %+v", v)
	}
	h.sample(1, 0, 0, 0)
	if v := h.worker(1); v.Health != domain.HealthHealthy || v.Capacity != 400 {
		t.Fatalf("after an empty sample: %+v", v)
	}
}

func TestPlacementWorkerHealthThresholds(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cases := []struct {
		prev                       domain.HealthState
		sends, bounces, complaints int64
		want                       domain.HealthState
	}{
		{domain.HealthBlocked, 0, 0, 0, domain.HealthHealthy},
		{domain.HealthHealthy, 10000, 0, 9, domain.HealthHealthy},
		{domain.HealthHealthy, 10000, 0, 10, domain.HealthWatch},
		{domain.HealthHealthy, 10000, 0, 30, domain.HealthThrottled},
		{domain.HealthHealthy, 10000, 0, 50, domain.HealthQuarantined},
		{domain.HealthHealthy, 10000, 0, 100, domain.HealthBlocked},
		{domain.HealthHealthy, 10000, 199, 0, domain.HealthHealthy},
		{domain.HealthHealthy, 10000, 200, 0, domain.HealthWatch},
		{domain.HealthHealthy, 10000, 500, 0, domain.HealthThrottled},
		{domain.HealthHealthy, 10000, 800, 0, domain.HealthQuarantined},
		{domain.HealthHealthy, 10000, 1000, 0, domain.HealthBlocked},
		{domain.HealthHealthy, 10000, 250, 60, domain.HealthQuarantined}, // the worse of the two
		{domain.HealthThrottled, 50, 50, 50, domain.HealthThrottled},     // too few sends: unchanged
		{domain.HealthHealthy, domain.MaxCount, domain.MaxCount, domain.MaxCount, domain.HealthBlocked},
	}
	for _, c := range cases {
		s := &domain.WorkerHealthSampled{Sends: c.sends, HardBounces: c.bounces, Complaints: c.complaints}
		if got := cfg.WorkerHealth(c.prev, s); got != c.want {
			t.Errorf("WorkerHealth(%s, %d/%d/%d) = %s, want %s", c.prev, c.sends, c.bounces, c.complaints, got, c.want)
		}
	}
	// Only healthy and watch workers take new mailboxes.
	h := newPlHarness(t, Config{})
	h.hb(1, domain.TierSharedFree, domain.EgressColdSMTP)
	h.hb(2, domain.TierSharedFree, domain.EgressColdSMTP)
	h.sample(1, 10000, 0, 30) // throttled
	h.sample(2, 10000, 0, 10) // watch
	h.add(1, 1, domain.ProviderSMTPIMAP, false)
	h.on(1, 2)
	h.sample(2, 10000, 0, 50) // quarantined
	ds := h.add(2, 1, domain.ProviderSMTPIMAP, false)
	if r := plOf[*domain.PlacementRefused](ds); len(r) != 1 {
		t.Fatalf("want a refusal, got %v", plTypes(ds))
	}
	h.on(1, 2)                // worker health alone does not move placed mailboxes
	ds = h.sample(1, 0, 0, 0) // recovers: capacity appears, the pending mailbox is placed
	if a := plOf[*domain.PlacementAssigned](ds); len(a) != 1 || a[0].WorkerID != plWorker(1) || a[0].Reason != domain.ReasonRetry {
		t.Fatalf("want the pending mailbox placed on worker 1, got %s", plJSON(ds))
	}
}

func TestPlacementTierSeparation(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{})
	h.hb(1, domain.TierSharedFree, domain.EgressColdSMTP)    // capacity 4 (new)
	h.hb(2, domain.TierSharedPremium, domain.EgressOAuthAPI) // capacity 100
	h.hb(3, "", domain.EgressOAuthAPI)                       // blank tier: shared premium
	if v := h.worker(3); v.Tier != domain.TierSharedPremium {
		t.Fatalf("blank tier registered as %s", v.Tier)
	}
	h.plan(2, domain.PlanPremium, 0, true)
	h.add(1, 1, domain.ProviderSMTPIMAP, false) // org 1: no plan, free
	h.on(1, 1)
	h.add(2, 2, domain.ProviderSMTPIMAP, false)
	if w := h.mailbox(2).WorkerID; w != plWorker(2) && w != plWorker(3) {
		t.Fatalf("premium mailbox on %s", w)
	}
	for i := 3; i <= 5; i++ {
		h.add(i, 1, domain.ProviderSMTPIMAP, false)
		h.on(i, 1)
	}
	// The free worker is full; premium workers have room, yet a free
	// mailbox is refused (the harness checks the refusal was justified).
	ds := h.add(6, 1, domain.ProviderSMTPIMAP, false)
	r := plOf[*domain.PlacementRefused](ds)
	if len(r) != 1 || r[0].Tier != domain.TierSharedFree || r[0].Cause != domain.ReasonMailboxAdded {
		t.Fatalf("want a refusal for shared_free, got %s", plJSON(ds))
	}
	h.on(6, 0)
	// Premium plan but unpaid: free.
	h.plan(3, domain.PlanPremium, 0, false)
	ds = h.add(7, 3, domain.ProviderGmail, false)
	if len(plOf[*domain.PlacementRefused](ds)) != 1 {
		t.Fatalf("unpaid org placed: %s", plJSON(ds))
	}
	// A new free worker takes the pending ones, oldest first.
	ds = h.hb(4, domain.TierSharedFree, domain.EgressOAuthAPI)
	if got := plOf[*domain.PlacementAssigned](ds); len(got) != 2 || got[0].MailboxID != plMailbox(6) || got[1].MailboxID != plMailbox(7) {
		t.Fatalf("retry on a new worker: %s", plJSON(ds))
	}
}

func TestPlacementDedicatedTierNotAccepted(t *testing.T) {
	t.Parallel()
	hb := &domain.WorkerHeartbeat{WorkerID: plWorker(1), Tier: domain.TierDedicated, Egress: domain.EgressColdSMTP, Address: "x:25"}
	if ps := hb.Validate(); !ps.Has(domain.CodeTierNotAllowed) {
		t.Fatalf("validation: %v", ps)
	}
	h := newPlHarness(t, Config{})
	if ds := h.apply(hb); len(ds) != 0 {
		t.Fatalf("dedicated heartbeat decided %v", plTypes(ds))
	}
	if _, ok := h.live.Worker(plWorker(1)); ok {
		t.Fatal("worker asking for dedicated was registered")
	}
	// A decision claiming a worker registered as dedicated does not validate.
	d := &domain.PlacementWorkerRegistered{PlacementMeta: domain.PlacementMeta{At: plT0, Reason: domain.ReasonWorkerRegistered},
		WorkerID: plWorker(1), Tier: domain.TierDedicated, Egress: domain.EgressColdSMTP, Capacity: 4}
	if ps := d.Validate(); len(ps) == 0 {
		t.Fatal("dedicated registration validated")
	}
}

func TestPlacementDedicatedBindPromoteDegradeRetry(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{})
	h.hb(1, domain.TierSharedPremium, domain.EgressOAuthAPI)
	h.hb(2, domain.TierSharedPremium, domain.EgressOAuthAPI)
	h.plan(9, domain.PlanPremium, 0, true)
	h.add(90, 9, domain.ProviderGmail, false) // worker 1 (lowest id) is no longer idle
	h.on(90, 1)
	// Org 1 goes dedicated with 2 workers: worker 2 is the only idle one.
	ds := h.plan(1, domain.PlanDedicated, 2, true)
	if want := []string{"placement.plan_recorded", "placement.worker_promoted", "placement.dedicated_bound"}; !reflect.DeepEqual(plTypes(ds), want) {
		t.Fatalf("plan change decided %v", plTypes(ds))
	}
	if v := h.worker(2); v.Tier != domain.TierDedicated || v.DedicatedOrg != plOrg(1) {
		t.Fatalf("worker 2: %+v", v)
	}
	if o, _ := h.live.Org(plOrg(1)); o.Shortfall != 1 {
		t.Fatalf("org 1 shortfall %d", o.Shortfall)
	}
	h.add(10, 1, domain.ProviderSMTPIMAP, false)
	h.on(10, 2)
	// Org 2 goes dedicated: nothing idle, so its mailbox is degraded onto
	// shared premium (justified by the harness) and pending.
	h.plan(2, domain.PlanDedicated, 1, true)
	ds = h.add(20, 2, domain.ProviderSMTPIMAP, false)
	if a := plOf[*domain.PlacementAssigned](ds); len(a) != 1 || !a[0].Degraded || a[0].WorkerID != plWorker(1) {
		t.Fatalf("want a degraded placement on worker 1: %s", plJSON(ds))
	}
	if p := h.live.Pending(); len(p) != 1 || p[0].ID != plMailbox(20) || p[0].PendingReason != domain.ReasonNoDedicatedCapacity {
		t.Fatalf("pending: %+v", p)
	}
	// A new premium worker: org 1 planned first, so it waits longer and gets it.
	ds = h.hb(3, domain.TierSharedPremium, domain.EgressOAuthAPI)
	if b := plOf[*domain.PlacementDedicatedBound](ds); len(b) != 1 || b[0].OrgID != plOrg(1) || b[0].WorkerID != plWorker(3) {
		t.Fatalf("worker 3 not bound to org 1: %s", plJSON(ds))
	}
	// Another one: org 2 gets it and its degraded mailbox moves there.
	ds = h.hb(4, domain.TierSharedPremium, domain.EgressOAuthAPI)
	m := plOf[*domain.PlacementMigrated](ds)
	if b := plOf[*domain.PlacementDedicatedBound](ds); len(b) != 1 || b[0].OrgID != plOrg(2) || len(m) != 1 ||
		m[0].ToWorker != plWorker(4) || m[0].Reason != domain.ReasonDedicatedAvailable || m[0].Degraded {
		t.Fatalf("org 2 not upgraded: %s", plJSON(ds))
	}
	if len(h.live.Pending()) != 0 {
		t.Fatalf("pending left: %+v", h.live.Pending())
	}
}

func TestPlacementDedicatedOneOrgPerWorker(t *testing.T) {
	t.Parallel()
	// The predecessor let two orgs bind the same dedicated worker. Here two
	// orgs want one each and there is one idle worker.
	h := newPlHarness(t, Config{})
	h.hb(1, domain.TierSharedPremium, domain.EgressOAuthAPI)
	h.plan(1, domain.PlanDedicated, 1, true)
	h.plan(2, domain.PlanDedicated, 1, true)
	h.add(10, 1, domain.ProviderGmail, false)
	h.add(20, 2, domain.ProviderGmail, false)
	h.on(10, 1)
	h.on(20, 0) // no shared premium worker left either: refused
	if v := h.worker(1); v.DedicatedOrg != plOrg(1) {
		t.Fatalf("worker 1 bound to %q", v.DedicatedOrg)
	}
	// The fold itself refuses a second binding.
	err := h.live.ApplyDecision(&domain.PlacementDedicatedBound{PlacementMeta: domain.PlacementMeta{At: h.now, Reason: domain.ReasonDedicatedNeeded}, WorkerID: plWorker(1), OrgID: plOrg(2)})
	if err == nil {
		t.Fatal("a bound worker was bound to a second org")
	}
	if err := Invariants(h.live); err != nil {
		t.Fatal(err)
	}
	// Org 1 drops to premium: the worker is released, its mailbox moves off
	// as soon as there is shared premium room, then it goes to org 2.
	ds := h.plan(1, domain.PlanPremium, 0, true)
	if want := []string{"placement.plan_recorded", "placement.dedicated_released"}; !reflect.DeepEqual(plTypes(ds), want) {
		t.Fatalf("release: %v", plTypes(ds))
	}
	if v := h.worker(1); !v.Releasing || v.Mailboxes != 1 {
		t.Fatalf("worker 1 should be released but still carrying org 1's mailbox: %+v", v)
	}
	h.hb(2, domain.TierSharedPremium, domain.EgressOAuthAPI)
	// Worker 2: org 2 is short and worker 2 is idle -> bound to org 2 first;
	// mailbox 10 then needs shared premium: nothing, it stays on worker 1.
	if v := h.worker(2); v.DedicatedOrg != plOrg(2) {
		t.Fatalf("worker 2: %+v", v)
	}
	h.on(20, 2)
	h.hb(3, domain.TierSharedPremium, domain.EgressOAuthAPI)
	h.on(10, 3)
	if v := h.worker(1); v.Tier != domain.TierSharedPremium || v.DedicatedOrg != "" || v.Releasing {
		t.Fatalf("worker 1 did not revert once idle: %+v", v)
	}
}

func TestPlacementDedicatedReleaseAndHandOver(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{})
	for i := 1; i <= 3; i++ {
		h.hb(i, domain.TierSharedPremium, domain.EgressOAuthAPI)
	}
	h.plan(1, domain.PlanDedicated, 2, true)
	for i := 1; i <= 5; i++ {
		h.add(i, 1, domain.ProviderGmail, false)
	}
	w1, w2 := h.worker(1), h.worker(2)
	if w1.DedicatedOrg != plOrg(1) || w2.DedicatedOrg != plOrg(1) || w1.Mailboxes+w2.Mailboxes != 5 {
		t.Fatalf("workers 1, 2: %+v %+v", w1, w2)
	}
	// Org 2 wants one too: worker 3 is idle.
	h.plan(2, domain.PlanDedicated, 2, true)
	if o, _ := h.live.Org(plOrg(2)); o.Shortfall != 1 || !slices.Equal(o.Bound, []string{plWorker(3)}) {
		t.Fatalf("org 2: %+v", o)
	}
	// Org 1 drops to one worker: the least loaded (worker 2, 2 mailboxes)
	// is released; its mailboxes move to worker 1; idle, it goes straight to
	// org 2, which waits for one.
	ds := h.plan(1, domain.PlanDedicated, 1, true)
	rel := plOf[*domain.PlacementDedicatedReleased](ds)
	mig := plOf[*domain.PlacementMigrated](ds)
	bound := plOf[*domain.PlacementDedicatedBound](ds)
	if len(rel) != 1 || rel[0].WorkerID != plWorker(2) || len(mig) != 2 || len(bound) != 1 || bound[0].OrgID != plOrg(2) {
		t.Fatalf("release and hand-over: %s", plJSON(ds))
	}
	for _, m := range mig {
		if m.FromWorker != plWorker(2) || m.ToWorker != plWorker(1) || m.Reason != domain.ReasonPlanChanged {
			t.Fatalf("migration %+v", m)
		}
	}
	if mig[0].MailboxID > mig[1].MailboxID {
		t.Fatal("plan migrations not in mailbox order")
	}
	// Org 2 ends its dedicated plan: both workers released and, idle,
	// reverted to shared premium.
	ds = h.plan(2, domain.PlanPremium, 0, true)
	if rv := plOf[*domain.PlacementWorkerReverted](ds); len(rv) != 2 || rv[0].ToTier != domain.TierSharedPremium {
		t.Fatalf("revert: %s", plJSON(ds))
	}
	// A dedicated org's risky mailbox stays on its dedicated worker: no
	// risk pools on dedicated workers.
	ds = h.score(1, domain.HealthBlocked)
	if len(plOf[*domain.PlacementMigrated](ds)) != 0 || h.mailbox(1).Band != domain.RiskQuarantine {
		t.Fatalf("dedicated mailbox moved on band change: %s", plJSON(ds))
	}
	h.on(1, 1)
}

func TestPlacementRiskSegregationBothDirections(t *testing.T) {
	t.Parallel()
	// The predecessor kept risky mailboxes off clean workers but let clean
	// mailboxes land on risky ones. Both directions are strict here.
	h := newPlHarness(t, Config{})
	h.hb(1, domain.TierSharedFree, domain.EgressColdSMTP) // capacity 4
	h.hb(2, domain.TierSharedFree, domain.EgressOAuthAPI) // capacity 100
	h.add(1, 1, domain.ProviderSMTPIMAP, false)
	h.on(1, 1) // lowest id among idle workers
	// Mailbox 1 turns risky: worker 2 is idle and clean, promoted to risky.
	ds := h.score(1, domain.HealthWatch)
	if want := []string{"placement.band_changed", "placement.worker_promoted", "placement.migrated"}; !reflect.DeepEqual(plTypes(ds), want) {
		t.Fatalf("band change: %v", plTypes(ds))
	}
	m := plOf[*domain.PlacementMigrated](ds)[0]
	if m.FromWorker != plWorker(1) || m.ToWorker != plWorker(2) || m.FromBand != domain.RiskClean || m.ToBand != domain.RiskRisky || m.Reason != domain.ReasonBandChanged {
		t.Fatalf("migration %+v", m)
	}
	if h.worker(2).Pool != domain.RiskRisky || h.worker(1).Pool != domain.RiskClean {
		t.Fatalf("pools: %+v %+v", h.worker(1), h.worker(2))
	}
	// Fill the clean worker (capacity 4): clean mailboxes never go to the
	// risky worker with its 99 free units.
	for i := 2; i <= 5; i++ {
		h.add(i, 1, domain.ProviderSMTPIMAP, false)
		h.on(i, 1)
	}
	ds = h.add(6, 1, domain.ProviderSMTPIMAP, false)
	if r := plOf[*domain.PlacementRefused](ds); len(r) != 1 || r[0].Band != domain.RiskClean {
		t.Fatalf("clean mailbox not refused: %s", plJSON(ds))
	}
	h.on(6, 0)
	// Risky mailboxes go to the risky worker, never the clean one.
	h.score(2, domain.HealthThrottled)
	h.on(2, 2)
	// The clean worker now has room: the pending mailbox is placed on the
	// next tick.
	ds = h.tick()
	if a := plOf[*domain.PlacementAssigned](ds); len(a) != 1 || a[0].WorkerID != plWorker(1) {
		t.Fatalf("retry: %s", plJSON(ds))
	}
	for _, v := range h.live.Snapshot().Mailboxes {
		if v.WorkerID == "" {
			continue
		}
		if w, _ := h.live.Worker(v.WorkerID); w.Pool != v.Band {
			t.Fatalf("mailbox %s band %s on pool %s", v.ID, v.Band, w.Pool)
		}
	}
}

func TestPlacementRiskPoolPromotionRefusalRetryAndRevert(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{})
	h.hb(1, domain.TierSharedPremium, domain.EgressOAuthAPI)
	h.hb(2, domain.TierSharedPremium, domain.EgressOAuthAPI)
	h.plan(1, domain.PlanPremium, 0, true)
	h.add(1, 1, domain.ProviderGmail, false)
	h.add(2, 1, domain.ProviderGmail, false)
	h.on(1, 1)
	h.on(2, 2) // worker 2 had the lowest utilisation (0) after mailbox 1
	h.add(3, 1, domain.ProviderGmail, false)
	// Mailbox 3 goes quarantined: no quarantine worker, nothing idle.
	ds := h.score(3, domain.HealthQuarantined)
	r := plOf[*domain.PlacementRefused](ds)
	if len(r) != 1 || r[0].FromWorker == "" || r[0].Band != domain.RiskQuarantine || r[0].FromBand != domain.RiskClean || r[0].Cause != domain.ReasonBandChanged {
		t.Fatalf("want a refusal moving off: %s", plJSON(ds))
	}
	h.on(3, 0)
	// A new worker appears: promoted into quarantine, mailbox placed.
	ds = h.hb(3, domain.TierSharedPremium, domain.EgressColdSMTP)
	if want := []string{"placement.worker_registered", "placement.worker_promoted", "placement.assigned"}; !reflect.DeepEqual(plTypes(ds), want) {
		t.Fatalf("retry: %v", plTypes(ds))
	}
	if v := h.worker(3); v.Pool != domain.RiskQuarantine {
		t.Fatalf("worker 3 pool %s", v.Pool)
	}
	// Removal empties the pool worker: back to clean at once.
	ds = h.remove(3)
	if u := plOf[*domain.PlacementUnassigned](ds); len(u) != 1 || u[0].WorkerID != plWorker(3) {
		t.Fatalf("removal: %s", plJSON(ds))
	}
	if rv := plOf[*domain.PlacementWorkerReverted](ds); len(rv) != 1 || rv[0].FromPool != domain.RiskQuarantine || rv[0].ToPool != domain.RiskClean {
		t.Fatalf("revert: %s", plJSON(ds))
	}
}

func TestPlacementBandHysteresis(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{BandDwell: time.Hour})
	h.hb(1, domain.TierSharedFree, domain.EgressOAuthAPI)
	h.hb(2, domain.TierSharedFree, domain.EgressOAuthAPI)
	h.hb(3, domain.TierSharedFree, domain.EgressOAuthAPI)
	h.add(1, 1, domain.ProviderGmail, false)
	var all []domain.PlacementDecision
	// A score hovering on the healthy/watch threshold for 5 hours.
	for i := range 30 {
		h.advance(10 * time.Minute)
		h.beatAll()
		st := domain.HealthHealthy
		if i%2 == 0 {
			st = domain.HealthWatch
		}
		all = append(all, h.score(1, st)...)
	}
	bc := plOf[*domain.PlacementBandChanged](all)
	if len(bc) != 1 || bc[0].ToBand != domain.RiskRisky || len(plOf[*domain.PlacementMigrated](all)) != 1 {
		t.Fatalf("flapping: %d band changes, %d migrations", len(bc), len(plOf[*domain.PlacementMigrated](all)))
	}
	// The last score was healthy; a watch one cancels that recovery.
	h.advance(10 * time.Minute)
	h.score(1, domain.HealthWatch)
	// Healthy for good: the first score starts a recovery, later ones
	// within the dwell change nothing, the first at or after the dwell
	// moves the mailbox back.
	h.advance(10 * time.Minute)
	ds := h.score(1, domain.HealthHealthy)
	if held := plOf[*domain.PlacementBandHeld](ds); len(held) != 1 || held[0].Candidate != domain.RiskClean {
		t.Fatalf("recovery start: %s", plJSON(ds))
	}
	h.advance(30 * time.Minute)
	if ds := h.score(1, domain.HealthHealthy); len(ds) != 0 {
		t.Fatalf("within dwell: %v", plTypes(ds))
	}
	// A watch score in between would restart it; instead a better one.
	h.advance(30 * time.Minute)
	ds = h.score(1, domain.HealthHealthy)
	if bc := plOf[*domain.PlacementBandChanged](ds); len(bc) != 1 || bc[0].ToBand != domain.RiskClean || bc[0].Reason != domain.ReasonBandImproved {
		t.Fatalf("after dwell: %s", plJSON(ds))
	}
	if m := plOf[*domain.PlacementMigrated](ds); len(m) != 1 || m[0].FromBand != domain.RiskRisky || m[0].ToBand != domain.RiskClean {
		t.Fatalf("migration back: %s", plJSON(ds))
	}
	// Quarantine recovering through mixed better scores: the worst of them.
	h.score(1, domain.HealthBlocked)
	h.score(1, domain.HealthHealthy)
	h.advance(20 * time.Minute)
	h.score(1, domain.HealthThrottled)
	h.advance(40 * time.Minute)
	ds = h.score(1, domain.HealthHealthy)
	if bc := plOf[*domain.PlacementBandChanged](ds); len(bc) != 1 || bc[0].ToBand != domain.RiskRisky {
		t.Fatalf("mixed recovery: %s", plJSON(ds))
	}
	// A score at the current band cancels a recovery.
	h.score(1, domain.HealthHealthy)
	ds = h.score(1, domain.HealthWatch)
	if held := plOf[*domain.PlacementBandHeld](ds); len(held) != 1 || held[0].Candidate != "" || held[0].Reason != domain.ReasonBandRecoveryCancelled {
		t.Fatalf("cancel: %s", plJSON(ds))
	}
}

func TestPlacementLowestUtilisationAndHeadroom(t *testing.T) {
	t.Parallel()
	// Worker 1: capacity 4, load 3.4 (utilisation 0.85, headroom 0.6).
	// Worker 2: capacity 16, load 15 (utilisation 0.9375, headroom 1).
	// Worker 3: capacity 16, load 15.4 (utilisation 0.9625, headroom 0.6).
	snap := Snapshot{}
	for i, c := range []int64{4, 16, 16} {
		snap.Workers = append(snap.Workers, WorkerView{
			ID: plWorker(i + 1), BaseTier: domain.TierSharedFree, Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Pool: domain.RiskClean,
			Health: domain.HealthHealthy, FirstSeen: plT0, LastSeen: plT0, Live: true, Capacity: c,
		})
	}
	n := 0
	put := func(w int, weight int64, k int) {
		for range k {
			n++
			snap.Mailboxes = append(snap.Mailboxes, MailboxView{ID: plMailbox(n), OrgID: plOrg(1), Weight: weight, Band: domain.RiskClean, WorkerID: plWorker(w)})
			snap.Workers[w-1].Load += weight
		}
	}
	put(1, 1000, 3)
	put(1, 400, 1)
	put(2, 1000, 15)
	put(3, 1000, 15)
	put(3, 400, 1)
	h := plHarnessFrom(t, Config{}, snap, plT0)
	// Weight 1: worker 1 has the lowest utilisation but no headroom for 1;
	// worker 2 has headroom 1 exactly.
	ds := h.add(100, 1, domain.ProviderSMTPIMAP, false)
	if a := plOf[*domain.PlacementAssigned](ds); len(a) != 1 || a[0].WorkerID != plWorker(2) {
		t.Fatalf("weight 1: %s", plJSON(ds))
	}
	// Weight 0.4: worker 1 (0.85) beats worker 3 (0.9625).
	ds = h.add(101, 1, domain.ProviderSMTPIMAP, true)
	if a := plOf[*domain.PlacementAssigned](ds); len(a) != 1 || a[0].WorkerID != plWorker(1) {
		t.Fatalf("weight 0.4: %s", plJSON(ds))
	}
	// Worker 1 now 3.8/4 (0.95), worker 3 15.4/16 (0.9625): weight 0.05 to 1.
	ds = h.add(102, 1, domain.ProviderGmail, false)
	if a := plOf[*domain.PlacementAssigned](ds); len(a) != 1 || a[0].WorkerID != plWorker(1) {
		t.Fatalf("weight 0.05: %s", plJSON(ds))
	}
	// Ties on utilisation go to the lower id.
	h2 := newPlHarness(t, Config{})
	for _, i := range []int{5, 3, 4} {
		h2.hb(i, domain.TierSharedFree, domain.EgressOAuthAPI)
	}
	for i, want := range []int{3, 4, 5, 3} {
		h2.add(i+1, 1, domain.ProviderGmail, false)
		h2.on(i+1, want)
	}
}

func TestPlacementLivenessDeadWorkerReplaced(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{HeartbeatInterval: 10 * time.Second})
	h.hb(1, domain.TierSharedFree, domain.EgressOAuthAPI)
	h.add(1, 1, domain.ProviderGmail, false)
	h.add(2, 1, domain.ProviderGmail, false)
	h.hb(2, domain.TierSharedFree, domain.EgressOAuthAPI)
	h.on(1, 1)
	h.on(2, 1)
	// Worker 2 keeps heartbeating; worker 1 goes silent.
	for range 3 {
		h.advance(10 * time.Second)
		h.hb(2, domain.TierSharedFree, domain.EgressOAuthAPI)
	}
	if ds := h.tick(); len(ds) != 0 { // exactly 30 s: still live
		t.Fatalf("at the window: %v", plTypes(ds))
	}
	h.advance(time.Second)
	ds := h.tick()
	if want := []string{"placement.worker_died", "placement.migrated", "placement.migrated"}; !reflect.DeepEqual(plTypes(ds), want) {
		t.Fatalf("expiry: %v", plTypes(ds))
	}
	for _, m := range plOf[*domain.PlacementMigrated](ds) {
		if m.FromWorker != plWorker(1) || m.ToWorker != plWorker(2) || m.Reason != domain.ReasonWorkerDied {
			t.Fatalf("migration %+v", m)
		}
	}
	if v := h.worker(1); v.Live || v.Load != 0 {
		t.Fatalf("dead worker: %+v", v)
	}
	// Worker 2 dies too: nothing left, mailboxes refused into pending.
	h.advance(31 * time.Second)
	ds = h.tick()
	if r := plOf[*domain.PlacementRefused](ds); len(r) != 2 || r[0].Cause != domain.ReasonWorkerDied || r[0].FromWorker != plWorker(2) {
		t.Fatalf("second expiry: %s", plJSON(ds))
	}
	// Worker 1 comes back: revived, takes the pending mailboxes.
	ds = h.hb(1, domain.TierSharedFree, domain.EgressOAuthAPI)
	if c := plOf[*domain.PlacementWorkerChanged](ds); len(c) != 1 || c[0].Reason != domain.ReasonWorkerRevived {
		t.Fatalf("revival: %s", plJSON(ds))
	}
	h.on(1, 1)
	h.on(2, 1)
}

func TestPlacementStoppingDrains(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{})
	h.hb(1, domain.TierSharedFree, domain.EgressColdSMTP) // capacity 4
	h.hb(2, domain.TierSharedFree, domain.EgressColdSMTP) // capacity 4
	for i := 1; i <= 6; i++ {
		h.add(i, 1, domain.ProviderSMTPIMAP, false)
	}
	// 3 each: the lowest utilisation alternates, ties by id.
	ds := h.stop(1)
	// Worker 2 has room for one more: one moves, two stay (still sending).
	if m := plOf[*domain.PlacementMigrated](ds); len(m) != 1 || m[0].Reason != domain.ReasonWorkerStopping {
		t.Fatalf("drain: %s", plJSON(ds))
	}
	if v := h.worker(1); v.Mailboxes != 2 || !v.Stopping {
		t.Fatalf("worker 1: %+v", v)
	}
	// New mailboxes never go to the stopping worker.
	ds = h.add(7, 1, domain.ProviderSMTPIMAP, false)
	if len(plOf[*domain.PlacementRefused](ds)) != 1 {
		t.Fatalf("placed on a stopping worker: %s", plJSON(ds))
	}
	// Capacity appears: the drain finishes, then the pending one.
	ds = h.hb(3, domain.TierSharedFree, domain.EgressColdSMTP)
	if len(plOf[*domain.PlacementMigrated](ds)) != 2 || len(plOf[*domain.PlacementAssigned](ds)) != 1 {
		t.Fatalf("after capacity: %s", plJSON(ds))
	}
	if v := h.worker(1); v.Mailboxes != 0 {
		t.Fatalf("worker 1 not drained: %+v", v)
	}
}

func TestPlacementPlanMigrationSequence(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{})
	h.hb(1, domain.TierSharedFree, domain.EgressOAuthAPI)
	h.hb(5, domain.TierSharedFree, domain.EgressOAuthAPI)
	h.hb(2, domain.TierSharedPremium, domain.EgressOAuthAPI)
	h.hb(3, domain.TierSharedPremium, domain.EgressOAuthAPI)
	for i := 1; i <= 4; i++ {
		h.add(i, 1, domain.ProviderGmail, false)
		h.on(i, 1+4*((i+1)%2)) // alternating between the idle workers 1 and 5
	}
	// Mailbox 4 turns risky: no risky free worker, none idle to promote.
	if r := plOf[*domain.PlacementRefused](h.score(4, domain.HealthThrottled)); len(r) != 1 {
		t.Fatal("risky mailbox 4 not refused")
	}
	order := func(ds []domain.PlacementDecision) []string {
		var ids []string
		for _, d := range ds {
			switch d := d.(type) {
			case *domain.PlacementMigrated:
				ids = append(ids, d.MailboxID)
			case *domain.PlacementRefused:
				ids = append(ids, d.MailboxID)
			}
		}
		return ids
	}
	// free -> premium: every mailbox leaves the free workers in id order;
	// the pending risky one finds no idle premium worker and stays pending.
	ds := h.plan(1, domain.PlanPremium, 0, true)
	if got := order(ds); !slices.IsSorted(got) || len(got) != 3 {
		t.Fatalf("free->premium: %s", plJSON(ds))
	}
	for i := 1; i <= 4; i++ {
		v := h.mailbox(i)
		if w, _ := h.live.Worker(v.WorkerID); v.WorkerID != "" && w.Tier != domain.TierSharedPremium {
			t.Fatalf("mailbox %d on %s", i, w.Tier)
		}
	}
	h.on(4, 0)
	if v := h.worker(5); v.Pool != domain.RiskClean || v.Mailboxes != 0 {
		t.Fatalf("worker 5 after its mailboxes left: %+v", v)
	}
	// A new premium worker is promoted into the risky pool for mailbox 4.
	h.hb(4, domain.TierSharedPremium, domain.EgressOAuthAPI)
	h.on(4, 4)
	// premium -> dedicated(1): an idle premium worker is promoted, every
	// mailbox moves onto it, risky or not.
	h.hb(6, domain.TierSharedPremium, domain.EgressOAuthAPI)
	ds = h.plan(1, domain.PlanDedicated, 1, true)
	if got := order(ds); !slices.IsSorted(got) {
		t.Fatalf("premium->dedicated order: %v", got)
	}
	o, _ := h.live.Org(plOrg(1))
	if len(o.Bound) != 1 {
		t.Fatalf("org 1 bound %v", o.Bound)
	}
	for i := 1; i <= 4; i++ {
		if v := h.mailbox(i); v.WorkerID != o.Bound[0] {
			t.Fatalf("mailbox %d not on the dedicated worker: %+v", i, v)
		}
	}
	// dedicated -> subscription ended: everything back to free; the
	// dedicated worker is released and reverts once idle.
	ds = h.plan(1, domain.PlanDedicated, 1, false)
	if got := order(ds); !slices.IsSorted(got) || len(got) != 4 {
		t.Fatalf("ended: %s", plJSON(ds))
	}
	if v, _ := h.live.Worker(o.Bound[0]); v.Tier != domain.TierSharedPremium || v.Mailboxes != 0 {
		t.Fatalf("released worker: %+v", v)
	}
	for i := 1; i <= 4; i++ {
		v := h.mailbox(i)
		if w, _ := h.live.Worker(v.WorkerID); v.WorkerID != "" && w.Tier != domain.TierSharedFree {
			t.Fatalf("mailbox %d on %s after subscription end", i, w.Tier)
		}
	}
}

func TestPlacementConcurrentPlanChanges(t *testing.T) {
	t.Parallel()
	// The predecessor ran plan migrations in goroutines that raced. Here two
	// plan changes in a row (same instant) are decided in order, each a
	// complete sequence, and the state after both is the second plan's.
	h := newPlHarness(t, Config{})
	for i := 1; i <= 4; i++ {
		h.hb(i, domain.TierSharedPremium, domain.EgressOAuthAPI)
	}
	h.hb(5, domain.TierSharedFree, domain.EgressOAuthAPI)
	h.plan(1, domain.PlanPremium, 0, true)
	h.plan(2, domain.PlanPremium, 0, true)
	for i := 1; i <= 6; i++ {
		h.add(i, 1+i%2, domain.ProviderGmail, false)
	}
	h.plan(1, domain.PlanDedicated, 2, true)
	h.plan(2, domain.PlanDedicated, 2, true)
	h.plan(1, domain.PlanFree, 0, true)
	h.plan(2, domain.PlanDedicated, 3, true)
	h.plan(2, domain.PlanPremium, 0, true)
	h.plan(2, domain.PlanDedicated, 1, true)
	for _, v := range h.live.Snapshot().Mailboxes {
		w, _ := h.live.Worker(v.WorkerID)
		switch v.OrgID {
		case plOrg(1):
			if w.Tier != domain.TierSharedFree {
				t.Fatalf("org 1 mailbox %s on %s", v.ID, w.Tier)
			}
		case plOrg(2):
			if w.Tier != domain.TierDedicated || w.DedicatedOrg != plOrg(2) {
				t.Fatalf("org 2 mailbox %s on %+v", v.ID, w)
			}
		}
	}
	dedicated := 0
	for _, w := range h.live.Snapshot().Workers {
		if w.Tier == domain.TierDedicated {
			dedicated++
		}
	}
	if dedicated != 1 {
		t.Fatalf("%d dedicated workers, want 1", dedicated)
	}
}

func TestPlacementRemovalReachesWorker(t *testing.T) {
	t.Parallel()
	// The predecessor's removal never reached the worker. Here the removal
	// is a decision naming the worker, and the load is freed at once.
	h := newPlHarness(t, Config{})
	h.hb(1, domain.TierSharedFree, domain.EgressColdSMTP)
	h.add(1, 1, domain.ProviderSMTPIMAP, true)
	ds := h.remove(1)
	u := plOf[*domain.PlacementUnassigned](ds)
	if len(u) != 1 || u[0].WorkerID != plWorker(1) || u[0].Weight != 400 || u[0].Detail != "deleted by user" || u[0].Reason != domain.ReasonMailboxRemoved {
		t.Fatalf("removal: %s", plJSON(ds))
	}
	if v := h.worker(1); v.Load != 0 || v.Mailboxes != 0 {
		t.Fatalf("worker after removal: %+v", v)
	}
	if ids := h.live.WorkerMailboxes(plWorker(1)); len(ids) != 0 {
		t.Fatalf("worker still lists %v", ids)
	}
	if ds := h.remove(1); len(ds) != 0 {
		t.Fatalf("second removal decided %v", plTypes(ds))
	}
	// A pending mailbox's removal names no worker.
	h.plan(2, domain.PlanPremium, 0, true)
	h.add(2, 2, domain.ProviderSMTPIMAP, false)
	ds = h.remove(2)
	if u := plOf[*domain.PlacementUnassigned](ds); len(u) != 1 || u[0].WorkerID != "" {
		t.Fatalf("pending removal: %s", plJSON(ds))
	}
	// Re-adding after removal places it again.
	h.add(1, 1, domain.ProviderSMTPIMAP, false)
	h.on(1, 1)
}

func TestPlacementLoadExact(t *testing.T) {
	t.Parallel()
	// The predecessor's load counters drifted. Weights of 0.05 summed 20
	// times are exactly 1 here, through adds, removes, moves and deaths.
	h := newPlHarness(t, Config{})
	for i := 1; i <= 3; i++ {
		h.hb(i, domain.TierSharedFree, domain.EgressOAuthAPI)
	}
	provider := []domain.Provider{domain.ProviderGmail, domain.ProviderSMTPIMAP, domain.ProviderOutlook}
	for i := 1; i <= 300; i++ {
		h.add(i, 1, provider[i%3], i%7 == 0)
	}
	for i := 1; i <= 300; i += 3 {
		h.remove(i)
	}
	for i := 2; i <= 300; i += 5 {
		h.score(i, domain.HealthThrottled)
	}
	h.stop(3)
	for i := 2; i <= 300; i += 3 {
		h.remove(i)
	}
	var want int64
	for _, v := range h.live.Snapshot().Mailboxes {
		if v.WorkerID != "" {
			want += v.Weight
		}
	}
	var got int64
	for _, w := range h.live.Snapshot().Workers {
		got += w.Load
	}
	if got != want {
		t.Fatalf("total load %d, mailboxes weigh %d", got, want)
	}
	for i := 3; i <= 300; i += 3 {
		h.remove(i)
	}
	for _, w := range h.live.Snapshot().Workers {
		if w.Load != 0 || w.Mailboxes != 0 || w.Pool != domain.RiskClean {
			t.Fatalf("worker after all removals: %+v", w)
		}
	}
}

func TestPlacementAddIdempotent(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{})
	h.hb(1, domain.TierSharedFree, domain.EgressColdSMTP)
	h.add(1, 1, domain.ProviderSMTPIMAP, false)
	if ds := h.add(1, 1, domain.ProviderSMTPIMAP, false); len(ds) != 0 {
		t.Fatalf("duplicate add decided %v", plTypes(ds))
	}
	if ds := h.add(1, 2, domain.ProviderGmail, true); len(ds) != 0 {
		t.Fatalf("duplicate add with other fields decided %v", plTypes(ds))
	}
	if v := h.worker(1); v.Load != 1000 || v.Mailboxes != 1 {
		t.Fatalf("worker: %+v", v)
	}
}

func TestPlacementWorkerTierChange(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{})
	h.hb(1, domain.TierSharedFree, domain.EgressOAuthAPI)
	h.hb(2, domain.TierSharedFree, domain.EgressColdSMTP) // capacity 4
	for i := 1; i <= 6; i++ {
		h.add(i, 1, domain.ProviderSMTPIMAP, false)
	}
	// Worker 1 becomes premium: its free mailboxes leave at once (they would
	// break invariant 3), refused where nothing fits.
	before := h.worker(1).Mailboxes
	ds := h.hb(1, domain.TierSharedPremium, domain.EgressOAuthAPI)
	if c := plOf[*domain.PlacementWorkerChanged](ds); len(c) != 1 || c[0].Reason != domain.ReasonWorkerTierChanged {
		t.Fatalf("tier change: %s", plJSON(ds))
	}
	if n := len(plOf[*domain.PlacementMigrated](ds)) + len(plOf[*domain.PlacementRefused](ds)); n != before {
		t.Fatalf("%d of %d mailboxes left: %s", n, before, plJSON(ds))
	}
	if v := h.worker(1); v.Tier != domain.TierSharedPremium || v.Mailboxes != 0 {
		t.Fatalf("worker 1: %+v", v)
	}
	// A dedicated worker changing tier is released, drained and reverts to
	// the tier it asked for.
	h.plan(2, domain.PlanDedicated, 1, true)
	h.add(20, 2, domain.ProviderGmail, false)
	h.on(20, 1)
	h.hb(3, domain.TierSharedPremium, domain.EgressOAuthAPI)
	// (Its tier changed a moment ago: the next change waits for the dwell.)
	h.advance(DefaultTierDwell)
	ds = h.hb(1, domain.TierSharedFree, domain.EgressOAuthAPI)
	if v := h.worker(1); v.Tier != domain.TierSharedFree || v.DedicatedOrg != "" {
		t.Fatalf("worker 1 after tier change: %+v %s", v, plJSON(ds))
	}
	h.on(20, 3) // worker 3 bound to org 2 in its place
	if v := h.worker(3); v.DedicatedOrg != plOrg(2) {
		t.Fatalf("worker 3: %+v", v)
	}
}

func TestPlacementRecordsTransitionsNotHeartbeats(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{HeartbeatInterval: 10 * time.Second})
	if ds := h.hb(1, domain.TierSharedFree, domain.EgressColdSMTP); len(ds) != 1 || ds[0].Meta().Reason != domain.ReasonWorkerRegistered {
		t.Fatalf("registration: %s", plJSON(ds))
	}
	// An hour of heartbeats that change nothing: heard, never recorded,
	// and the worker stays live through ticks between them.
	for range 360 {
		h.advance(10 * time.Second)
		if ds := h.hb(1, domain.TierSharedFree, domain.EgressColdSMTP); len(ds) != 0 {
			t.Fatalf("an unchanged heartbeat was recorded: %s", plJSON(ds))
		}
		if ds := h.tick(); len(ds) != 0 {
			t.Fatalf("a tick between heartbeats decided %s", plJSON(ds))
		}
	}
	h.advance(-time.Minute)
	if ds := h.hb(1, domain.TierSharedFree, domain.EgressWarmupOnly); len(ds) != 0 {
		t.Fatalf("stale heartbeat decided %v", plTypes(ds))
	}
	h.advance(time.Minute)
	// A change is recorded.
	h.advance(time.Second)
	if ds := h.hb(1, domain.TierSharedFree, domain.EgressWarmupOnly); len(ds) != 1 || ds[0].Meta().Reason != domain.ReasonWorkerChanged {
		t.Fatalf("egress change: %s", plJSON(ds))
	}
	// Two days of heartbeats every 10 s (17,280): only the capacity ramp
	// is recorded, at each day the effective capacity changes. Warmup base
	// 25: day 1 25 × (0.25 + 0.75/14) = 7.6 -> 7, day 2 8.9 -> 8.
	mark := len(h.log)
	for range 2 * 24 * 360 {
		h.advance(10 * time.Second)
		h.hb(1, domain.TierSharedFree, domain.EgressWarmupOnly)
	}
	var got []string
	for _, d := range h.log[mark:] {
		c, ok := d.(*domain.PlacementWorkerChanged)
		if !ok {
			t.Fatalf("two days of heartbeats decided %s", plJSON(d))
		}
		got = append(got, fmt.Sprintf("%s %d", c.Reason, c.Capacity))
	}
	if want := []string{"capacity_ramp 7", "capacity_ramp 8"}; !slices.Equal(got, want) {
		t.Fatalf("two days of heartbeats recorded %v, want %v", got, want)
	}
	// Silence: the worker dies a window after its last heartbeat heard,
	// and the death records that heartbeat.
	last := h.now
	h.advance(30 * time.Second)
	if ds := h.tick(); len(ds) != 0 {
		t.Fatalf("died at exactly the window: %s", plJSON(ds))
	}
	h.advance(time.Millisecond)
	ds := h.tick()
	if d := plOf[*domain.PlacementWorkerDied](ds); len(d) != 1 || !d[0].LastSeen.Equal(last) {
		t.Fatalf("death after the window: %s (last heard %s)", plJSON(ds), last)
	}
	if v := h.worker(1); !v.LastSeen.Equal(last) {
		t.Fatalf("the fold of the death: last seen %s, want %s", v.LastSeen, last)
	}
}

func TestPlacementGraceAfterRestore(t *testing.T) {
	t.Parallel()
	cfg := Config{HeartbeatInterval: 10 * time.Second}
	h := newPlHarness(t, cfg)
	h.hb(1, domain.TierSharedFree, domain.EgressColdSMTP)
	h.hb(2, domain.TierSharedFree, domain.EgressColdSMTP)
	h.add(10, 1, domain.ProviderSMTPIMAP, false)
	for range 30 { // five minutes of unrecorded heartbeats
		h.advance(10 * time.Second)
		h.hb(1, domain.TierSharedFree, domain.EgressColdSMTP)
		h.hb(2, domain.TierSharedFree, domain.EgressColdSMTP)
	}
	// Failover: a new engine restores the log, which last heard both
	// workers five minutes ago, and grants them a window on its clock.
	h.advance(2 * time.Second)
	takeover := h.now
	st, err := NewStateFromSnapshot(cfg, h.restored.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	st.GrantLiveness(takeover)
	h.live = st
	h.advance(5 * time.Second)
	if ds := h.tick(); len(ds) != 0 {
		t.Fatalf("the restored engine declared workers dead within the grace: %s", plJSON(ds))
	}
	h.advance(5 * time.Second)
	h.hb(1, domain.TierSharedFree, domain.EgressColdSMTP) // worker 1 is heard again; worker 2 is gone
	h.advance(20 * time.Second)
	if ds := h.tick(); len(ds) != 0 { // exactly a window after the takeover
		t.Fatalf("death at the end of the grace: %s", plJSON(ds))
	}
	h.advance(time.Millisecond)
	ds := h.tick()
	d := plOf[*domain.PlacementWorkerDied](ds)
	if len(d) != 1 || d[0].WorkerID != plWorker(2) || !d[0].LastSeen.Equal(takeover) {
		t.Fatalf("after the grace: %s, want worker 2 dead, last seen at the takeover %s", plJSON(ds), takeover)
	}
	if v := h.worker(1); !v.Live {
		t.Fatalf("worker 1, heard within the grace, died: %+v", v)
	}
}

func TestPlacementDecisionJSON(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{WorkerRetention: 36 * time.Hour}) // short enough for a run to forget workers
	plPropertyRun(h, 7, 400)
	seen := map[string]bool{}
	for _, d := range h.log {
		seen[d.EventType()] = true
		raw, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if err := json.Unmarshal(raw, &obj); err != nil {
			t.Fatal(err)
		}
		if _, ok := obj["at"]; !ok {
			t.Fatalf("%s without at: %s", d.EventType(), raw)
		}
		if r, _ := obj["reason"].(string); r == "" {
			t.Fatalf("%s without reason: %s", d.EventType(), raw)
		}
		if d.AggregateID() == "" {
			t.Fatalf("%s without aggregate id", d.EventType())
		}
	}
	for _, typ := range domain.PlacementDecisionTypes() {
		if _, ok := domain.NewPlacementDecision(typ); !ok {
			t.Fatalf("%s not registered", typ)
		}
		if !seen[typ] {
			t.Errorf("%s never emitted by a random run", typ)
		}
	}
	if _, err := domain.DecodePlacementDecision("mailplane.placement.nope.v1", []byte(`{}`)); domain.ErrorCode(err) != domain.CodeUnknownType {
		t.Fatalf("unknown type: %v", err)
	}
	if _, err := domain.DecodePlacementDecision(domain.TypePlacementAssigned, []byte(`{"at":"2026-01-01T00:00:00Z","reason":"mailbox_added","weight_milli":3}`)); domain.ErrorCode(err) == "" {
		t.Fatal("an invalid decision decoded")
	}
	var _ domain.Data = (*domain.PlacementAssigned)(nil)
}

func TestPlacementRestoreFromSnapshotDecidesAlike(t *testing.T) {
	t.Parallel()
	// The engine restores from the projection (a snapshot) and then decides:
	// it must decide exactly as the engine that never stopped, with the
	// default configuration and with one that forgets dead workers.
	for _, cfg := range []Config{{}, plPropertyConfig} {
		plRestoreDecidesAlike(t, cfg)
	}
}

func plRestoreDecidesAlike(t *testing.T, cfg Config) {
	h := newPlHarness(t, cfg)
	plPropertyRun(h, 11, 300)
	// The projection hands its mailboxes over in table order (a
	// sequential scan), not by id: the state must not depend on it.
	snap := h.live.Snapshot()
	rand.New(rand.NewPCG(13, 0)).Shuffle(len(snap.Mailboxes), func(i, j int) {
		snap.Mailboxes[i], snap.Mailboxes[j] = snap.Mailboxes[j], snap.Mailboxes[i]
	})
	restored, err := NewStateFromSnapshot(cfg, snap)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(restored.Snapshot(), h.live.Snapshot()) {
		t.Fatal("snapshot round trip differs")
	}
	// The restored engine grants liveness on its clock; the one that
	// never stopped, granted the same, must decide exactly alike: what it
	// heard beyond the log makes no difference once the grace is given.
	restored.GrantLiveness(h.now)
	h.live.GrantLiveness(h.now)
	gen := newPlGen(99)
	now := h.now
	forgotten := len(plOf[*domain.PlacementWorkerForgotten](h.log))
	for range 300 {
		in := gen.next(&now)
		a, b := h.live.Apply(in), restored.Apply(in)
		if plJSON(a) != plJSON(b) {
			t.Fatalf("decisions differ after restore:\n%s\n%s", plJSON(a), plJSON(b))
		}
		forgotten += len(plOf[*domain.PlacementWorkerForgotten](a))
	}
	if cfg.WorkerRetention != 0 && forgotten == 0 {
		t.Errorf("retention %s: no worker forgotten, the restored heaps are not exercised", cfg.WorkerRetention)
	}
	if !reflect.DeepEqual(restored.Snapshot(), h.live.Snapshot()) {
		t.Fatal("states diverged")
	}
}

// A snapshot naming a mailbox twice, or one on a worker it does not hold,
// restores nothing.
func TestPlacementRestoreRefusesABrokenSnapshot(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{})
	plPropertyRun(h, 5, 100)
	snap := h.live.Snapshot()
	if len(snap.Mailboxes) == 0 {
		t.Fatal("the run placed no mailbox")
	}
	dup := snap
	dup.Mailboxes = append(slices.Clone(snap.Mailboxes), snap.Mailboxes[len(snap.Mailboxes)/2])
	if _, err := NewStateFromSnapshot(Config{}, dup); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("a mailbox twice: %v", err)
	}
	lost := snap
	lost.Mailboxes = slices.Clone(snap.Mailboxes)
	lost.Mailboxes[0].WorkerID, lost.Mailboxes[0].PendingReason = plWorker(999_999), ""
	if _, err := NewStateFromSnapshot(Config{}, lost); err == nil || !strings.Contains(err.Error(), "unknown worker") {
		t.Errorf("a mailbox on an unknown worker: %v", err)
	}
}

// A band change carries the evidence of the health score that caused it,
// as the score carried it; a score without evidence gives a change without.
func TestPlacementBandChangeCarriesEvidence(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{BandDwell: time.Hour})
	h.hb(1, domain.TierSharedFree, domain.EgressOAuthAPI)
	h.hb(2, domain.TierSharedFree, domain.EgressOAuthAPI)
	h.add(1, 1, domain.ProviderGmail, false)
	h.advance(time.Minute)
	h.beatAll()
	end := h.now
	ev := &domain.HealthEvidence{WindowSeconds: 7 * 86400, WindowEnd: &end, Inbox: 73, Junk: 23, MinObservations: 20,
		Rate: 23.0 / 96, Rule: domain.HealthRuleLevel, Threshold: &domain.HealthThreshold{Rate: 0.2, State: domain.HealthQuarantined},
		PenaltySeconds: 7 * 86400}
	ds := h.apply(&domain.MailboxHealthScored{MailboxID: plMailbox(1), State: domain.HealthQuarantined, Score: 76, Reason: "spam", Evidence: ev})
	bc := plOf[*domain.PlacementBandChanged](ds)
	if len(bc) != 1 || bc[0].Evidence == nil || plJSON(bc[0].Evidence) != plJSON(ev) {
		t.Fatalf("band change without the score's evidence: %s", plJSON(ds))
	}
	// The move it causes carries it too.
	if mv := plOf[*domain.PlacementMigrated](ds); len(mv) != 1 || mv[0].Reason != domain.ReasonBandChanged || plJSON(mv[0].Evidence) != plJSON(ev) {
		t.Fatalf("move without the score's evidence: %s", plJSON(ds))
	}
	h.advance(2 * time.Hour)
	h.beatAll()
	h.score(1, domain.HealthHealthy)
	h.advance(2 * time.Hour)
	h.beatAll()
	ds = h.score(1, domain.HealthHealthy)
	if bc := plOf[*domain.PlacementBandChanged](ds); len(bc) != 1 || bc[0].Evidence != nil {
		t.Fatalf("band change from a score without evidence: %s", plJSON(ds))
	}
	for _, mv := range plOf[*domain.PlacementMigrated](ds) {
		if mv.Evidence != nil {
			t.Fatalf("move from a score without evidence: %s", plJSON(ds))
		}
	}
}

// A refusal a band change causes (no worker of the new band) carries the
// score's evidence.
func TestPlacementBandRefusalCarriesEvidence(t *testing.T) {
	t.Parallel()
	h := newPlHarness(t, Config{})
	h.hb(1, domain.TierSharedFree, domain.EgressOAuthAPI)
	h.add(1, 1, domain.ProviderGmail, false)
	end := h.now
	ev := &domain.HealthEvidence{WindowSeconds: 7 * 86400, WindowEnd: &end, Inbox: 10, Junk: 30, MinObservations: 20,
		Rate: 0.75, Rule: domain.HealthRuleLevel, Threshold: &domain.HealthThreshold{Rate: 0.4, State: domain.HealthBlocked},
		PenaltySeconds: 30 * 86400}
	ds := h.apply(&domain.MailboxHealthScored{MailboxID: plMailbox(1), State: domain.HealthBlocked, Score: 25, Reason: "spam", Evidence: ev})
	rf := plOf[*domain.PlacementRefused](ds)
	if len(rf) != 1 || rf[0].Cause != domain.ReasonBandChanged || plJSON(rf[0].Evidence) != plJSON(ev) {
		t.Fatalf("refusal without the score's evidence: %s", plJSON(ds))
	}
}
