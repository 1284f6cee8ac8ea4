// Package imapsync is the IMAP runner of the sync fleet: it implements
// mailsync.Runner on go-imap v2 and writes message metadata and per-folder
// cursors to Postgres through the job's fenced writer.
//
// Per tier (changes take effect at once, without a restart; a hot session
// ends the command under way first, then logs out):
//   - hot: one connection per mailbox, in IDLE on INBOX; EXISTS, EXPUNGE
//     or FETCH wake it and INBOX is synced incrementally. Every PollWarm,
//     and on such a wake-up, the IDLE is ended and the special-use folders
//     (Junk, Sent) are checked on the same connection: a STATUS of each,
//     and a SELECT and sync only of those that changed since their last
//     sync (on servers without CONDSTORE, whose STATUS shows no flag
//     changes, a full sync once per IdleRefresh); then IDLE again on INBOX
//     (re-selected if another folder was). An IDLE lasts at most
//     Config.IdleRefresh (at most 25 min). No goroutine of its own beyond
//     the Run's, go-imap's reader and its IDLE's.
//   - warm / cold: connect, sync INBOX and the special-use folders,
//     disconnect, every PollWarm / PollCold.
//
// Sync is incremental by UID per folder. UIDVALIDITY is checked on every
// SELECT; a change deletes the folder's rows of the old UIDVALIDITY and
// resyncs it. Flag changes come from CONDSTORE (CHANGEDSINCE the folder's
// stored HIGHESTMODSEQ) where the server offers it, else from re-fetching
// the flags of the last Config.FlagWindow messages. When a folder holds
// another number of messages than rows are stored for it, a UID SEARCH ALL
// finds the messages gone (expunged, or moved away) and their rows are
// deleted; a steady poll costs no extra command.
//
// A runner has at most Config.MaxSettingUp mailboxes logged in and not yet
// settled (before their first IDLE, or in a poll) at once: a worker taking
// over thousands of mailboxes ramps through that bound instead of holding
// all their first syncs in memory together.
//
// go-imap v2 takes no context: every command runs under a deadline set on
// the socket (Config.CommandTimeout; IdleRefresh + IdleMargin while in
// IDLE), ctx being done closes the socket, and the connection's end is
// watched during IDLE, so a dropped, half-open or black-holed connection
// is noticed and replaced, after a backoff with jitter.
package imapsync

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"log/slog"
	"math/rand/v2"
	"mime"
	"net"
	"net/http"
	"sync"
	"time"
	"unsafe"

	"github.com/emersion/go-imap/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/sealing"
)

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
	// (doubling, full jitter; defaults 1 s and 5 min).
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

// Runner is the IMAP runner. One Runner serves every mailbox of a worker;
// it is safe for concurrent Runs.
type Runner struct {
	cfg   Config
	setup chan struct{} // setup slots: a send takes one
	// hostSetups holds each host's share of the setup slots, taken before
	// one of setup.
	hostSetups *mailsync.HostSlots
	http       *http.Client
	rep        Reporter
	log        *slog.Logger
	metrics    *metrics
}

var _ mailsync.Runner = (*Runner)(nil)

