-- Health scorer (package health): one row per mailbox with warmup evidence,
-- folded from mailplane.mailbox.observations.v1 by domain.HealthPolicy.
-- The state changes it decides are queued in event_outbox in the same
-- transaction as mailplane.mailbox.health_scored.v1 events.
--
-- bucket_* are parallel arrays: per hour of landing (hours since the Unix
-- epoch, ascending) within the scoring window, the warmup messages that
-- landed in the inbox and in junk. until ends the current penalty;
-- penalty_seconds is its length; probation marks the throttled probation
-- after a block. next_check is when the scorer's ticker must evaluate the
-- row again without new evidence (NULL: only on new evidence).
CREATE TABLE mailbox_health (
    mailbox_id      uuid             PRIMARY KEY,
    state           text             NOT NULL CHECK (state IN ('healthy', 'watch', 'throttled', 'quarantined', 'blocked')),
    until           timestamptz,
    penalty_seconds bigint           NOT NULL DEFAULT 0 CHECK (penalty_seconds >= 0),
    probation       boolean          NOT NULL DEFAULT false,
    score           double precision NOT NULL CHECK (score BETWEEN 0 AND 100),
    bucket_hours    bigint[]         NOT NULL DEFAULT '{}',
    bucket_inbox    integer[]        NOT NULL DEFAULT '{}',
    bucket_junk     integer[]        NOT NULL DEFAULT '{}',
    observations    bigint           NOT NULL DEFAULT 0,
    last_eval       timestamptz      NOT NULL,
    next_check      timestamptz,
    changed_at      timestamptz,
    CHECK (cardinality(bucket_hours) = cardinality(bucket_inbox) AND cardinality(bucket_hours) = cardinality(bucket_junk))
);

CREATE INDEX mailbox_health_next_check_idx ON mailbox_health (next_check) WHERE next_check IS NOT NULL;

-- Warmup messages a sync runner has already reported, so a message seen
-- again (a resync after UIDVALIDITY changed, a new owner) is reported once.
-- Written by the runner through its fenced writer, with the observation
-- queued in event_outbox in the same transaction. Rows older than the
-- scoring window are pruned.
CREATE TABLE imap_warmup_seen (
    sender_mailbox_id uuid        NOT NULL,
    warmup_id         text        NOT NULL,
    recipient_mailbox_id uuid     NOT NULL,
    placement         text        NOT NULL CHECK (placement IN ('inbox', 'junk')),
    landed_at         timestamptz NOT NULL,
    seen_at           timestamptz NOT NULL,
    PRIMARY KEY (sender_mailbox_id, warmup_id)
);

CREATE INDEX imap_warmup_seen_seen_at_idx ON imap_warmup_seen (seen_at);
