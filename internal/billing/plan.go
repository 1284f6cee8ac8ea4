package billing

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/domain"
)

// Stripe keeps an order per subscription, but the plan is the org's, and an
// org may hold several subscriptions. Applying each subscription event to
// the org as it came let an older event of one subscription, delivered
// last, undo a newer event of another. So the org's plan is derived, never
// taken from one event: it is orgPlan over every subscription of the org,
// each at its own high-water mark (its latest event by created, then id;
// order.go). Recording a subscription's event and deriving its org's plan
// happen in one transaction under the org's row lock (billing_orgs), so
// whatever the order or concurrency of deliveries, the plan derived is that
// of the latest state of every subscription seen so far, which only moves
// forward. An org.plan_changed is produced only when the derived plan
// differs from the one last produced, dated no earlier than that one.

// grant is what a subscription grants its org at its high-water mark: the
// plan its latest event maps to (planChangeOf: active, trialing and
// past_due the mapped plan; every other status, and a deletion, free).
type grant struct {
	plan      domain.Plan
	dedicated int // dedicated workers, 0 unless plan is dedicated
}

// orgPlan derives an org's plan from the grants of all of its
// subscriptions: the best plan any of them grants, free when none does;
// for dedicated, the dedicated workers of every dedicated grant added up
// (as the dedicated items of one subscription are, resolve), at most
// domain.MaxDedicatedWorkers.
func orgPlan(gs []grant) grant {
	best := grant{plan: domain.PlanFree}
	workers := 0
	for _, g := range gs {
		if planRank[g.plan] > planRank[best.plan] {
			best.plan = g.plan
		}
		if g.plan == domain.PlanDedicated {
			workers += g.dedicated
		}
	}
	if best.plan == domain.PlanDedicated {
		best.dedicated = min(workers, domain.MaxDedicatedWorkers)
	}
	return best
}

// orgRow is an org's billing_orgs row: the plan last produced for it (none
// yet when !produced) and that event's time.
type orgRow struct {
	produced bool
	plan     grant
	at       time.Time
}

// orgChange is an org.plan_changed to produce: the org's new derived
// plan, at its time. released marks the org a subscription left (its
// metadata now names another org).
type orgChange struct {
	orgID    string
	plan     grant
	at       time.Time
	released bool
}

// lockOrg returns the org's row, holding its lock until tx ends. An org
// met for the first time gets a row with no plan, inserted so that it can
// be locked: a concurrent first delivery for the org waits on the insert.
func lockOrg(ctx context.Context, tx pgx.Tx, orgID string, now time.Time) (orgRow, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO billing_orgs (org_id, updated_at) VALUES ($1, $2)
ON CONFLICT (org_id) DO NOTHING`, orgID, now); err != nil {
		return orgRow{}, err
	}
	var (
		plan      *string
		dedicated int
		at        *time.Time
	)
	if err := tx.QueryRow(ctx, `SELECT plan, dedicated_workers, plan_time FROM billing_orgs WHERE org_id = $1 FOR UPDATE`,
		orgID).Scan(&plan, &dedicated, &at); err != nil {
		return orgRow{}, err
	}
	var r orgRow
	if plan != nil {
		r.produced, r.plan = true, grant{plan: domain.Plan(*plan), dedicated: dedicated}
	}
	if at != nil {
		r.at = at.UTC()
	}
	return r, nil
}

// orgGrants returns what every subscription of the org grants at its
// high-water mark. The caller holds the org's lock, and every writer of a
// subscription row of the org holds it too, so this reads a settled set.
func orgGrants(ctx context.Context, tx pgx.Tx, orgID string) ([]grant, error) {
	rows, err := tx.Query(ctx, `SELECT plan, dedicated_workers FROM billing_subscriptions WHERE org_id = $1`, orgID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (grant, error) {
		var g grant
		err := row.Scan(&g.plan, &g.dedicated)
		return g, err
	})
}

func setOrgPlan(ctx context.Context, tx pgx.Tx, c orgChange, stripeEventID string, now time.Time) error {
	_, err := tx.Exec(ctx, `UPDATE billing_orgs SET plan = $2, dedicated_workers = $3, plan_time = $4, event_id = $5, updated_at = $6
WHERE org_id = $1`, c.orgID, string(c.plan.plan), c.plan.dedicated, c.at, stripeEventID, now)
	return err
}

// derivePlans derives the plan of each org (locked, rows as read before the
// subscription moved) and returns the changes to produce, recording each
// as the org's last produced plan. An org's first plan is always produced;
// a change is dated at the event's created time, or at the org's last
// change if that is later, so an org's plan changes never go back in time.
func derivePlans(ctx context.Context, tx pgx.Tx, ev stripeEvent, eventOrg string, orgs map[string]orgRow, order []string, now time.Time) ([]orgChange, error) {
	var changes []orgChange
	for _, org := range order {
		gs, err := orgGrants(ctx, tx, org)
		if err != nil {
			return nil, err
		}
		p, r := orgPlan(gs), orgs[org]
		if r.produced && p == r.plan {
			continue
		}
		at := time.Unix(ev.Created, 0).UTC()
		if r.at.After(at) {
			at = r.at
		}
		c := orgChange{orgID: org, plan: p, at: at, released: org != eventOrg}
		if err := setOrgPlan(ctx, tx, c, ev.ID, now); err != nil {
			return nil, err
		}
		changes = append(changes, c)
	}
	return changes, nil
}
