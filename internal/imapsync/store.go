package imapsync

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/topics"
)

// All writes go through the job's fenced Writer: each runs in a transaction
// that first checks the partition's epoch.

const loadSQL = `SELECT c.folder, c.role, c.uidvalidity, c.last_uid, c.highest_modseq,
       (SELECT count(*) FROM imap_messages m WHERE m.mailbox_id = c.mailbox_id AND m.folder = c.folder AND m.uidvalidity = c.uidvalidity)
FROM imap_folder_cursors c WHERE c.mailbox_id = $1`

const loadStatusSQL = `SELECT
    (SELECT max(internal_date) FROM imap_messages WHERE mailbox_id = $1),
    (SELECT auth_failing_since FROM imap_mailbox_status WHERE mailbox_id = $1)`

// loadCursors reads the mailbox's cursors once per run.
func (m *mailboxRun) loadCursors(ctx context.Context) error {
	m.mu.Lock()
	loaded := m.loaded
	m.mu.Unlock()
	if loaded {
		return nil
	}
	cursors := map[string]cursor{}
	var (
		newest  *time.Time
		failing *time.Time
	)
	id := m.job.Mailbox.MailboxID
	err := m.job.Writer.Write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, loadSQL, id)
		if err != nil {
			return err
		}
		var (
			c                 cursor
			uv, lu, ms, count int64
		)
		_, err = pgx.ForEachRow(rows, []any{&c.folder, &c.role, &uv, &lu, &ms, &count}, func() error {
			c.uidValidity, c.lastUID, c.modseq, c.stored = uint32(uv), uint32(lu), uint64(ms), int(count)
			cursors[c.folder] = c
			return nil
		})
		if err != nil {
			return err
		}
		return tx.QueryRow(ctx, loadStatusSQL, id).Scan(&newest, &failing)
	})
	if err != nil {
		return wrapf("imapsync: load cursors", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.loaded {
		return nil
	}
	m.cursors = cursors
	m.loaded = true
	m.authFailing = failing != nil
	if newest != nil {
		m.newest = *newest
		m.job.ReportNewestMail(*newest)
	}
	return nil
}

func (m *mailboxRun) cursor(folder string) (cursor, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.cursors[folder]
	return c, ok
}

func (m *mailboxRun) setCursor(c cursor) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cursors[c.folder] = c
}

const cursorSQL = `INSERT INTO imap_folder_cursors AS c
    (mailbox_id, folder, role, uidvalidity, last_uid, highest_modseq, epoch, synced_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp())
ON CONFLICT (mailbox_id, folder) DO UPDATE SET
    role = EXCLUDED.role, uidvalidity = EXCLUDED.uidvalidity, last_uid = EXCLUDED.last_uid,
    highest_modseq = EXCLUDED.highest_modseq, epoch = EXCLUDED.epoch, synced_at = EXCLUDED.synced_at`

func (m *mailboxRun) writeCursor(ctx context.Context, tx pgx.Tx, c cursor) error {
	_, err := tx.Exec(ctx, cursorSQL, m.job.Mailbox.MailboxID, c.folder, c.role, int64(c.uidValidity),
		int64(c.lastUID), int64(c.modseq), m.job.Epoch)
	return err
}

