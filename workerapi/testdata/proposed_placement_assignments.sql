-- PROPOSED MIGRATION — not applied by migrations/. The worker API's tests
-- create these tables in their private schemas; the lead moves this file into
-- migrations/sql/ (next number) once the placement projection writes them.
--
-- Worker-facing view of the placement projection, written by the placement
-- projector from the decision log (mailplane.placement.decisions.v1, one
-- partition) in the same transaction as its projector_offsets row, so the
-- projector's next_offset is the position every row reflects and the change
-- token handed to workers (workerapi.Token). Every value comes from the
-- decision log (offsets and decision times, never the wall clock), so a
-- replay reproduces the rows.

-- One row per placed mailbox (assigned or migrated onto worker_id; deleted
-- on unassigned, or when the mailbox migrates away, with the row of its new
-- worker written at the same offset).
CREATE TABLE placement_assignments (
    mailbox_id      uuid PRIMARY KEY,
    worker_id       uuid        NOT NULL,
    org_id          uuid        NOT NULL,
    band            text        NOT NULL CHECK (band IN ('clean', 'risky', 'quarantine')),
    weight_milli    bigint      NOT NULL CHECK (weight_milli > 0),
    assigned_at     timestamptz NOT NULL, -- the decision's "at"
    decision_offset bigint      NOT NULL CHECK (decision_offset >= 0)
);

-- GET /v1/workers/{id}/assignments lists a worker's mailboxes in id order.
CREATE INDEX placement_assignments_worker_idx ON placement_assignments (worker_id, mailbox_id);

-- What changed on each worker, by decision offset: 'added' when a mailbox is
-- placed on the worker (assigned, migrated to it, or its details changed in
-- place), 'removed' when it leaves (unassigned, migrated away, worker died).
-- A migration writes 'removed' for from_worker and 'added' for to_worker at
-- the same offset. Rows below placement_assignment_retention.retained_from
-- may be pruned (workerapi.PruneChanges).
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
