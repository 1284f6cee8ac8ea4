-- The placement projection: the placement engine's state, projected from the
-- decision log (mailplane.placement.decisions.v1, one partition) by the
-- "placement" projector (projections.PlacementProjector), so that
--
--   * the engine restores from it at its recorded decision-log offset and
--     reads only the log's tail (projections.PlacementSnapshotter);
--   * workers poll their assignments (workerapi.PGStore: GET
--     /v1/workers/{id}/assignments, with the decision-log offset as change
--     token);
--   * operators see workers, pools, pending placements and each mailbox's
--     history (mailplane placement show).
--
-- Every row is written in the transaction that moves placement_checkpoint
-- (and the projector's projector_offsets row) past the decisions that
-- produced it, so one snapshot is always consistent and a crash neither
-- loses nor repeats a decision. Every value comes from the decision log
-- (decision offsets, ids and times, never the wall clock), so replaying the
-- log from offset 0 (mailplane replay placement) reproduces every row.
--
-- Times the engine decides on (first/last seen, plan since, pending since,
-- recovery candidate since) are kept exactly, as Unix nanoseconds (*_ns):
-- event times carry nanoseconds and timestamptz keeps microseconds, and a
-- restored engine must see the very times the live one saw. A generated
-- timestamptz next to each is for people.

-- Sending workers, one row per worker the engine knows: registered and not
-- forgotten (a worker_forgotten decision deletes the row).
CREATE TABLE placement_workers (
    worker_id       uuid PRIMARY KEY,
    base_tier       text    NOT NULL CHECK (base_tier IN ('shared_free', 'shared_premium')), -- as its heartbeats say
    tier            text    NOT NULL CHECK (tier IN ('shared_free', 'shared_premium', 'dedicated')),
    egress          text    NOT NULL,
    address         text    NOT NULL,
    pool            text    NOT NULL CHECK (pool IN ('clean', 'risky', 'quarantine')),
    dedicated_org   uuid,             -- dedicated: the bound org, or the releasing one
    releasing       boolean NOT NULL, -- dedicated, released, draining
    health          text    NOT NULL,
    first_seen_ns   bigint  NOT NULL,
    last_seen_ns    bigint  NOT NULL,
    live            boolean NOT NULL,
    stopping        boolean NOT NULL,
    load_milli      bigint  NOT NULL CHECK (load_milli >= 0),    -- the exact sum of its mailboxes' weights
    capacity        bigint  NOT NULL CHECK (capacity >= 1),      -- effective capacity, in mailboxes of weight 1
    mailboxes       integer NOT NULL CHECK (mailboxes >= 0),
    decision_offset bigint  NOT NULL CHECK (decision_offset >= 0), -- the last decision that changed the row
    first_seen      timestamptz GENERATED ALWAYS AS (to_timestamp(first_seen_ns / 1e9::float8)) STORED,
    last_seen       timestamptz GENERATED ALWAYS AS (to_timestamp(last_seen_ns / 1e9::float8)) STORED,
    CHECK (NOT releasing OR tier = 'dedicated')
);

-- Orgs whose plan the engine recorded (an org never recorded is free).
CREATE TABLE placement_orgs (
    org_id            uuid PRIMARY KEY,
    plan              text    NOT NULL CHECK (plan IN ('free', 'premium', 'dedicated')),
    dedicated_workers integer NOT NULL CHECK (dedicated_workers >= 0),
    paid              boolean NOT NULL,
    source            text    NOT NULL,
    plan_since_ns     bigint  NOT NULL,
    decision_offset   bigint  NOT NULL CHECK (decision_offset >= 0),
    plan_since        timestamptz GENERATED ALWAYS AS (to_timestamp(plan_since_ns / 1e9::float8)) STORED
);

-- Every live mailbox: placed on a worker (worker_id, assigned_at), or
-- refused and waiting for capacity (pending_reason, pending_since).
-- Removed mailboxes have no row.
CREATE TABLE placement_mailboxes (
    mailbox_id         uuid PRIMARY KEY,
    org_id             uuid   NOT NULL,
    worker_id          uuid,
    band               text   NOT NULL CHECK (band IN ('clean', 'risky', 'quarantine')),
    weight_milli       bigint NOT NULL CHECK (weight_milli IN (50, 400, 1000)),
    candidate          text   CHECK (candidate IN ('clean', 'risky', 'quarantine')), -- better band being observed (hysteresis)
    candidate_since_ns bigint,
    pending_reason     text,
    pending_since_ns   bigint,
    assigned_at        timestamptz, -- the time of the decision that put it on worker_id
    decision_offset    bigint NOT NULL CHECK (decision_offset >= 0), -- the last decision about the mailbox
    candidate_since    timestamptz GENERATED ALWAYS AS (to_timestamp(candidate_since_ns / 1e9::float8)) STORED,
    pending_since      timestamptz GENERATED ALWAYS AS (to_timestamp(pending_since_ns / 1e9::float8)) STORED,
    CHECK ((worker_id IS NULL) = (assigned_at IS NULL)),
    CHECK ((worker_id IS NULL) = (pending_reason IS NOT NULL)),
    CHECK ((pending_reason IS NULL) = (pending_since_ns IS NULL)),
    CHECK ((candidate IS NULL) = (candidate_since_ns IS NULL))
);

-- GET /v1/workers/{id}/assignments lists a worker's mailboxes in id order.
CREATE INDEX placement_mailboxes_worker_idx ON placement_mailboxes (worker_id, mailbox_id) WHERE worker_id IS NOT NULL;

-- The worker API's view of placed mailboxes (workerapi.PGStore).
CREATE VIEW placement_assignments AS
SELECT mailbox_id, worker_id, org_id, band, weight_milli, assigned_at, decision_offset
FROM placement_mailboxes
WHERE worker_id IS NOT NULL;

-- What changed on each worker, by decision offset: 'added' when a mailbox
-- arrives on the worker (assigned, or migrated to it); 'removed' when it was
-- on the worker just before the decision and left it (migrated away,
-- refused off it, unassigned) or had its details changed there (a band
-- change on a dedicated worker). So the first change of a mailbox after a
-- token says whether it was on the worker at the token ('removed': it
-- was), and its current row whether it is now: what workerapi.PGStore
-- reports. A migration writes 'removed' for from_worker and 'added' for
-- to_worker at the same offset. Rows below
-- placement_assignment_retention.retained_from may be pruned
-- (workerapi.PruneChanges).
CREATE TABLE placement_assignment_changes (
    worker_id       uuid   NOT NULL,
    decision_offset bigint NOT NULL CHECK (decision_offset >= 0),
    mailbox_id      uuid   NOT NULL,
    change          text   NOT NULL CHECK (change IN ('added', 'removed')),
    PRIMARY KEY (worker_id, decision_offset, mailbox_id)
);

-- Pruning deletes by offset across workers.
CREATE INDEX placement_assignment_changes_offset_idx ON placement_assignment_changes (decision_offset);

-- The retention horizon of placement_assignment_changes: changes at offsets
-- below retained_from may be gone, so tokens below it are refused (410
-- expired, full resync). At most one row; no row means 0 (nothing pruned).
CREATE TABLE placement_assignment_retention (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    retained_from bigint  NOT NULL CHECK (retained_from >= 0)
);

-- Every decision about a mailbox, for `mailplane placement show --mailbox`:
-- type is the decision type without "mailplane.placement." and ".v1"
-- (assigned, refused, migrated, unassigned, band_changed, band_held).
-- from/to worker and band: a move's ends; a refusal's from_* is what the
-- mailbox left (if anything) and to_band its band; a band change's or a
-- held band's from_band is the band and to_band the new band or the
-- candidate. cause is what asked for a refused placement; detail a
-- removal's reason; health the score's state behind a band decision.
CREATE TABLE placement_history (
    mailbox_id      uuid        NOT NULL,
    decision_offset bigint      NOT NULL CHECK (decision_offset >= 0),
    decision_id     uuid        NOT NULL,
    type            text        NOT NULL,
    reason          text        NOT NULL,
    at              timestamptz NOT NULL,
    from_worker     uuid,
    to_worker       uuid,
    from_band       text,
    to_band         text,
    cause           text,
    detail          text,
    health          text,
    PRIMARY KEY (mailbox_id, decision_offset)
);

-- Where the projection stands on the decision log: every decision below
-- next_offset is folded into the rows, none at or above it. At most one
-- row; no row means offset 0 (nothing projected). last_decision_id is the
-- ce_id of the last decision folded (it seeds the engine's tick ids).
CREATE TABLE placement_checkpoint (
    singleton        boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    next_offset      bigint  NOT NULL CHECK (next_offset >= 0),
    last_decision_id uuid
);

-- Dedicated workers and the org each serves (releasing: released, still
-- draining, reverts once idle).
CREATE VIEW placement_dedicated_bindings AS
SELECT worker_id, dedicated_org AS org_id, releasing, load_milli, capacity, mailboxes
FROM placement_workers
WHERE tier = 'dedicated';

-- An org's placement class, as the engine sees it: free unless its plan is
-- recorded, paid and not free; dedicated with at least one worker.
CREATE VIEW placement_org_classes AS
SELECT org_id,
       CASE WHEN NOT paid OR plan = 'free' THEN 'free'
            WHEN plan = 'dedicated' AND dedicated_workers > 0 THEN 'dedicated'
            ELSE 'premium' END AS class,
       dedicated_workers,
       plan_since_ns
FROM placement_orgs;

-- Every mailbox with its placement status: degraded is a dedicated org's
-- mailbox on a shared worker (waiting for dedicated capacity).
CREATE VIEW placement_mailbox_status AS
SELECT m.mailbox_id, m.org_id, m.worker_id, w.tier, m.band, m.weight_milli,
       COALESCE(c.class = 'dedicated' AND w.tier <> 'dedicated', false) AS degraded,
       m.pending_reason, m.pending_since, m.assigned_at, m.decision_offset
FROM placement_mailboxes m
LEFT JOIN placement_workers w ON w.worker_id = m.worker_id
LEFT JOIN placement_org_classes c ON c.org_id = m.org_id;

-- Pending placements: refused mailboxes (no worker; reason
-- no_eligible_worker, since their first refusal) and degraded ones (on
-- shared premium for want of dedicated capacity; reason
-- no_dedicated_capacity, since their org's plan).
CREATE VIEW placement_pending AS
SELECT m.mailbox_id, m.org_id, NULL::uuid AS worker_id, m.band, m.weight_milli,
       m.pending_reason AS reason, m.pending_since_ns AS since_ns, m.pending_since AS since
FROM placement_mailboxes m
WHERE m.worker_id IS NULL
UNION ALL
SELECT m.mailbox_id, m.org_id, m.worker_id, m.band, m.weight_milli,
       'no_dedicated_capacity', c.plan_since_ns, to_timestamp(c.plan_since_ns / 1e9::float8)
FROM placement_mailboxes m
JOIN placement_workers w ON w.worker_id = m.worker_id AND w.tier <> 'dedicated'
JOIN placement_org_classes c ON c.org_id = m.org_id AND c.class = 'dedicated';

-- Per tier and pool: workers, live ones, those taking new mailboxes (live,
-- not stopping or releasing, healthy or watch), load, capacity (of all and
-- of the live) and mailboxes.
CREATE VIEW placement_pool_summary AS
SELECT tier, pool,
       count(*)                                                     AS workers,
       count(*) FILTER (WHERE live)                                 AS live_workers,
       count(*) FILTER (WHERE live AND NOT stopping AND NOT releasing
                        AND health IN ('healthy', 'watch'))         AS eligible_workers,
       sum(load_milli)                                              AS load_milli,
       sum(capacity)                                                AS capacity,
       COALESCE(sum(capacity) FILTER (WHERE live), 0)               AS live_capacity,
       sum(mailboxes)                                               AS mailboxes
FROM placement_workers
GROUP BY tier, pool;
