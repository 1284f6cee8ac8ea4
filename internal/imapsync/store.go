package imapsync

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
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
