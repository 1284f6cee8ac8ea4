-- Dead letters handed back to their consumer (mailplane dlq redrive, the
-- console's button; internal/dlq/redrive.go). One row per dead letter per
-- redrive: a dead letter with a row is not redriven again unless the
-- operator asks for it (--again), which adds a row under a new redrive id.
--
-- A row is written 'pending' before its record is produced and turned
-- 'done' with the offset it landed at after: a redrive that dies between
-- the two leaves 'pending' rows, which the next redrive completes (it looks
-- for the record, by redrive id, in the source partition from scan_from on,
-- and produces it only if it is not there).
CREATE TABLE dlq_redrives (
    dlq_partition    integer     NOT NULL,
    dlq_offset       bigint      NOT NULL,
    redrive_id       uuid        NOT NULL,
    consumer         text        NOT NULL,
    error_code       text        NOT NULL,
    source_topic     text        NOT NULL,
    source_partition integer     NOT NULL,
    source_offset    bigint      NOT NULL,
    actor            text        NOT NULL, -- the caller's name
    actor_source     text        NOT NULL, -- and its source
    again            boolean     NOT NULL,
    state            text        NOT NULL CHECK (state IN ('pending', 'done')),
    scan_from        bigint      NOT NULL, -- the source partition's end before the produce
    redriven_offset  bigint,               -- where the record landed (done)
    requested_at     timestamptz NOT NULL,
    done_at          timestamptz,
    PRIMARY KEY (dlq_partition, dlq_offset, redrive_id)
);
CREATE INDEX dlq_redrives_pending ON dlq_redrives (redrive_id) WHERE state = 'pending';
