package imapsync

import (
	"context"
	"errors"
	"time"

	"github.com/emersion/go-imap/v2"

	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/mailsync"
)

// This file is failure handling: reporting a failure, the wait before
// the next attempt, the disabling of a mailbox whose credentials keep
// being refused, and holding a connection through our database's failures.

// storeFailure reports whether err is our database's, not the IMAP
// session's: the IMAP side's errors are classified (*Error) or the
// server's own (*imap.Error); a fenced write ends the run.
func storeFailure(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind == KindStore
	}
	var ie *imap.Error
	return err != nil && !errors.As(err, &ie) && !errors.Is(err, mailsync.ErrFenced)
}

// syncHeld syncs f on c. A failure of our database keeps the connection:
// the sync is tried again on it after a backoff, a NOOP first to keep the
// session alive and to learn whether it still is. Dropping it instead
// would, while Postgres is down, have every runner of the fleet reconnect
// at once when it returns.
func (m *mailboxRun) syncHeld(ctx context.Context, c *conn, f folder) error {
	retries := m.r.retries()
	for {
		err := m.syncFolder(ctx, c, f)
		if err == nil || ctx.Err() != nil || !storeFailure(err) {
			return err
		}
		m.r.metrics.heldThroughStore.Inc()
		if err := backoff.Sleep(ctx, m.failed(ctx, err, retries, m.r.cfg.BackoffMax)); err != nil {
			return err
		}
		c.arm()
		if err := c.c.Noop().Wait(); err != nil {
			return c.fail("noop", err, ctx)
		}
	}
}

// retries returns the pacing of one retrying loop (a poller, a hot
// session's reconnects, a sync held through our database's failures): it
// counts the loop's failures in a row and gives the wait after each.
func (r *Runner) retries() *backoff.Backoff { return backoff.New(r.retry, nil) }

// failed records a failure in retries, reports it and returns the delay
// before the next attempt: by the runner's retry policy, at most ceiling;
// after refused credentials by its auth policy, which keeps doubling past
// BackoffMax and the ceiling.
func (m *mailboxRun) failed(ctx context.Context, err error, retries *backoff.Backoff, ceiling time.Duration) time.Duration {
	if err == nil {
		err = errors.New("unknown failure")
	}
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Kind: KindStore, Op: "store", Reason: "database operation failed", Err: err}
		var ie *imap.Error
		if errors.As(err, &ie) {
			e.Kind, e.Code, e.Reason = KindProtocol, knownCode(string(ie.Code)), "the server answered "+string(ie.Type)
		}
	}
	d := retries.NextWithin(ceiling)
	consecutive := retries.Failures()
	if e.Kind == KindAuth {
		d = m.r.authRetry.Wait(consecutive, nil)
	}
	now := m.r.cfg.Now()
	f := Failure{MailboxID: m.job.Mailbox.MailboxID, Partition: m.job.Partition, Epoch: m.job.Epoch,
		Tier: string(m.currentTier()), Err: e, Consecutive: consecutive, RetryIn: d, At: now}
	m.r.metrics.failures.WithLabelValues(string(e.Kind)).Inc()
	// Only the server's refusal counts towards disabling: credentials that
	// do not open (a keyring problem) or an OAuth-only mailbox are ours to
	// fix, not the user's.
	if e.Kind == KindAuth {
		since, ferr := m.authFailed(ctx, e, now)
		if errors.Is(ferr, mailsync.ErrFenced) {
			// The next write will be fenced too and end the run.
			m.log.Warn("auth failure not recorded: fenced")
		}
		f.AuthFailingSince = since
		m.r.rep.SyncFailed(ctx, f)
		if !since.IsZero() && now.Sub(since) >= m.r.cfg.DisableAfter && !m.disableSent {
			req := DisableRequest{MailboxID: f.MailboxID, Partition: f.Partition, Epoch: f.Epoch,
				AuthFailingSince: since, Reason: e.Reason, At: now}
			if err := m.disableRequested(ctx, req); err != nil {
				// Tried again at the next failure.
				m.log.Warn("disable request not recorded", "err", err)
			} else {
				m.disableSent = true
				m.r.rep.DisableRequested(ctx, req)
			}
		}
	} else {
		m.r.rep.SyncFailed(ctx, f)
	}
	if e.Kind == KindStore {
		// Our database's words, for the operator (no remote bytes).
		m.log.Info("imap sync failed", "category", e.Kind, "op", e.Op, "err", e.Error(), "cause", e.Err, "retry_in", d)
	} else {
		m.log.Info("imap sync failed", "category", e.Kind, "op", e.Op, "err", e.Error(), "retry_in", d)
	}
	return d
}
