-- The registry shows disabled mailboxes: the last mailbox.disabled not
-- followed by a mailbox.added (which enables the mailbox again).
ALTER TABLE mailboxes
    ADD COLUMN disabled_at     timestamptz,
    ADD COLUMN disabled_reason text;
