-- Runtime state shared by every projector.

-- projector_offsets is where a projector's position in each partition lives.
-- It is written in the same transaction as the rows the records produced, so
-- it, not the Kafka group's committed offsets, is the source of truth.
CREATE TABLE projector_offsets (
    projector   text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    next_offset bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (projector, topic, partition)
);

-- applied_events remembers every event id a projector has applied, so an
-- event produced twice (a producer retry) or read twice (offsets rewound) is
-- applied once. Rows are kept for ever: event ids are UUIDv7, so inserts land
-- at the right edge of the primary key, the only index, and stay cheap.
CREATE TABLE applied_events (
    projector text NOT NULL,
    event_id  uuid NOT NULL,
    PRIMARY KEY (projector, event_id)
);
