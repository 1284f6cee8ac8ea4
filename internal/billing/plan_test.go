package billing_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/apitest"
	"github.com/mailplane/mailplane/internal/billing"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
)

// orgEvent is a subscription event of a test and what its subscription
// grants once it is applied (the price map's plan when paying, free
// otherwise).
type orgEvent struct {
	name      string
	sub       string // "A" or "B"
	at        time.Duration
	status    string
	price     string
	plan      domain.Plan
	dedicated int
}

// modelPlan is the test's own statement of an org's plan: the best plan of
// the subscriptions' latest events, dedicated workers added up.
type modelPlan struct {
	plan      domain.Plan
	dedicated int
}

func modelOf(latest map[string]orgEvent) modelPlan {
	rank := map[domain.Plan]int{domain.PlanFree: 0, domain.PlanPremium: 1, domain.PlanDedicated: 2}
	p := modelPlan{plan: domain.PlanFree}
	workers := 0
	for _, ev := range latest {
		if rank[ev.plan] > rank[p.plan] {
			p.plan = ev.plan
		}
		if ev.plan == domain.PlanDedicated {
			workers += ev.dedicated
		}
	}
	if p.plan == domain.PlanDedicated {
		p.dedicated = workers
	}
	return p
}

func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}

// TestOrgPlanEveryDeliveryOrder: two subscriptions of one org, two events
// each, delivered in each of the 24 orders (an org per order). Whatever
// the order, the org ends on the plan of both subscriptions' newest events
// (dedicated with B's one worker: A was canceled), and at every delivery
// the webhook answers as the model says: 200 ignored for an event older
// than its subscription's last, 200 unchanged when the org's derived plan
// stays, else 202 with the new plan, dated at the event's created time or
// the org's last change if later. So no order regresses the plan (the
// issue's case, B's dedicated then A's older cancel, leaves it dedicated)
// and no change goes back in time.
func TestOrgPlanEveryDeliveryOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testConfig())
	events := []orgEvent{
		{"a1", "A", 0, "active", "price_dedicated_2", domain.PlanDedicated, 2},
		{"b1", "B", time.Second, "active", "price_premium_monthly", domain.PlanPremium, 0},
		{"a2", "A", 2 * time.Second, "canceled", "price_dedicated_2", domain.PlanFree, 0},
		{"b2", "B", 3 * time.Second, "active", "price_dedicated_addon", domain.PlanDedicated, 1},
	}
	final := modelPlan{domain.PlanDedicated, 1}
	if got := modelOf(map[string]orgEvent{"A": events[2], "B": events[3]}); got != final {
		t.Fatalf("the model's final plan %+v", got)
	}
	for p, order := range permutations(len(events)) {
		org := caseOrg(100 + p)
		latest := map[string]orgEvent{}
		var last *modelPlan
		var lastAt time.Time
		for _, i := range order {
			ev := events[i]
			id := fmt.Sprintf("evt_P%02d_%s", p, ev.name)
			body := orgSubEvent(t, id, fmt.Sprintf("sub_P%02d%s", p, ev.sub), org, created.Add(ev.at), ev.status, ev.price)
			name := fmt.Sprintf("order %v, %s", order, ev.name)
			if cur, ok := latest[ev.sub]; ok && cur.at > ev.at {
				e.expect200(name, body, "ignored")
				continue
			}
			latest[ev.sub] = ev
			want := modelOf(latest)
			if last != nil && *last == want {
				e.expect200(name, body, "unchanged")
				continue
			}
			at := created.Add(ev.at)
			if lastAt.After(at) {
				at = lastAt
			}
			got, _ := e.accepted(name, req{body: body})
			pc := got.Data.(*domain.OrgPlanChanged)
			if pc.OrgID != org || pc.Plan != want.plan || pc.DedicatedWorkers != want.dedicated || pc.Paid != (want.plan != domain.PlanFree) ||
				pc.Source != "stripe:"+id || !got.Time.Equal(at) || got.ID != billing.EventID(id, at.Unix()) {
				t.Fatalf("%s: produced %+v at %s (id %s), want %+v at %s", name, pc, got.Time, got.ID, want, at)
			}
			last, lastAt = &want, at
		}
		if last == nil || *last != final {
			t.Fatalf("order %v: the org's last plan change %+v, want %+v", order, last, final)
		}
		e.assertOrgRow(org, final, lastAt)
	}
}

// expect200 posts body and checks a 200 of status ("ignored" or
// "unchanged") with nothing produced.
func (e *env) expect200(name string, body []byte, status string) {
	e.t.Helper()
	e.start = e.endOffsets()
	resp, b := e.do(req{body: body})
	if resp.StatusCode != http.StatusOK || apitest.DecodeStrict[billing.IgnoredResponse](e.t, b).Status != status {
		e.t.Fatalf("%s: %d %s, want 200 %s", name, resp.StatusCode, b, status)
	}
	e.assertNothingProduced()
}

