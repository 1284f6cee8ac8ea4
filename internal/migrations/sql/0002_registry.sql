-- The registry of facts: the latest known state of every mailbox, org, user
-- and worker, projected from the domain topics by the "registry" projector.
-- Every timestamp is an event's ce_time, never the wall clock, so replaying
-- the log yields identical rows.

-- A row exists for every mailbox id any event has named. Columns of a group
-- of facts are NULL until an event of that group arrives: added_at NULL means
-- no mailbox.added was seen (say it went to the DLQ), health_state NULL means
-- never scored. Removal keeps the row; a later mailbox.added clears it.
CREATE TABLE mailboxes (
    mailbox_id         uuid PRIMARY KEY,
    org_id             uuid,
    user_id            uuid,
    address            text,
    provider           text,
    warmup_enabled     boolean,
    imap_host          text,
    imap_port          integer,
    imap_tls           text,
    imap_username      text,
    sealed_credentials jsonb,
    health_state       text,
    health_score       double precision,
    health_reason      text,
    health_until       timestamptz,
    removed_at         timestamptz,
    removal_reason     text,
    added_at           timestamptz,
    updated_at         timestamptz NOT NULL,
    last_event_id      uuid        NOT NULL
);

CREATE INDEX mailboxes_org_id_idx ON mailboxes (org_id);
-- user.active promotes every mailbox of a user.
CREATE INDEX mailboxes_user_id_idx ON mailboxes (user_id);

CREATE TABLE orgs (
    org_id            uuid PRIMARY KEY,
    plan              text        NOT NULL,
    dedicated_workers integer     NOT NULL,
    paid              boolean     NOT NULL,
    source            text        NOT NULL,
    updated_at        timestamptz NOT NULL
);

-- last_active_at is the latest activity seen, whatever order events came in.
CREATE TABLE users (
    user_id        uuid PRIMARY KEY,
    last_active_at timestamptz NOT NULL,
    last_source    text        NOT NULL
);

-- Heartbeat columns are NULL until the first worker.heartbeat, sample
-- columns until the first worker.health_sampled.
CREATE TABLE workers (
    worker_id             uuid PRIMARY KEY,
    tier                  text,
    egress                text,
    address               text,
    stopping              boolean,
    last_heartbeat_at     timestamptz,
    sample_window_seconds bigint,
    sends                 bigint,
    hard_bounces          bigint,
    complaints            bigint,
    sampled_at            timestamptz
);
