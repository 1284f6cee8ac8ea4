package imapsync

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"unsafe"

	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/topics"
)

// This file is the mailbox's credentials: opened (unsealed) only for the
// endpoint they were sealed for, held in a buffer wiped after use, and a
// refresh token the provider rotated sealed and recorded.

// unseal opens the run's current credentials; the caller wipes them.
func (m *mailboxRun) unseal() (*secret, error) {
	mb := m.job.Mailbox
	m.mu.Lock()
	if m.sealed != nil {
		mb.SealedCredentials = m.sealed
	}
	m.mu.Unlock()
	return m.r.unseal(mb)
}

// secret holds unsealed credentials in a buffer that wipe zeroes.
type secret struct {
	buf     []byte
	pw      []byte // a window of buf, or a decoded copy
	refresh []byte // an OAuth refresh token (no password)
}

func (s *secret) password() string {
	if len(s.pw) == 0 {
		return ""
	}
	// A view of the buffer, not a copy: wiping the buffer wipes it. It is
	// used only for the LOGIN command, which copies it to the socket.
	return unsafe.String(&s.pw[0], len(s.pw))
}

func (s *secret) wipe() {
	clear(s.buf)
	clear(s.pw)
	clear(s.refresh)
}

// unseal opens the mailbox's credentials; the caller wipes them.
func (r *Runner) unseal(mb domain.MailboxStateRecord) (*secret, error) {
	if mb.SealedCredentials == nil {
		return nil, &Error{Kind: KindCredentials, Op: "credentials", Reason: "the mailbox has no credentials"}
	}
	// Bound to the endpoint: credentials sealed for another host, port,
	// TLS mode, username or provider do not open, and are never presented.
	plain, err := r.cfg.Keyring.Open(*mb.SealedCredentials, domain.CredentialsAAD(mb.MailboxID, mb.Provider, mb.IMAP))
	if err != nil {
		return nil, &Error{Kind: KindUnbound, Op: "credentials", Reason: "sealed credentials do not open for this mailbox's endpoint", Err: err}
	}
	s := &secret{buf: plain}
	var raw struct {
		Password json.RawMessage `json:"password"`
		Refresh  json.RawMessage `json:"oauth_refresh_token"`
	}
	if err := json.Unmarshal(plain, &raw); err != nil {
		s.wipe()
		return nil, &Error{Kind: KindCredentials, Op: "credentials", Reason: "sealed credentials are not JSON"}
	}
	// RawMessage is a copy of the quoted value: keep it to wipe it too.
	q := []byte(raw.Password)
	if len(q) < 2 || q[0] != '"' {
		clear(q)
		var rt string
		if len(raw.Refresh) > 2 && raw.Refresh[0] == '"' && json.Unmarshal(raw.Refresh, &rt) == nil && rt != "" {
			clear(raw.Refresh)
			s.refresh = []byte(rt)
			return s, nil
		}
		clear(raw.Refresh)
		s.wipe()
		return nil, &Error{Kind: KindCredentials, Op: "credentials", Reason: "neither a password nor an OAuth refresh token"}
	}
	clear(raw.Refresh)
	inner := q[1 : len(q)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		// q is wiped with pw (same backing array).
		s.pw = inner
		return s, nil
	}
	// Escapes: decode (the decoded string is garbage at once).
	var pw string
	_ = json.Unmarshal(q, &pw)
	clear(q)
	s.pw = []byte(pw)
	return s, nil
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
