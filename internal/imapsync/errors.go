package imapsync

import (
	"context"
	"fmt"
	"time"
)

// Kind classifies a sync failure: it is the failure's category in
// sync.audit, logs and metrics. A failure's message is ours (a fixed text
// per case), never bytes from the remote: a banner, a NO's text or a
// certificate's names would let whoever runs an IMAP host write into
// sync.audit, and tell a prober what listens where.
type Kind string

// Failure kinds.
const (
	// KindAuth: the server refused the credentials (LOGIN or AUTHENTICATE
	// answered NO, or the OAuth grant was refused). Reported; after
	// Config.DisableAfter of failing, a disable is requested.
	KindAuth Kind = "auth_failed"
	// KindCredentials: the mailbox has no usable credentials (none, not
	// JSON, neither password nor refresh token, no OAuth client for its
	// provider). Reported, retried, never a reason to disable the mailbox.
	KindCredentials Kind = "credentials"
	// KindUnbound: the sealed credentials do not open for the mailbox's
	// endpoint (sealed for another host, port, TLS mode, username or
	// provider, or with a retired key): they are never presented, and no
	// connection is made.
	KindUnbound Kind = "credentials_unbound"
	// KindPolicy: the transport policy refused the endpoint (an internal
	// address not allowlisted, plain text to a non-loopback host): no
	// connection was made.
	KindPolicy Kind = "policy_refused"
	// KindDNS: the host name did not resolve.
	KindDNS Kind = "dns"
	// KindTLS: the TLS handshake failed (untrusted certificate, wrong
	// host name, a server that does not speak TLS).
	KindTLS Kind = "tls"
	// KindNetwork: no IMAP server answered (connection refused, reset or
	// closed, no greeting, a timeout before the greeting), or the
	// connection dropped later. One category for all of them, so refused
	// and open-but-not-IMAP ports look the same.
	KindNetwork Kind = "connect"
	// KindTimeout: a deadline passed after the greeting (a black-holed
	// connection).
	KindTimeout Kind = "timeout"
	// KindProtocol: the server answered a command with NO or BAD.
	KindProtocol Kind = "protocol"
	// KindOversized: the server sent more than a response or a session
	// may hold (Config.MaxResponseBytes between two of the runner's
	// reads: one command's answer, one fetched message, or what arrives
	// during an IDLE; Config.MaxSessionBytes over a setup, poll or hot
	// round): the connection was dropped there, so a server's literal or
	// endless answer costs the worker a bounded amount of memory.
	KindOversized Kind = "server_oversized"
	// KindSlow: a setup, poll or hot round took longer than
	// Config.SetupTimeout of the server's time (its answers, not our
	// database's waits), however often the server sent a byte: a tarpit
	// holds a setup slot for at most that long.
	KindSlow Kind = "server_slow"
	// KindStore: a Postgres write or read failed (not fenced: a fenced
	// write ends the run).
	KindStore Kind = "store"
)

// Error is a sync failure. Its message is ours: never a credential, never
// the remote's words.
type Error struct {
	Kind Kind
	// Op is what failed: dial, tls, starttls, greeting, login, select
	// INBOX, fetch Junk, idle, ...
	Op string
	// Code is the IMAP response code (AUTHENTICATIONFAILED, ...) or OAuth
	// error code (invalid_grant, ...), kept only when it is one of the
	// standard ones (see knownCode).
	Code string
	// Reason is a short fixed text saying what happened.
	Reason string
	// Err is the underlying error, for errors.Is and As; it may hold the
	// remote's bytes, so Error() never prints it.
	Err error
}

func (e *Error) Error() string {
	msg := "imapsync: " + e.Op + ": " + string(e.Kind)
	if e.Code != "" {
		msg += " [" + e.Code + "]"
	}
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// IsAuth reports whether the failure is about the credentials.
func (e *Error) IsAuth() bool {
	return e.Kind == KindAuth || e.Kind == KindCredentials || e.Kind == KindUnbound
}

// knownCodes are the standard IMAP response codes (RFC 5530, RFC 9051) and
// OAuth error codes (RFC 6749 section 5.2) a failure may carry; any other
// code is the remote's invention and dropped.
var knownCodes = map[string]bool{
	"ALERT": true, "ALREADYEXISTS": true, "AUTHENTICATIONFAILED": true, "AUTHORIZATIONFAILED": true,
	"CANNOT": true, "CLIENTBUG": true, "CLOSED": true, "CONTACTADMIN": true, "CORRUPTION": true,
	"EXPIRED": true, "EXPUNGEISSUED": true, "HASCHILDREN": true, "INUSE": true, "LIMIT": true,
	"NONEXISTENT": true, "NOPERM": true, "OVERQUOTA": true, "PARSE": true, "PRIVACYREQUIRED": true,
	"SERVERBUG": true, "TRYCREATE": true, "UIDNOTSTICKY": true, "UNAVAILABLE": true, "UNKNOWN-CTE": true,
	"invalid_request": true, "invalid_client": true, "invalid_grant": true, "unauthorized_client": true,
	"unsupported_grant_type": true, "invalid_scope": true, "temporarily_unavailable": true, "server_error": true,
}

// knownCode returns code when it is a standard one, else "".
func knownCode(code string) string {
	if knownCodes[code] {
		return code
	}
	return ""
}

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
	// Reason is why (our words: never the secret, never the server's).
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
	// SyncFailed reports a failed attempt (every kind; a category and our
	// words, never the secret, never the server's).
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
