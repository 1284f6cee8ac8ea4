-- Who owns each mailbox and org (domain/ownership.go; internal/ownership).
-- The ingest API writes a claim, in one transaction, before it produces
-- the event that needs it, so two producers adding the same new mailbox at
-- once cannot both win: the second one's INSERT ... ON CONFLICT waits for
-- the first and then reads its owner. The log keeps the facts (each
-- mailbox.added's source, the owner_transferred events), so `mailplane
-- ownership backfill` rebuilds the claims of everything already on it.
--
-- owner is a tenant: a caller's source as the tokens file has it.
-- releasing is the id of a mailbox.removed by the owner that has not been
-- acknowledged by the log yet: the claim is dropped once it is, and only
-- if it still names that removal (a later add by the owner clears it).
CREATE TABLE ownership_claims (
    kind       text        NOT NULL CHECK (kind IN ('mailbox', 'org')),
    id         uuid        NOT NULL,
    owner      text        NOT NULL,
    claimed_at timestamptz NOT NULL,
    releasing  uuid,
    PRIMARY KEY (kind, id)
);

-- One row per completed backfill of the claims from the log (`mailplane
-- ownership backfill`). Until there is one, the API refuses events that
-- need a claim (503 unavailable): claims written on an empty table would
-- let the first caller to touch an existing mailbox take it. A database
-- whose registry is still empty when this migration runs has nothing on
-- the log to backfill (a new installation): it is marked backfilled here.
CREATE TABLE ownership_backfills (
    backfilled_at timestamptz NOT NULL,
    mailboxes     bigint      NOT NULL, -- claims found on the log
    orgs          bigint      NOT NULL,
    written       bigint      NOT NULL, -- of them, claims the table lacked
    unmapped      bigint      NOT NULL  -- claims whose source no tenant speaks as
);
INSERT INTO ownership_backfills (backfilled_at, mailboxes, orgs, written, unmapped)
SELECT now(), 0, 0, 0, 0 WHERE NOT EXISTS (SELECT 1 FROM mailboxes);
