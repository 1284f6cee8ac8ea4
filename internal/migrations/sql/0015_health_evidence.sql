-- The evidence of a mailbox's last health decision (issue 25, "every
-- decision explains itself"): the registry folds the evidence object of
-- the last mailplane.mailbox.health_scored.v1 with the rest of its health
-- group (health_state, health_score, health_reason, health_until), so the
-- query API can say why a mailbox is in its state. NULL: no decision yet,
-- or one written before decisions carried evidence.
ALTER TABLE mailboxes ADD COLUMN health_evidence jsonb;
