package imapsync

import (
	"context"
	"errors"
	"time"

	"github.com/emersion/go-imap/v2"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailsync"
)

// This file is the hot tier: one connection in IDLE on INBOX, the
// special-use folders checked between IDLE rounds, and the pacing of
// wake-ups.

// hot holds INBOX in IDLE and checks the special-use folders on the same
// connection between IDLE rounds, until ctx is done or the tier changes.
func (m *mailboxRun) hot(ctx context.Context, changed <-chan struct{}) error {
	retries := m.r.retries()
	for ctx.Err() == nil && !closed(changed) {
		synced, err := m.idleSession(ctx, changed)
		if errors.Is(err, mailsync.ErrFenced) {
			return err
		}
		if err == nil || ctx.Err() != nil || closed(changed) {
			break
		}
		if synced {
			retries.Reset() // the connection worked for a while
		}
		t := time.NewTimer(m.failed(ctx, err, retries, m.r.cfg.BackoffMax))
		select {
		case <-ctx.Done():
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

// closed reports whether ch is closed (a tier change, here).
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// idleSession runs one hot connection until it fails, ctx is done (nil)
// or the tier changes (nil). A round: the special-use folders when due
// (checkSpecial), INBOX synced, then IDLE until INBOX changes, the next
// special-use check is due, the refresh, or the end. synced reports
// whether INBOX was synced on it at least once.
func (m *mailboxRun) idleSession(ctx context.Context, changed <-chan struct{}) (synced bool, err error) {
	c, err := m.connect(ctx)
	if err != nil {
		return false, err
	}
	// Released at the first IDLE; after the socket's close when the
	// session ends before it.
	defer m.slot.give()
	defer m.disconnect(c)
	if closed(changed) {
		// Demoted while connecting (the pacer's wait can be long): no
		// sync round for a tier that is over.
		return false, nil
	}
	inbox := folder{name: "INBOX", role: RoleInbox}
	if !c.has(imap.CapIdle) && !c.has(imap.CapIMAP4rev2) {
		return false, &Error{Kind: KindProtocol, Op: "idle", Reason: "server does not support IDLE"}
	}
	special, err := m.discover(ctx, c)
	if err != nil {
		return false, err
	}
	special = special[1:] // INBOX first, always
	refresh := m.r.cfg.IdleRefresh
	interval := m.job.PollInterval(domain.SyncTierWarm)
	woke := false // the server woke the last IDLE: INBOX changed
	for {
		m.mu.Lock()
		due := m.lastSpecial.Add(interval)
		m.mu.Unlock()
		// Checked when due, and on a wake-up too (STATUS commands beside
		// the INBOX sync the wake-up costs anyway): mail arriving at INBOX
		// and Junk together, as a warmup round does, is seen together.
		// After a wake-up INBOX is synced first, so that its new mail
		// waits for no other folder; STATUS leaves INBOX selected, so the
		// IDLE follows at once unless a folder had to be selected.
		now := time.Now()
		check := woke || !now.Before(due)
		checked := func() error {
			// A full check (SELECT, flags) on servers without CONDSTORE
			// once per refresh: STATUS does not show their flag changes.
			full := !c.has(imap.CapCondStore) && now.Sub(m.lastSpecialFull) >= refresh
			selected, err := m.checkSpecial(ctx, c, special, full)
			if err != nil {
				return err
			}
			m.mu.Lock()
			m.lastSpecial = now
			m.mu.Unlock()
			if full {
				m.lastSpecialFull = now
			}
			due = now.Add(interval)
			if selected && woke {
				// INBOX again, to IDLE on it (and what arrived meanwhile).
				c.drain()
				return m.syncHeld(ctx, c, inbox)
			}
			return nil
		}
		if check && !woke {
			if err := checked(); err != nil {
				return synced, err
			}
		}
		c.drain()
		if err := m.syncHeld(ctx, c, inbox); err != nil {
			return synced, err
		}
		synced = true
		if check && woke {
			if err := checked(); err != nil {
				return synced, err
			}
		}
		woke = false
		if closed(changed) {
			return synced, nil
		}
		// Each IDLE lasts at most refresh, and ends when the special-use
		// check is due.
		var done bool
		if woke, done, err = m.idle(ctx, c, changed, min(refresh, time.Until(due))); err != nil || done {
			return synced, err
		}
	}
}

// idle IDLEs on INBOX on c for at most wait. It reports whether the server
// woke it (INBOX changed), and done when the session is over (ctx done, or
// the tier changed).
func (m *mailboxRun) idle(ctx context.Context, c *conn, changed <-chan struct{}, wait time.Duration) (woke, done bool, err error) {
	m.r.metrics.idles.Inc()
	// Waiting for the IDLE's acknowledgement is part of the round (and of
	// the setup): a server that never acknowledges it holds the setup slot
	// no longer than any other answer.
	c.arm()
	c.idling = true
	idle, err := c.c.Idle()
	if err != nil {
		return false, false, c.fail("idle", err, ctx)
	}
	// The server acknowledged the IDLE: the session is set up, and the
	// round's operation ends; the IDLE's wait has only its own deadline.
	m.slot.give()
	c.raw.endOp()
	c.armFor(wait + m.r.cfg.IdleMargin)
	t := time.NewTimer(max(wait, 0))
	dropped := false
	select {
	case <-ctx.Done():
	case <-c.c.Closed():
		// The connection ended under the IDLE: the server hung up
		// (BYE, kick, restart), the socket broke or its deadline
		// passed. (The IDLE command ends only with the connection or
		// our DONE.)
		dropped = true
	case <-c.notify:
		woke = true
		// Paced: a server answering every IDLE with an EXISTS at once
		// would have the runner sync in a loop, thousands of rounds a
		// second, a core of the worker's for one mailbox. Mail arriving
		// meanwhile waits at most wakeInterval.
		if wait := time.Until(m.lastWake.Add(wakeInterval)); wait > 0 {
			p := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-c.c.Closed():
				dropped = true
			case <-changed:
			case <-p.C:
			}
			p.Stop()
		}
		m.lastWake = time.Now()
	case <-changed:
	case <-t.C:
	}
	t.Stop()
	if ctx.Err() != nil {
		return false, true, nil
	}
	if dropped && c.raw.over.Load() {
		return false, false, oversized("idle", errOversized)
	}
	if dropped && c.nest.refused.Load() {
		return false, false, refusedAnswer("idle", c.nest.why, c.nest.why)
	}
	if dropped {
		return false, false, &Error{Kind: KindNetwork, Op: "idle", Reason: "connection dropped during IDLE", Err: errors.New("connection closed")}
	}
	// The next round, from the IDLE's end, has its own budgets.
	c.raw.startOp(m.r.cfg.SetupTimeout)
	c.arm()
	if err := idle.Close(); err != nil {
		return false, false, c.fail("idle done", err, ctx)
	}
	if err := idle.Wait(); err != nil {
		return false, false, c.fail("idle done", err, ctx)
	}
	c.idling = false
	return woke, closed(changed), nil
}

// wakeInterval is the shortest time between two IDLEs the server wakes.
const wakeInterval = time.Second
