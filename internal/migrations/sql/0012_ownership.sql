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
