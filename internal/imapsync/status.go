package imapsync

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/topics"
)

// This file is the mailbox's authentication status in
// imap_mailbox_status: failures recorded (since when authentication has
// been failing, across restarts and owners), cleared by a login, and the
// disabling requested once it has failed for DisableAfter.

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
