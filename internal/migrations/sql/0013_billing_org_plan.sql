-- An org's plan is derived from all of its Stripe subscriptions, each at
-- its own high-water mark (internal/billing/plan.go), so no delivery order
-- can set it back. Per subscription: the org it belongs to and what it
-- grants at its last applied event. Per org: the plan last produced as
-- org.plan_changed and that event's time; the webhook locks the org's row
-- while it records a subscription's event and derives the plan.

-- org_id and plan are NULL together: a subscription recorded before this
-- migration whose state could not be derived (below) counts for no org
-- until its next event.
ALTER TABLE billing_subscriptions
    ADD COLUMN org_id uuid,
    ADD COLUMN plan text CHECK (plan IN ('free', 'premium', 'dedicated')),
    ADD COLUMN dedicated_workers integer NOT NULL DEFAULT 0 CHECK (dedicated_workers >= 0),
    ADD CONSTRAINT billing_subscriptions_grant CHECK ((org_id IS NULL) = (plan IS NULL));

CREATE INDEX billing_subscriptions_org ON billing_subscriptions (org_id) WHERE org_id IS NOT NULL;

-- plan is NULL only inside the transaction that first meets the org.
CREATE TABLE billing_orgs (
    org_id            uuid PRIMARY KEY,
    plan              text CHECK (plan IN ('free', 'premium', 'dedicated')),
    dedicated_workers integer NOT NULL DEFAULT 0 CHECK (dedicated_workers >= 0),
    plan_time         timestamptz,           -- time of the org.plan_changed last produced
    event_id          text NOT NULL DEFAULT '', -- the Stripe event it was produced for
    updated_at        timestamptz NOT NULL
);

-- Existing rows: billing_subscriptions kept no org and no plan. The
-- registry's org row names the Stripe event its plan last came from
-- (source "stripe:<event id>"); where that event is a subscription's last
-- applied one, the subscription grants that plan to that org, and the org's
-- last produced plan is that one, at the registry's time.
UPDATE billing_subscriptions s
SET org_id = o.org_id, plan = o.plan, dedicated_workers = o.dedicated_workers
FROM orgs o
WHERE s.event_id <> '' AND o.source = 'stripe:' || s.event_id
  AND o.plan IN ('free', 'premium', 'dedicated') AND o.dedicated_workers >= 0;

-- Stripe event ids are unique, so one subscription per org matches; DISTINCT
-- ON keeps the migration from failing on rows that say otherwise.
INSERT INTO billing_orgs (org_id, plan, dedicated_workers, plan_time, event_id, updated_at)
SELECT DISTINCT ON (s.org_id) s.org_id, s.plan, s.dedicated_workers, o.updated_at, s.event_id, now()
FROM billing_subscriptions s JOIN orgs o ON o.org_id = s.org_id AND o.source = 'stripe:' || s.event_id
ORDER BY s.org_id, s.subscription_id;
