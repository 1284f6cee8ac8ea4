package imapsync

import (
	"context"
)

// This file is opening a session: cursors, credentials, the OAuth token,
// the dial and login, and the setup slot (setup.go) taken once logged in.

// connect opens a connection, reporting and recording authentication
// outcomes. Once logged in it takes a setup slot, held on success until
// the caller gives it back (m.slot.give); a failure gives it back.
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
	if err := m.slot.take(ctx); err != nil {
		m.disconnect(c)
		return nil, err
	}
	defer func() {
		if err != nil {
			m.slot.give()
		}
	}()
	if err := m.authSucceeded(ctx); err != nil {
		m.disconnect(c)
		return nil, err
	}
	return c, nil
}

func (m *mailboxRun) disconnect(c *conn) {
	c.close()
	m.r.metrics.open.WithLabelValues(string(m.currentTier())).Dec()
}