// assertOrgRow checks the org's recorded plan and the time of its last
// change.
func (e *env) assertOrgRow(org string, want modelPlan, at time.Time) {
	e.t.Helper()
	var (
		plan      string
		dedicated int
		planTime  time.Time
	)
	if err := e.db.Pool.QueryRow(context.Background(), `SELECT plan, dedicated_workers, plan_time FROM billing_orgs WHERE org_id = $1`, org).
		Scan(&plan, &dedicated, &planTime); err != nil {
		e.t.Fatalf("org %s: %v", org, err)
	}
	if domain.Plan(plan) != want.plan || dedicated != want.dedicated || !planTime.Equal(at) {
		e.t.Fatalf("org %s recorded %s:%d at %s, want %+v at %s", org, plan, dedicated, planTime, want, at)
	}
}

// TestOrgPlanConcurrentDeliveries: four orgs, two subscriptions each, six
// events per subscription flipping between plans, all 48 delivered at once
// (on a pool of 16 connections, so that deliveries do meet in Postgres).
// The org's row lock orders them: per org, the plan changes in the log are
// never dated before the one before, never repeat it, and end on the plan
// of the subscriptions' newest events, which the org's row holds.
func TestOrgPlanConcurrentDeliveries(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	wide := *db
	wide.Pool = pool
	e := newEnvOn(t, &wide, testConfig())
	grants := []orgEvent{
		{status: "active", price: "price_dedicated_2", plan: domain.PlanDedicated, dedicated: 2},
		{status: "canceled", price: "price_dedicated_2", plan: domain.PlanFree},
		{status: "active", price: "price_premium_monthly", plan: domain.PlanPremium},
		{status: "active", price: "price_dedicated_addon", plan: domain.PlanDedicated, dedicated: 1},
	}
	const perSub = 6
	orgs := []string{caseOrg(200), caseOrg(201), caseOrg(202), caseOrg(203)}
	var bodies [][]byte
	newest := map[string]map[string]orgEvent{}
	for o, org := range orgs {
		newest[org] = map[string]orgEvent{}
		for s, sub := range []string{"A", "B"} {
			for i := range perSub {
				g := grants[(i+s+o)%len(grants)]
				// The subscriptions' events interleave in time: A's at even
				// seconds, B's at odd ones.
				g.at = time.Duration(2*i+s) * time.Second
				g.sub = sub
				bodies = append(bodies, orgSubEvent(t, fmt.Sprintf("evt_O%dS%s%d", o, sub, i), fmt.Sprintf("sub_O%d%s", o, sub), org,
					created.Add(g.at), g.status, g.price))
				newest[org][sub] = g
			}
		}
	}
	d := e.deliverAll(bodies)
	byOrg := map[string][]domain.Event{}
	for _, ev := range e.planChanges(d.receipts) {
		byOrg[ev.Subject] = append(byOrg[ev.Subject], ev)
	}
	for _, org := range orgs {
		changes := byOrg[org]
		want := modelOf(newest[org])
		if len(changes) == 0 {
			t.Fatalf("org %s: no plan change produced", org)
		}
		for i, ev := range changes {
			pc := ev.Data.(*domain.OrgPlanChanged)
			if i > 0 {
				prev := changes[i-1]
				if ev.Time.Before(prev.Time) {
					t.Errorf("org %s: change %d dated %s after one dated %s", org, i, ev.Time, prev.Time)
				}
				if pp := prev.Data.(*domain.OrgPlanChanged); pp.Plan == pc.Plan && pp.DedicatedWorkers == pc.DedicatedWorkers {
					t.Errorf("org %s: change %d repeats the one before: %+v", org, i, pc)
				}
			}
		}
		lastPC := changes[len(changes)-1].Data.(*domain.OrgPlanChanged)
		if lastPC.Plan != want.plan || lastPC.DedicatedWorkers != want.dedicated {
			t.Errorf("org %s: last change %+v, want %+v", org, lastPC, want)
		}
		e.assertOrgRow(org, want, changes[len(changes)-1].Time)
	}
}

