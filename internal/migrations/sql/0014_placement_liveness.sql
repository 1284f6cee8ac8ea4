-- The liveness hold and the tier dwell of the placement engine (issue 23;
-- internal/placement, package comment: Liveness hold, and the tier dwell).
-- Both are state the engine restores from the placement projection, so
-- both are folded here from the decision log like every other row.

-- A worker's tier does not change before tier_held_until_ns (the
-- worker_changed decision that last changed its tier recorded it; NULL:
-- its tier may change at its next heartbeat).
ALTER TABLE placement_workers ADD COLUMN tier_held_until_ns bigint;

-- The liveness hold, as the last liveness_held / liveness_resumed decision
-- recorded it: holding since held_since, or (resumed_at set) the last
-- hold and its end. The counts are the last decision's. No row: liveness
-- was never held.
CREATE TABLE placement_liveness (
    scope              text    PRIMARY KEY CHECK (scope = 'fleet'),
    holding            boolean NOT NULL,
    held_since_ns      bigint  NOT NULL,
    resumed_at_ns      bigint,
    silent_workers     bigint  NOT NULL CHECK (silent_workers >= 0),
    live_workers       bigint  NOT NULL CHECK (live_workers >= silent_workers),
    share_permille     integer NOT NULL CHECK (share_permille BETWEEN 0 AND 1000),
    threshold_permille integer NOT NULL CHECK (threshold_permille BETWEEN 1 AND 1000),
    decision_offset    bigint  NOT NULL CHECK (decision_offset >= 0), -- the last liveness decision
    held_since         timestamptz GENERATED ALWAYS AS (to_timestamp(held_since_ns / 1e9::float8)) STORED,
    resumed_at         timestamptz GENERATED ALWAYS AS (to_timestamp(resumed_at_ns / 1e9::float8)) STORED,
    CHECK (holding = (resumed_at_ns IS NULL))
);
