-- Sync ownership: fencing epochs per mailbox.state partition, and the
-- evidence that stale owners were refused.
--
-- A sync worker that is assigned partition p of mailbox.state (by the
-- consumer group) takes the next epoch of p here before it starts p's
-- runners. Every write a runner makes runs in a transaction that first
-- reads p's epoch FOR SHARE and goes ahead only if it is still the runner's:
-- taking a new epoch (an UPDATE of the row) waits for writes in flight and
-- makes every later write of an older epoch fail. So a member that still
-- believes it owns p after the group gave p to another (a paused process, a
-- network partition) cannot land a write, whatever the group protocol's
-- timing.

-- The current epoch and owner of each partition. epoch only grows.
CREATE TABLE sync_partitions (
    partition   integer     PRIMARY KEY CHECK (partition >= 0),
    epoch       bigint      NOT NULL CHECK (epoch > 0),
    owner       text        NOT NULL,
    acquired_at timestamptz NOT NULL
);

-- Every epoch ever taken: the ownership history of each partition, for
-- operators and for tests checking that no write landed at a stale epoch.
-- acquired_at is clock_timestamp() after the row lock was won, so every
-- write that landed at the previous epoch committed before it.
CREATE TABLE sync_partition_epochs (
    partition   integer     NOT NULL,
    epoch       bigint      NOT NULL,
    owner       text        NOT NULL,
    acquired_at timestamptz NOT NULL,
    PRIMARY KEY (partition, epoch)
);

-- Writes refused because their epoch was no longer current (or the
-- partition had no epoch at all): one row per refused attempt. Rare by
-- design (a zombie's last gasps), so kept without a retention job.
CREATE TABLE sync_fenced_writes (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    partition     integer     NOT NULL,
    epoch         bigint      NOT NULL,
    current_epoch bigint,
    owner         text        NOT NULL,
    mailbox_id    uuid,
    kind          text        NOT NULL,
    attempted_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX sync_fenced_writes_owner_idx ON sync_fenced_writes (owner, attempted_at);

-- What the recording runner (the stand-in for the IMAP runner) writes
-- through its fenced writer: one row per write (start, beat, stop), with
-- the epoch it was made at. written_at is clock_timestamp() inside the
-- writing transaction, so it is earlier than the acquired_at of any later
-- epoch of the partition.
CREATE TABLE sync_recorder_writes (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    mailbox_id uuid        NOT NULL,
    partition  integer     NOT NULL,
    epoch      bigint      NOT NULL,
    owner      text        NOT NULL,
    kind       text        NOT NULL,
    tier       text        NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX sync_recorder_writes_partition_idx ON sync_recorder_writes (partition, epoch);
