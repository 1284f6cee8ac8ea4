package imapsync

import (
	"context"
)

// This file is opening a session: cursors, credentials, the OAuth token,
// the dial and login, and the setup slots a logged-in mailbox holds until
// it settles.

// connect opens a connection, reporting and recording authentication
// outcomes. Once logged in it takes a setup slot, held on success until
// the caller's endSetup; a failure releases it.
func (m *mailboxRun) connect(ctx context.Context) (_ *conn, err error) {
	if err := m.loadCursors(ctx); err != nil {
		return nil, err
	}
	// Credentials that do not open for this endpoint (a sealed blob copied
	// onto another host, port, TLS mode or username) end the attempt here:
	// no connection is made to an endpoint they were not sealed for.
	sec, err := m.unseal()
	if err != nil {
		return nil, err
	}
	sec.wipe()
	// An OAuth mailbox gets its access token before it connects: a revoked
	// grant costs no connection to the server.
	if err := m.ensureToken(ctx); err != nil {
		return nil, err
	}
	c, err := m.dial(ctx)
	if err != nil {
		return nil, err
	}
	m.r.metrics.open.WithLabelValues(string(m.currentTier())).Inc()
	c.hold()
	// The slot is taken once logged in, not before the dial: a server
	// that never answers (a dead host, a tarpit) then holds no slot for
	// its timeouts, and cannot stall the setups of the worker's other
	// mailboxes. Connects and logins are paced per host (PaceConnect).
	if err := m.beginSetup(ctx); err != nil {
		m.disconnect(c)
		return nil, err
	}
	defer func() {
		if err != nil {
			m.endSetup()
		}
	}()
	if err := m.authSucceeded(ctx); err != nil {
		m.disconnect(c)
		return nil, err
	}
	return c, nil
}

// beginSetup waits for one of the runner's setup slots, first one of the
// host's share (Config.SetupSharePerHost), then one of the runner's (ctx
// done: its error).
func (m *mailboxRun) beginSetup(ctx context.Context) error {
	if m.settingUp {
		return nil
	}
	m.r.metrics.setupWaiting.Inc()
	release, err := m.r.hostSetups.Acquire(ctx, m.job.Mailbox.IMAP.Host)
	if err == nil {
		select {
		case m.r.setup <- struct{}{}:
		case <-ctx.Done():
			release()
			err = ctx.Err()
		}
	}
	m.r.metrics.setupWaiting.Dec()
	if err != nil {
		return err
	}
	m.settingUp, m.hostRelease = true, release
	m.r.metrics.settingUp.Inc()
	return nil
}

// endSetup releases the run's setup slot, if it holds one.
func (m *mailboxRun) endSetup() {
	if !m.settingUp {
		return
	}
	m.settingUp = false
	<-m.r.setup
	m.hostRelease()
	m.hostRelease = nil
	m.r.metrics.settingUp.Dec()
}

func (m *mailboxRun) disconnect(c *conn) {
	c.close()
	m.r.metrics.open.WithLabelValues(string(m.currentTier())).Dec()
}
