-- The outbox: Kafka records written in the same Postgres transaction as the
-- state they come from, and published by the outbox relay after commit.
-- A fenced writer (a sync runner) therefore publishes only what its epoch
-- allowed it to write, and a projection that decides something (the health
-- scorer) publishes exactly the decisions it committed.
--
-- seq orders publication. Writers of one key serialize their transactions
-- (a row lock), so per key seq order is commit order and the relay keeps
-- per-key order. headers is the record's headers in the outbox package's
-- binary encoding; value NULL is a tombstone.
CREATE TABLE event_outbox (
    seq        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic      text        NOT NULL CHECK (topic <> ''),
    key        bytea,
    value      bytea,
    headers    bytea       NOT NULL DEFAULT '\x',
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