// New returns a runner.
func New(cfg Config) (*Runner, error) {
	d := DefaultConfig()
	if cfg.Keyring == nil {
		return nil, errors.New("imapsync: a keyring is required")
	}
	if cfg.IdleRefresh <= 0 || cfg.IdleRefresh > MaxIdleRefresh {
		cfg.IdleRefresh = d.IdleRefresh
	}
	setDefault(&cfg.IdleMargin, d.IdleMargin)
	setDefault(&cfg.CommandTimeout, d.CommandTimeout)
	setDefault(&cfg.DialTimeout, d.DialTimeout)
	setDefault(&cfg.BackoffMin, d.BackoffMin)
	setDefault(&cfg.BackoffMax, d.BackoffMax)
	setDefault(&cfg.AuthBackoffMax, d.AuthBackoffMax)
	setDefault(&cfg.DisableAfter, d.DisableAfter)
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = cfg.BackoffMin
	}
	if cfg.AuthBackoffMax < cfg.BackoffMax {
		cfg.AuthBackoffMax = cfg.BackoffMax
	}
	if cfg.FetchBatch <= 0 {
		cfg.FetchBatch = d.FetchBatch
	}
	if cfg.FlagWindow <= 0 {
		cfg.FlagWindow = d.FlagWindow
	}
	if cfg.MaxSettingUp <= 0 {
		cfg.MaxSettingUp = d.MaxSettingUp
	}
	if cfg.SetupSharePerHost <= 0 || cfg.SetupSharePerHost > 100 {
		cfg.SetupSharePerHost = d.SetupSharePerHost
	}
	setDefault(&cfg.SetupTimeout, d.SetupTimeout)
	if cfg.MaxResponseBytes <= 0 {
		cfg.MaxResponseBytes = d.MaxResponseBytes
	}
	if cfg.MaxSessionBytes <= 0 {
		cfg.MaxSessionBytes = d.MaxSessionBytes
	}
	if cfg.WarmupHeader == "" {
		cfg.WarmupHeader = DefaultWarmupHeader
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r := &Runner{cfg: cfg, setup: make(chan struct{}, cfg.MaxSettingUp), hostSetups: mailsync.NewHostSlots(HostSetupSlots(cfg.MaxSettingUp, cfg.SetupSharePerHost)),
		http: cfg.HTTP, rep: cfg.Reporter, log: cfg.Logger, metrics: newMetrics(cfg.Registerer)}
	if r.http == nil {
		r.http = &http.Client{Timeout: cfg.CommandTimeout}
	}
	if r.rep == nil {
		r.rep = nopReporter{}
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	return r, nil
}

// HostSetupSlots is how many of maxSettingUp setup slots one host's
// mailboxes may hold: sharePercent of them, at least one.
func HostSetupSlots(maxSettingUp, sharePercent int) int {
	return max(1, maxSettingUp*sharePercent/100)
}

func setDefault(p *time.Duration, d time.Duration) {
	if *p <= 0 {
		*p = d
	}
}

// Run syncs job's mailbox until ctx is done. It retries failures itself
// (backoff with jitter) and returns only when ctx is done (nil) or a write
// was fenced (an error wrapping mailsync.ErrFenced).
func (r *Runner) Run(ctx context.Context, job *mailsync.Job) error {
	m := &mailboxRun{r: r, job: job, log: r.log.With("mailbox", job.Mailbox.MailboxID)}
	defer m.forgetToken()
	return m.run(ctx)
}

// mailboxRun is the state of one Run.
type mailboxRun struct {
	r   *Runner
	job *mailsync.Job
	log *slog.Logger

	mu          sync.Mutex
	tier        domain.SyncTier
	cursors     map[string]cursor // by folder name
	loaded      bool
	newest      time.Time
	lastPoll    time.Time // last complete poll of all folders
	lastSpecial time.Time // last complete poll of the special-use folders
	// lastSpecialFull is the hot session's last check of the special-use
	// folders by SELECT rather than STATUS.
	lastSpecialFull time.Time
	// lastWake is when the server last woke an IDLE (the hot session's
	// goroutine only).
	lastWake time.Time
	// seen is each folder's state as of its last complete sync: a hot
	// session's STATUS that matches it needs no SELECT. Used by the run's
	// one goroutine only.
	seen        map[string]folderState
	disableSent bool
	authFailing bool
	settingUp   bool         // holds a setup slot; the run's goroutine only
	hostRelease func()       // gives back the host's share of the slot held
	access      *accessToken // OAuth mailboxes: the current access token
	// sealed replaces the job's sealed credentials once the provider
	// rotated the refresh token (nil: the job's); pending is that rotation
	// while its credentials_rotated is not recorded yet.
	sealed  *domain.SealedSecret
	pending *domain.SealedSecret
}

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

func (m *mailboxRun) run(ctx context.Context) error {
	for {
		tier, changed := m.job.Tier()
		m.mu.Lock()
		m.tier = tier
		m.mu.Unlock()
		var err error
		if tier == domain.SyncTierHot {
			// The hot session watches changed itself, in the waits between
			// its commands: no goroutine per hot mailbox for it.
			err = m.hot(ctx, changed)
		} else {
			err = m.polled(ctx, tier, changed)
		}
		if errors.Is(err, mailsync.ErrFenced) {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		// The tier changed: go on in the new one.
	}
}

// polled runs the warm or cold poller until ctx is done or the tier
// changes; a change cancels a poll under way.
func (m *mailboxRun) polled(ctx context.Context, tier domain.SyncTier, changed <-chan struct{}) error {
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-changed:
			cancel()
		case <-stop:
		}
	}()
	return m.poller(tctx, tier)
}

// poller syncs every folder every interval on a short-lived connection
// (warm, cold).
func (m *mailboxRun) poller(ctx context.Context, tier domain.SyncTier) error {
	interval := m.job.PollInterval(tier)
	m.mu.Lock()
	last := m.lastPoll
	m.mu.Unlock()
	next := last.Add(interval)
	failures := 0
	for {
		if d := time.Until(next); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		err := m.pollOnce(ctx)
		if errors.Is(err, mailsync.ErrFenced) {
			return err
		}
		now := time.Now()
		if err == nil {
			// Recorded even when ctx ended meanwhile: the poll's own "no
			// mail" report can change the tier (warm to cold) before its
			// LOGOUT returns, and the next tier's poller must not log in
			// again for a poll that just completed.
			m.mu.Lock()
			m.lastPoll, m.lastSpecial = now, now
			m.mu.Unlock()
			m.lastSpecialFull = now
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			failures++
			next = time.Now().Add(m.failed(ctx, err, failures, interval))
			continue
		}
		failures = 0
		next = now.Add(interval)
	}
}

// pollOnce connects, syncs the folders and disconnects.
func (m *mailboxRun) pollOnce(ctx context.Context) error {
	release, err := m.job.PollSlot(ctx)
	if err != nil {
		return err
	}
	defer release() // after the disconnect below
	c, err := m.connect(ctx)
	if err != nil {
		return err
	}
	defer m.endSetup()
	defer m.disconnect(c)
	folders, err := m.discover(ctx, c)
	if err != nil {
		return err
	}
	for _, f := range folders {
		if err := m.syncHeld(ctx, c, f); err != nil {
			return err
		}
	}
	m.mu.Lock()
	none := m.newest.IsZero()
	m.mu.Unlock()
	if none {
		m.job.ReportNoMail()
	}
	return nil
}

// hot holds INBOX in IDLE and checks the special-use folders on the same
// connection between IDLE rounds, until ctx is done or the tier changes.
func (m *mailboxRun) hot(ctx context.Context, changed <-chan struct{}) error {
	failures := 0
	for ctx.Err() == nil && !closed(changed) {
		synced, err := m.idleSession(ctx, changed)
		if errors.Is(err, mailsync.ErrFenced) {
			return err
		}
		if err == nil || ctx.Err() != nil || closed(changed) {
			break
		}
		if synced {
			failures = 0 // the connection worked for a while
		}
		failures++
		t := time.NewTimer(m.failed(ctx, err, failures, m.r.cfg.BackoffMax))
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
	defer m.endSetup()
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
	m.endSetup()
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

func (m *mailboxRun) currentTier() domain.SyncTier {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tier
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

var wordDecoder = &mime.WordDecoder{}
