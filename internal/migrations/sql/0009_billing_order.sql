-- Stripe does not order webhook deliveries. Per subscription, the Stripe
-- event last applied (its created time, then its id for ties): an older one
-- delivered later is ignored. The webhook locks the row across the produce,
-- so two concurrent deliveries cannot both win.
CREATE TABLE billing_subscriptions (
    subscription_id text PRIMARY KEY,
    created         bigint NOT NULL, -- Stripe "created", Unix seconds
    event_id        text NOT NULL,
    applied_at      timestamptz NOT NULL
);

-- Stripe events ignored as older than the last one applied for their
-- subscription, for operators to see.
CREATE TABLE billing_stale_events (
    event_id         text PRIMARY KEY,
    event_type       text NOT NULL,
    subscription_id  text NOT NULL,
    created          bigint NOT NULL,
    applied_event_id text NOT NULL,
    applied_created  bigint NOT NULL,
    received_at      timestamptz NOT NULL
);
CREATE INDEX billing_stale_events_subscription ON billing_stale_events (subscription_id, received_at);