// TestOrgPlanSubscriptionMoves: a subscription whose metadata comes to name
// another org leaves its old org: one delivery produces both orgs' plans
// (the old one's back to free, with an id of its own), and an older event
// naming the old org is ignored.
func TestOrgPlanSubscriptionMoves(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testConfig())
	from, to := caseOrg(300), caseOrg(301)
	e.accepted("on the first org", req{body: orgSubEvent(t, "evt_M1", "sub_Move", from, created, "active", "price_dedicated_2")})
	resp, b := e.do(req{body: orgSubEvent(t, "evt_M2", "sub_Move", to, created.Add(time.Second), "active", "price_premium_monthly")})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("moved: %d %s", resp.StatusCode, b)
	}
	ar := apitest.DecodeStrict[api.AcceptedResponse](t, b)
	got := map[string]domain.OrgPlanChanged{}
	ids := map[string]bool{}
	for _, ev := range e.planChanges(ar.Events) {
		got[ev.Subject] = *ev.Data.(*domain.OrgPlanChanged)
		ids[ev.ID] = true
	}
	if len(got) != 2 || len(ids) != 2 || got[from].Plan != domain.PlanFree || got[from].Paid ||
		got[to].Plan != domain.PlanPremium || !got[to].Paid || got[from].Source != "stripe:evt_M2" {
		t.Fatalf("moved: %+v (ids %v)", got, ids)
	}
	e.assertOrgRow(from, modelPlan{plan: domain.PlanFree}, created.Add(time.Second))
	e.assertOrgRow(to, modelPlan{plan: domain.PlanPremium}, created.Add(time.Second))
	e.expect200("older, naming the first org", orgSubEvent(t, "evt_M0", "sub_Move", from, created.Add(-time.Second), "active", "price_dedicated_2"), "ignored")
}

// TestOrgPlanMigration: rows recorded before migration 0013 kept no org and
// no plan. The migration takes both from the registry's org row where it
// names a subscription's last applied event, so a newer event of another
// subscription of the org, one the migration could not place, does not set
// the org back to free; plan changes are never dated before the registry's
// last. An org whose plan an operator set last gets no billing state, and
// its first billing event produces.
func TestOrgPlanMigration(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	all := migrations.All()
	if all[12].Version != 13 || all[12].Name != "billing_org_plan" {
		t.Fatalf("migration 13 is %04d_%s", all[12].Version, all[12].Name)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	for _, m := range all[:12] {
		if _, err := db.Pool.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("%04d_%s: %v", m.Version, m.Name, err)
		}
		if _, err := db.Pool.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			t.Fatal(err)
		}
	}
	x, y := caseOrg(400), caseOrg(401)
	registryAt := created.Add(10 * time.Second)
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO orgs (org_id, plan, dedicated_workers, paid, source, updated_at) VALUES ($1, 'dedicated', 2, true, 'stripe:evt_X1new', $2)`, []any{x, registryAt}},
		{`INSERT INTO orgs (org_id, plan, dedicated_workers, paid, source, updated_at) VALUES ($1, 'premium', 0, true, 'ops-console', $2)`, []any{y, registryAt}},
		{`INSERT INTO billing_subscriptions (subscription_id, created, event_id, applied_at) VALUES
			('sub_X1', $1, 'evt_X1new', $3), ('sub_X2', $2, 'evt_X2old', $3), ('sub_Y1', $1, 'evt_Y1', $3)`,
			[]any{created.Unix(), created.Add(-time.Hour).Unix(), now}},
	} {
		if _, err := db.Pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	e := newEnvOn(t, db, testConfig())
	e.assertOrgRow(x, modelPlan{domain.PlanDedicated, 2}, registryAt)
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM billing_orgs WHERE org_id = $1`, y).Scan(&n); err != nil || n != 0 {
		t.Fatalf("org set by an operator: %d billing rows (%v)", n, err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM billing_subscriptions WHERE org_id IS NULL`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d subscriptions without an org, want sub_X2 and sub_Y1 (%v)", n, err)
	}

	// sub_X2's newer event cancels it: sub_X1 still grants dedicated.
	e.expect200("X2 canceled", orgSubEvent(t, "evt_X2cancel", "sub_X2", x, created, "canceled", "price_premium_monthly"), "unchanged")
	// sub_X1's cancel sets the org free, dated at the registry's last
	// change, which is later than the event.
	ev, _ := e.accepted("X1 canceled", req{body: orgSubEvent(t, "evt_X1cancel", "sub_X1", x, created.Add(time.Second), "canceled", "price_dedicated_2")})
	if pc := ev.Data.(*domain.OrgPlanChanged); pc.Plan != domain.PlanFree || !ev.Time.Equal(registryAt) {
		t.Fatalf("X1 canceled: %+v at %s", pc, ev.Time)
	}
	// The operator's org: its first billing event produces whatever it is.
	ev, _ = e.accepted("Y1", req{body: orgSubEvent(t, "evt_Y1next", "sub_Y1", y, created.Add(time.Second), "active", "price_premium_monthly")})
	if pc := ev.Data.(*domain.OrgPlanChanged); pc.Plan != domain.PlanPremium {
		t.Fatalf("Y1: %+v", pc)
	}
}