// resetFolder drops a folder's rows of any other UIDVALIDITY and restarts
// its cursor.
func (m *mailboxRun) resetFolder(ctx context.Context, c cursor) error {
	err := m.job.Writer.Write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM imap_messages WHERE mailbox_id = $1 AND folder = $2 AND uidvalidity <> $3`,
			m.job.Mailbox.MailboxID, c.folder, int64(c.uidValidity)); err != nil {
			return err
		}
		return m.writeCursor(ctx, tx, c)
	})
	if err != nil {
		return wrapf("imapsync: reset "+c.folder, err)
	}
	m.setCursor(c)
	m.r.metrics.resets.Inc()
	return nil
}

// upsertSQL writes a batch in one statement (arrays unnested) and returns
// how many rows are new.
const upsertSQL = `WITH up AS (INSERT INTO imap_messages AS m
    (mailbox_id, folder, role, uidvalidity, uid, internal_date, message_id, from_addr, subject, size, flags, modseq, epoch, synced_at)
SELECT $1, $2, $3, $4, u.uid, u.idate, NULLIF(u.mid, ''), NULLIF(u.frm, ''), u.subj, u.size,
       string_to_array(u.flags, ' '), u.modseq, $5, clock_timestamp()
FROM unnest($6::bigint[], $7::timestamptz[], $8::text[], $9::text[], $10::text[], $11::bigint[], $12::text[], $13::bigint[])
     AS u(uid, idate, mid, frm, subj, size, flags, modseq)
ON CONFLICT (mailbox_id, folder, uidvalidity, uid) DO UPDATE SET
    role = EXCLUDED.role, internal_date = EXCLUDED.internal_date, message_id = EXCLUDED.message_id,
    from_addr = EXCLUDED.from_addr, subject = EXCLUDED.subject, size = EXCLUDED.size,
    flags = EXCLUDED.flags, modseq = EXCLUDED.modseq, epoch = EXCLUDED.epoch, synced_at = EXCLUDED.synced_at
RETURNING (xmax = 0) AS inserted)
SELECT count(*) FILTER (WHERE inserted) FROM up`

// writeMessages upserts a batch and moves the cursor, in one transaction.
func (m *mailboxRun) writeMessages(ctx context.Context, cp *cursor, batch []message) error {
	c := *cp
	n := len(batch)
	uids, sizes, modseqs := make([]int64, n), make([]int64, n), make([]int64, n)
	dates := make([]time.Time, n)
	mids, froms, subjs, flags := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	newest := time.Time{}
	for i, b := range batch {
		uids[i], sizes[i], modseqs[i] = int64(b.uid), b.size, int64(b.modseq)
		dates[i] = b.internalDate
		mids[i], froms[i], subjs[i], flags[i] = b.messageID, b.from, b.subject, b.flags
		if b.internalDate.After(newest) {
			newest = b.internalDate
		}
	}
	var (
		observed int
		inserted int64
	)
	err := m.job.Writer.Write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, upsertSQL, m.job.Mailbox.MailboxID, c.folder, c.role, int64(c.uidValidity), m.job.Epoch,
			uids, dates, mids, froms, subjs, sizes, flags, modseqs).Scan(&inserted); err != nil {
			return err
		}
		var err error
		if observed, err = m.observeWarmup(ctx, tx, c, batch); err != nil {
			return err
		}
		return m.writeCursor(ctx, tx, c)
	})
	if err != nil {
		return wrapf("imapsync: write "+c.folder, err)
	}
	c.stored += int(inserted)
	*cp = c
	m.setCursor(c)
	m.r.metrics.messages.WithLabelValues(c.role).Add(float64(n))
	m.r.metrics.warmupObserved.WithLabelValues(c.role).Add(float64(observed))
	m.sawMail(newest)
	return nil
}

const flagsSQL = `UPDATE imap_messages AS m
SET flags = string_to_array(u.flags, ' '), modseq = GREATEST(m.modseq, u.modseq), epoch = $4, synced_at = clock_timestamp()
FROM unnest($5::bigint[], $6::text[], $7::bigint[]) AS u(uid, flags, modseq)
WHERE m.mailbox_id = $1 AND m.folder = $2 AND m.uidvalidity = $3 AND m.uid = u.uid
  AND m.flags IS DISTINCT FROM string_to_array(u.flags, ' ')`

// writeFlags applies flag changes and writes the cursor, in one
// transaction.
func (m *mailboxRun) writeFlags(ctx context.Context, c cursor, ups []flagUpdate) error {
	prev, known := m.cursor(c.folder)
	if len(ups) == 0 && known && prev == c {
		return nil // nothing moved: no write
	}
	n := len(ups)
	uids, modseqs, flags := make([]int64, n), make([]int64, n), make([]string, n)
	for i, u := range ups {
		uids[i], modseqs[i], flags[i] = int64(u.uid), int64(u.modseq), u.flags
	}
	err := m.job.Writer.Write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if n > 0 {
			if _, err := tx.Exec(ctx, flagsSQL, m.job.Mailbox.MailboxID, c.folder, int64(c.uidValidity), m.job.Epoch,
				uids, flags, modseqs); err != nil {
				return err
			}
		}
		return m.writeCursor(ctx, tx, c)
	})
	if err != nil {
		return wrapf("imapsync: write flags "+c.folder, err)
	}
	m.setCursor(c)
	return nil
}

// sawMail reports newer mail to the worker.
func (m *mailboxRun) sawMail(t time.Time) {
	m.mu.Lock()
	newer := t.After(m.newest)
	if newer {
		m.newest = t
	}
	m.mu.Unlock()
	if newer {
		m.job.ReportNewestMail(t)
	}
}

const authFailedSQL = `INSERT INTO imap_mailbox_status AS s (mailbox_id, auth_failing_since, last_auth_error, updated_at)
VALUES ($1, $2, $3, $2)
ON CONFLICT (mailbox_id) DO UPDATE SET
    auth_failing_since = COALESCE(s.auth_failing_since, EXCLUDED.auth_failing_since),
    last_auth_error = EXCLUDED.last_auth_error, updated_at = EXCLUDED.updated_at
RETURNING auth_failing_since`

// authFailed records an authentication failure and returns since when
// authentication has been failing.
func (m *mailboxRun) authFailed(ctx context.Context, e *Error, now time.Time) (time.Time, error) {
	var since time.Time
	reason := clean(e.Error(), 500)
	err := m.job.Writer.Write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, authFailedSQL, m.job.Mailbox.MailboxID, now, reason).Scan(&since)
	})
	if err != nil {
		return now, err
	}
	m.mu.Lock()
	m.authFailing = true
	m.mu.Unlock()
	return since, nil
}

// disableRequested records the request and queues the mailbox.disabled
// event, in one fenced transaction: only the current owner disables.
func (m *mailboxRun) disableRequested(ctx context.Context, d DisableRequest) error {
	since := d.AuthFailingSince.UTC()
	ev := domain.Event{ID: domain.NewEventID(), Type: domain.TypeMailboxDisabled, Source: warmupSource, Time: d.At.UTC(),
		Subject: d.MailboxID, Data: &domain.MailboxDisabled{MailboxID: d.MailboxID, Cause: domain.DisableAuthFailing,
			Reason: disableReason(d), FailingSince: &since}}
	rec, err := topics.Encode(ev)
	if err != nil {
		return err
	}
	return m.job.Writer.Write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE imap_mailbox_status SET disable_requested_at = $2, updated_at = $2 WHERE mailbox_id = $1`,
			d.MailboxID, d.At); err != nil {
			return err
		}
		return outbox.Add(ctx, tx, rec)
	})
}

