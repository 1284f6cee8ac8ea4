package imapsync

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/emersion/go-imap/v2"

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
	for n := 1; ; n++ {
		err := m.syncFolder(ctx, c, f)
		if err == nil || ctx.Err() != nil || !storeFailure(err) {
			return err
		}
		m.r.metrics.heldThroughStore.Inc()
		t := time.NewTimer(m.failed(ctx, err, n, m.r.cfg.BackoffMax))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		c.arm()
		if err := c.c.Noop().Wait(); err != nil {
			return c.fail("noop", err, ctx)
		}
	}
}

// failed reports a failure and returns the delay before the next attempt
// (at most ceiling).
func (m *mailboxRun) failed(ctx context.Context, err error, consecutive int, ceiling time.Duration) time.Duration {
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
	d := m.backoff(consecutive, ceiling)
	if e.Kind == KindAuth {
		d = m.authBackoff(consecutive)
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

// backoff is full jitter over an exponential ceiling.
func (m *mailboxRun) backoff(n int, ceiling time.Duration) time.Duration {
	d := m.r.cfg.BackoffMin
	for i := 1; i < n && d < m.r.cfg.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, m.r.cfg.BackoffMax, max(ceiling, m.r.cfg.BackoffMin))
	// Half fixed, half random: never a zero wait, never a thundering herd.
	return d/2 + rand.N(d/2+1)
}

// authBackoff is the delay after the n-th refused login in a row: doubling
// from BackoffMin up to AuthBackoffMax, half fixed and half random.
func (m *mailboxRun) authBackoff(n int) time.Duration {
	d := m.r.cfg.BackoffMin
	for i := 1; i < n && d < m.r.cfg.AuthBackoffMax; i++ {
		d *= 2
	}
	d = min(d, m.r.cfg.AuthBackoffMax)
	return d/2 + rand.N(d/2+1)
}
