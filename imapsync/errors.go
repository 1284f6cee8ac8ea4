package imapsync

import (
	"context"
	"fmt"
	"time"
)

// Kind classifies a sync failure.
type Kind string

// Failure kinds.
const (
	// KindAuth: the server refused the credentials (LOGIN answered NO).
	// Reported; after Config.DisableAfter of failing, a disable is
	// requested.
	KindAuth Kind = "auth"
	// KindCredentials: the sealed credentials do not open, or hold no
	// password (an OAuth-only mailbox). Reported, retried, never a reason
	// to disable the mailbox.
	KindCredentials Kind = "credentials"
	// KindTLS: the TLS handshake failed (untrusted certificate, wrong
	// host name, a server that does not speak TLS).
	KindTLS Kind = "tls"
	// KindNetwork: dial, read or write failed, or the server closed the
	// connection.
	KindNetwork Kind = "network"
	// KindTimeout: a deadline passed (a black-holed connection).
	KindTimeout Kind = "timeout"
	// KindProtocol: the server answered a command with NO or BAD.
	KindProtocol Kind = "protocol"
	// KindStore: a Postgres write or read failed (not fenced: a fenced
	// write ends the run).
	KindStore Kind = "store"
)

// Error is a sync failure. Its message carries the server's reason, never
// a credential.
type Error struct {
	Kind Kind
	// Op is what failed: dial, tls, starttls, greeting, login, select
	// INBOX, fetch Junk, idle, ...
	Op string
	// Code is the IMAP response code, if any (AUTHENTICATIONFAILED, ...);
	// Reason the server's text (or the TLS error).
	Code   string
	Reason string
	Err    error
}

func (e *Error) Error() string {
	msg := "imapsync: " + e.Op + ": " + string(e.Kind)
	if e.Code != "" {
		msg += " [" + e.Code + "]"
	}
	switch {
	case e.Reason != "":
		msg += ": " + e.Reason
	case e.Err != nil:
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// IsAuth reports whether the failure is about the credentials.
func (e *Error) IsAuth() bool { return e.Kind == KindAuth || e.Kind == KindCredentials }

// Failure is one failed sync attempt of a mailbox: what the lead wires to
// sync.audit as a `sync.failed` event.
type Failure struct {
	MailboxID string
	Partition int32
	Epoch     int64
	Tier      string
	Err       *Error
	// Consecutive counts failed attempts in a row (of this run).
	Consecutive int
	// AuthFailingSince is when authentication began failing without a
	// success since (zero unless Err.Kind is KindAuth); it survives
	// restarts and owner changes (imap_mailbox_status).
	AuthFailingSince time.Time
	// RetryIn is the backoff before the next attempt.
	RetryIn time.Duration
	At      time.Time
}

// DisableRequest says a mailbox is being disabled: its authentication has
// failed for longer than Config.DisableAfter. The runner has queued the
// mailbox.disabled event (through the outbox, in a fenced transaction);
// the mailbox.state processor folds it and the worker stops the runner,
// which keeps retrying (slowly) until then.
type DisableRequest struct {
	MailboxID        string
	Partition        int32
	Epoch            int64
	AuthFailingSince time.Time
	// Reason is the server's last refusal (never the secret).
	Reason string
	At     time.Time
}

func (d DisableRequest) String() string {
	return fmt.Sprintf("disable mailbox %s: authentication failing since %s: %s", d.MailboxID, d.AuthFailingSince.Format(time.RFC3339), d.Reason)
}

// Reporter receives what a runner has to tell the rest of the system. Calls
// come from runner goroutines, must be safe for concurrent use and must not
// block for long.
type Reporter interface {
	// SyncFailed reports a failed attempt (every kind; the server's reason,
	// never the secret).
	SyncFailed(ctx context.Context, f Failure)
	// DisableRequested is called once per run after the mailbox.disabled
	// event was queued: authentication has failed for longer than
	// Config.DisableAfter (and again only after imap_mailbox_status was
	// reset by a success).
	DisableRequested(ctx context.Context, d DisableRequest)
}

type nopReporter struct{}

func (nopReporter) SyncFailed(context.Context, Failure)              {}
func (nopReporter) DisableRequested(context.Context, DisableRequest) {}