// rotated seals a refresh token the provider rotated, makes it the run's
// credentials at once and records it: a credentials_rotated event through
// the outbox, in a fenced transaction, so the mailbox.state processor
// folds it and the next owner starts with it. A write that fails (not
// fenced) is retried before the next exchange; the token is not lost
// meanwhile, the run holds it.
func (m *mailboxRun) rotated(ctx context.Context, refresh []byte) error {
	plain, err := json.Marshal(domain.Credentials{OAuthRefreshToken: string(refresh)})
	if err != nil {
		return err
	}
	mb := m.job.Mailbox
	s, err := m.r.cfg.Keyring.Seal(plain, domain.CredentialsAAD(mb.MailboxID, mb.Provider, mb.IMAP))
	clear(plain)
	if err != nil {
		return &Error{Kind: KindCredentials, Op: "oauth", Reason: "sealing the rotated refresh token failed", Err: err}
	}
	m.mu.Lock()
	m.sealed, m.pending = &s, &s
	m.mu.Unlock()
	m.r.metrics.rotations.Inc()
	if err := m.recordPending(ctx); err != nil && errors.Is(err, mailsync.ErrFenced) {
		return err
	}
	return nil
}

// recordPending writes the pending rotation, if any, through the outbox.
func (m *mailboxRun) recordPending(ctx context.Context) error {
	m.mu.Lock()
	s := m.pending
	m.mu.Unlock()
	if s == nil {
		return nil
	}
	id := m.job.Mailbox.MailboxID
	rec, err := topics.Encode(domain.Event{ID: domain.NewEventID(), Type: domain.TypeCredentialsRotated, Source: warmupSource,
		Time: m.r.cfg.Now().UTC(), Subject: id, Data: &domain.CredentialsRotated{MailboxID: id, SealedCredentials: s, Cause: domain.RotationOAuth, AddedAt: m.job.Mailbox.AddedAt}})
	if err != nil {
		return err
	}
	err = m.job.Writer.Write(ctx, func(ctx context.Context, tx pgx.Tx) error { return outbox.Add(ctx, tx, rec) })
	if err != nil {
		if !errors.Is(err, mailsync.ErrFenced) {
			m.log.Warn("rotated refresh token not recorded yet: retried before the next exchange", "err", err)
		}
		return err
	}
	m.mu.Lock()
	if m.pending == s {
		m.pending = nil
	}
	m.mu.Unlock()
	return nil
}

// disableReason is the event's reason: the server's refusal, bounded.
func disableReason(d DisableRequest) string {
	r := "IMAP authentication failing since " + d.AuthFailingSince.UTC().Format(time.RFC3339)
	if d.Reason != "" {
		r += ": " + d.Reason
	}
	// The server's text may hold characters no event text may (a CR, a
	// tab): the event would not encode, and the mailbox never be disabled.
	return domain.CleanText(clean(r, 500))
}

// authSucceeded clears a recorded authentication failure.
func (m *mailboxRun) authSucceeded(ctx context.Context) error {
	m.mu.Lock()
	failing := m.authFailing
	m.mu.Unlock()
	if !failing {
		return nil
	}
	err := m.job.Writer.Write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE imap_mailbox_status SET auth_failing_since = NULL, disable_requested_at = NULL,
            last_login_at = $2, updated_at = $2 WHERE mailbox_id = $1`, m.job.Mailbox.MailboxID, m.r.cfg.Now())
		return err
	})
	if err != nil {
		return wrapf("imapsync: record login", err)
	}
	m.mu.Lock()
	m.authFailing, m.disableSent = false, false
	m.mu.Unlock()
	return nil
}

// deleteMissing deletes the folder's rows whose UID is at or below the
// cursor and not in present, and records the count left.
func (m *mailboxRun) deleteMissing(ctx context.Context, c cursor, present []int64) error {
	var deleted int64
	err := m.job.Writer.Write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM imap_messages WHERE mailbox_id = $1 AND folder = $2 AND uidvalidity = $3
            AND uid <= $4 AND uid <> ALL($5::bigint[])`,
			m.job.Mailbox.MailboxID, c.folder, int64(c.uidValidity), int64(c.lastUID), present)
		deleted = tag.RowsAffected()
		return err
	})
	if err != nil {
		return wrapf("imapsync: expunge "+c.folder, err)
	}
	if deleted > 0 {
		m.r.metrics.expunged.Add(float64(deleted))
	}
	// The rows left: those the server still has, at or below the cursor.
	c.stored = len(present)
	m.setCursor(c)
	return nil
}
