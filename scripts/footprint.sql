-- footprint.sql: Postgres bytes per mailbox and per synced message, measured
-- on mailplane's own tables (docs/capacity.md). Run on an empty database
-- that `mailplane migrate` prepared:
--
--   createdb -h 127.0.0.1 -p PORT -U postgres footprint
--   mailplane migrate --database-url postgres://postgres@127.0.0.1:PORT/footprint
--   psql postgres://postgres@127.0.0.1:PORT/footprint -f scripts/footprint.sql
--
-- It fills, for :'mailboxes' mailboxes (default 20,000) with :'messages'
-- message rows each (default 50), the rows a placed, scored, synced mailbox
-- has, with values of realistic length, then prints total bytes (heap,
-- indexes, TOAST) per mailbox and per message. The rows stay: run it on a
-- throwaway database. psql -v mailboxes=N -v messages=M changes the sizes.
\set ON_ERROR_STOP on
\if :{?mailboxes} \else \set mailboxes 20000 \endif
\if :{?messages} \else \set messages 50 \endif

INSERT INTO mailboxes (mailbox_id, org_id, user_id, address, provider, warmup_enabled, imap_host, imap_port, imap_tls,
    imap_username, sealed_credentials, health_state, health_score, added_at, updated_at, last_event_id)
SELECT md5('m' || i)::uuid, md5('o' || (i % 2000))::uuid, md5('u' || (i / 3))::uuid,
    'mailbox' || i || '@customer-domain.example', 'smtp_imap', i % 4 = 1, 'imap.customer-domain.example', 993, 'implicit',
    'mailbox' || i || '@customer-domain.example',
    jsonb_build_object('kid', 'k1', 'alg', 'AES-256-GCM', 'nonce', encode(sha256(('n' || i)::bytea), 'base64'),
        'ciphertext', encode(sha256(('c' || i)::bytea) || sha256(('d' || i)::bytea), 'base64')),
    'healthy', 97.5, now(), now(), md5('e' || i)::uuid
FROM generate_series(1, :mailboxes) i;

-- Every event the registry and health projectors applied: mailbox.added and
-- a day of hourly health scores.
INSERT INTO applied_events (projector, event_id)
SELECT p, md5(p || i || '/' || h)::uuid FROM generate_series(1, :mailboxes) i, generate_series(1, 25) h,
    (VALUES ('registry'), ('health')) v(p);

INSERT INTO placement_mailboxes (mailbox_id, org_id, worker_id, band, weight_milli, assigned_at, decision_offset)
SELECT md5('m' || i)::uuid, md5('o' || (i % 2000))::uuid, md5('w' || (i % 500))::uuid, 'clean', 1000, now(), i
FROM generate_series(1, :mailboxes) i;

-- Two decisions per mailbox in its history (assigned, one migration).
INSERT INTO placement_history (mailbox_id, decision_offset, decision_id, type, reason, at, from_worker, to_worker, from_band, to_band, cause)
SELECT md5('m' || i)::uuid, i * 2 + k, md5('d' || i || k)::uuid, 'mailplane.placement.assigned.v1', 'mailbox_added', now(),
    CASE WHEN k = 1 THEN md5('w' || (i % 500))::uuid END, md5('w' || ((i + k) % 500))::uuid, 'clean', 'clean', md5('e' || i)::text
FROM generate_series(1, :mailboxes) i, generate_series(0, 1) k;

INSERT INTO mailbox_health (mailbox_id, state, score, bucket_hours, bucket_inbox, bucket_junk, observations, last_eval)
SELECT md5('m' || i)::uuid, 'healthy', 97.5,
    ARRAY(SELECT 490000 + h FROM generate_series(1, 72) h), ARRAY(SELECT 3 FROM generate_series(1, 72)),
    ARRAY(SELECT 0 FROM generate_series(1, 72)), 216, now()
FROM generate_series(1, :mailboxes) i;

INSERT INTO imap_folder_cursors (mailbox_id, folder, role, uidvalidity, last_uid, highest_modseq, epoch, synced_at)
SELECT md5('m' || i)::uuid, f, r, 1700000000, :messages, 12345, 3, now()
FROM generate_series(1, :mailboxes) i, (VALUES ('INBOX', 'inbox'), ('Junk', 'junk'), ('Sent', 'sent')) v(f, r);

INSERT INTO imap_mailbox_status (mailbox_id, last_login_at, updated_at)
SELECT md5('m' || i)::uuid, now(), now() FROM generate_series(1, :mailboxes) i;

INSERT INTO imap_messages (mailbox_id, folder, role, uidvalidity, uid, internal_date, message_id, from_addr, subject, size,
    flags, modseq, epoch, synced_at)
SELECT md5('m' || i)::uuid, 'INBOX', 'inbox', 1700000000, u, now() - u * interval '1 hour',
    '<' || md5(i || '/' || u) || '@mail.sender-domain.example>', 'Some Sender <someone@sender-domain.example>',
    'Re: quarterly numbers for the ' || u || 'th review', 24000 + u, '{\Seen}', 1000 + u, 3, now()
FROM generate_series(1, :mailboxes) i, generate_series(1, :messages) u;

ANALYZE;

SELECT :mailboxes AS mailboxes, :messages AS messages_per_mailbox;
SELECT relname AS "table",
    pg_total_relation_size(c.oid) AS bytes,
    round(pg_total_relation_size(c.oid)::numeric / :mailboxes) AS bytes_per_mailbox
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname = current_schema() AND pg_total_relation_size(c.oid) > 16384
ORDER BY bytes DESC;
SELECT round(sum(pg_total_relation_size(c.oid)) FILTER (WHERE relname <> 'imap_messages')::numeric / :mailboxes) AS bytes_per_mailbox_without_messages,
    round(sum(pg_total_relation_size(c.oid)) FILTER (WHERE relname = 'imap_messages')::numeric / (:mailboxes * :messages)) AS bytes_per_message
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname = current_schema();
