package imapsync

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/sealing"
)

// This file is the runner's settings and their defaults.

// MaxIdleRefresh is the longest an IDLE is left running: RFC 9051 lets
// servers drop an idle client after 30 minutes of inactivity.
const MaxIdleRefresh = 25 * time.Minute

// Config tunes the runner. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Keyring opens the mailboxes' sealed credentials (required).
	Keyring *sealing.Keyring
	// RootCAs is the CA bundle server certificates are verified against
	// (MAILPLANE_IMAP_CA_FILE); nil: the system's. Verification is never off.
	RootCAs *x509.CertPool
	// Reporter receives failures and disable requests (nil: dropped).
	Reporter Reporter
	// Logger (nil: discarded). Lines name mailboxes, never credentials.
	Logger *slog.Logger
	// Registerer registers the runner's metrics (nil: not registered).
	Registerer prometheus.Registerer

	// IdleRefresh: an IDLE is ended and re-issued this often (INBOX is
	// re-selected and synced in between), and on servers without
	// CONDSTORE the special-use folders of a hot mailbox are selected
	// rather than checked by STATUS this often. Default and maximum 25 min.
	IdleRefresh time.Duration
	// IdleMargin is added to IdleRefresh for the socket's read deadline
	// while in IDLE (default 30 s).
	IdleMargin time.Duration
	// CommandTimeout bounds every command and the TLS handshake (default
	// 30 s); DialTimeout the TCP connect (default 15 s).
	CommandTimeout time.Duration
	DialTimeout    time.Duration
	// BackoffMin and BackoffMax bound the retry delay after a failure
	// (doubling, half of each wait random; defaults 1 s and 5 min).
	BackoffMin, BackoffMax time.Duration
	// AuthBackoffMax caps the retry delay after refused credentials
	// (default 1 h): the delay keeps doubling past BackoffMax and the poll
	// interval, so a revoked grant or a wrong password is not tried (nor a
	// refresh token exchanged) every few minutes for the day before the
	// mailbox is disabled.
	AuthBackoffMax time.Duration
	// DisableAfter: authentication failing for this long (with no success
	// in between, across restarts and owners) requests the mailbox's
	// disabling (MAILPLANE_IMAP_AUTH_DISABLE_AFTER, default 24 h).
	DisableAfter time.Duration
	// MaxSettingUp bounds the mailboxes setting up at once (default
	// DefaultMaxSettingUp): from the login to the first IDLE (hot), or to
	// the end of the poll (warm, cold). A worker taking over thousands of
	// mailboxes would otherwise have them all logged in and syncing, queued
	// on its Postgres pool, at once: that, not the IDLEs, was the memory
	// peak (BENCHMARKS.md, "Hot mailboxes"). The per-host connect rate
	// (mailsync) paces the connects and logins of each server; this bounds
	// the worker's syncs in flight.
	MaxSettingUp int
	// SetupSharePerHost is the share of MaxSettingUp, in percent, that the
	// mailboxes of one IMAP host (by name, like the connect pacing and the
	// poll slots) may hold at once (MAILPLANE_SYNC_SETUP_SHARE_PER_HOST,
	// default 25; at least one slot): a slow or hostile host cannot hold
	// every slot, and mailboxes of other hosts still set up.
	SetupSharePerHost int
	// SetupTimeout bounds the server's time (armed commands; not our own
	// database's waits) of a whole setup, from the connect to the first
	// IDLE, of a warm or cold poll, and of each round of a hot session
	// between two IDLEs (MAILPLANE_SYNC_SETUP_TIMEOUT, default 3 min).
	// CommandTimeout bounds each answer; this bounds them all together,
	// so a server answering one message every few seconds ends there
	// (KindSlow). The sync's progress is kept: a large first sync cut
	// short goes on from its cursor at the next attempt.
	SetupTimeout time.Duration
	// MaxResponseBytes bounds what a server may send between two of the
	// runner's reads: one command's answer, one fetched message, or what
	// arrives during one IDLE (MAILPLANE_SYNC_IMAP_MAX_RESPONSE, default
	// 4 MiB). MaxSessionBytes bounds what it may send over one setup,
	// poll or hot round (MAILPLANE_SYNC_IMAP_MAX_SESSION, default 1 GiB).
	// Past either the connection is dropped (KindOversized): go-imap holds
	// literals outside body sections wholly in memory, so these bound the
	// memory one mailbox's server can make the worker hold.
	MaxResponseBytes, MaxSessionBytes int64
	// FetchBatch is how many messages are written per fenced transaction
	// (default 500).
	FetchBatch int
	// FlagWindow is how many of a folder's newest messages get their flags
	// re-fetched on servers without CONDSTORE (default 500).
	FlagWindow int
	// OAuth holds the OAuth clients of the providers whose mailboxes log
	// in with a refresh token (gmail, outlook).
	OAuth map[domain.Provider]OAuthClient
	// HTTP is the client for token endpoints (default: 30 s timeout).
	HTTP *http.Client
	// WarmupHeader names the header that marks warmup messages (default
	// DefaultWarmupHeader). Where each lands (INBOX or Junk) is reported
	// once per message as a warmup_observed through the outbox.
	WarmupHeader string
	// WarmupKey, when set, is the key warmup headers must be signed with
	// (MAILPLANE_WARMUP_KEY); unsigned or forged ones are ignored.
	WarmupKey []byte
	// Transport is the operator's allowlist of internal hosts and networks
	// (MAILPLANE_IMAP_ALLOW): the runner connects to no loopback, private,
	// link-local, CGNAT, unspecified or multicast address outside it, and
	// sends plain text (tls none) only to loopback or allowlisted servers,
	// checked on the resolved address before connecting. The zero value
	// allows public addresses with TLS only.
	Transport domain.TransportPolicy
	// Dial opens TCP connections (default a net.Dialer with keep-alives
	// that applies Transport to each resolved address before connecting);
	// a custom one has the connected peer's address checked instead.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// DefaultMaxSettingUp is Config.MaxSettingUp's default: far more than
// the runner's Postgres pool can serve at once (4 connections on 2 cores),
// so the bound costs no throughput, and small next to a worker's mailboxes.
const DefaultMaxSettingUp = 128

// Defaults of the bounds a hostile or slow IMAP server meets (Config).
const (
	DefaultSetupSharePerHost = 25
	DefaultSetupTimeout      = 3 * time.Minute
	DefaultMaxResponseBytes  = 4 << 20
	DefaultMaxSessionBytes   = 1 << 30
)

// DefaultConfig returns the defaults (without a keyring).
func DefaultConfig() Config {
	return Config{
		IdleRefresh:    MaxIdleRefresh,
		IdleMargin:     30 * time.Second,
		CommandTimeout: 30 * time.Second,
		DialTimeout:    15 * time.Second,
		BackoffMin:     time.Second,
		BackoffMax:     5 * time.Minute,
		AuthBackoffMax: time.Hour,
		DisableAfter:   24 * time.Hour,
		FetchBatch:     500,
		FlagWindow:     500,
		MaxSettingUp:   DefaultMaxSettingUp,

		SetupSharePerHost: DefaultSetupSharePerHost,
		SetupTimeout:      DefaultSetupTimeout,
		MaxResponseBytes:  DefaultMaxResponseBytes,
		MaxSessionBytes:   DefaultMaxSessionBytes,
	}
}
