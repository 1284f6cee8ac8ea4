-- The projectors' dedupe window (issue 13): applied_events keeps an event id
-- for the window only (internal/projections/dedupe.go has the rule).

-- When the id was applied, by the projector's clock. Rows from before this
-- migration count as applied now; rows written without it (the rebuild's)
-- take the time of their transaction.
ALTER TABLE applied_events ADD COLUMN applied_at timestamptz NOT NULL DEFAULT now();

-- The prune walks the oldest ids of one projector. Times only grow, so
-- inserts land at the right edge, like the primary key's UUIDv7 ids.
CREATE INDEX applied_events_applied_at ON applied_events (projector, applied_at);

-- forgotten_below: every record below it in the partition has been applied
-- and its id may be pruned, so the position never goes below it (the
-- check): a record there is refused by position, as one below next_offset
-- always was.
ALTER TABLE projector_offsets
    ADD COLUMN forgotten_below bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT projector_offsets_forgotten_below CHECK (forgotten_below >= 0 AND next_offset >= forgotten_below);

-- applied_event_marks records where each partition stood at a time (and,
-- for a seek back, where it stood before): the prune forgets the ids
-- applied before a mark and raises forgotten_below to the mark's offsets.
CREATE TABLE applied_event_marks (
    projector   text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    marked_at   timestamptz NOT NULL,
    next_offset bigint      NOT NULL CHECK (next_offset >= 0),
    PRIMARY KEY (projector, marked_at, topic, partition)
);
