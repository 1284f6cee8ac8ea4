-- IMAP sync (imapsync): message metadata, per-folder cursors and
-- per-mailbox login status, all written by IMAP runners through their
-- fenced writer (so every row landed under the partition's current epoch;
-- epoch records which).

-- One row per message per folder generation. A folder's rows of an old
-- UIDVALIDITY are deleted when the runner sees a new one. flags are the
-- message's IMAP flags, sorted; modseq is 0 where the server has no
-- CONDSTORE. role is inbox, junk or sent (the folder's special use).
CREATE TABLE imap_messages (
    mailbox_id    uuid        NOT NULL,
    folder        text        NOT NULL,
    role          text        NOT NULL CHECK (role IN ('inbox', 'junk', 'sent')),
    uidvalidity   bigint      NOT NULL CHECK (uidvalidity >= 0),
    uid           bigint      NOT NULL CHECK (uid > 0),
    internal_date timestamptz NOT NULL,
    message_id    text,
    from_addr     text,
    subject       text        NOT NULL DEFAULT '',
    size          bigint      NOT NULL,
    flags         text[]      NOT NULL DEFAULT '{}',
    modseq        bigint      NOT NULL DEFAULT 0,
    epoch         bigint      NOT NULL,
    synced_at     timestamptz NOT NULL,
    PRIMARY KEY (mailbox_id, folder, uidvalidity, uid)
);

CREATE INDEX imap_messages_message_id_idx ON imap_messages (mailbox_id, message_id);
CREATE INDEX imap_messages_newest_idx ON imap_messages (mailbox_id, internal_date DESC);

-- Where each folder's sync stands: the UIDVALIDITY the rows belong to, the
-- highest UID stored, and the HIGHESTMODSEQ flags are current to (0: no
-- CONDSTORE).
CREATE TABLE imap_folder_cursors (
    mailbox_id     uuid        NOT NULL,
    folder         text        NOT NULL,
    role           text        NOT NULL CHECK (role IN ('inbox', 'junk', 'sent')),
    uidvalidity    bigint      NOT NULL CHECK (uidvalidity >= 0),
    last_uid       bigint      NOT NULL CHECK (last_uid >= 0),
    highest_modseq bigint      NOT NULL DEFAULT 0,
    epoch          bigint      NOT NULL,
    synced_at      timestamptz NOT NULL,
    PRIMARY KEY (mailbox_id, folder)
);

-- Authentication outcomes: since when logins have been refused (NULL:
-- the last attempt succeeded), so the disable-after period survives
-- restarts and owner changes.
CREATE TABLE imap_mailbox_status (
    mailbox_id           uuid        PRIMARY KEY,
    auth_failing_since   timestamptz,
    last_auth_error      text,
    disable_requested_at timestamptz,
    last_login_at        timestamptz,
    updated_at           timestamptz NOT NULL
);
