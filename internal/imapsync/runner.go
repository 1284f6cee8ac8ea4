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
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/mailsync"
)

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
	// retry paces the attempts after a failure: from BackoffMin doubling to
	// BackoffMax, half fixed and half random (never a zero wait, never a
	// thundering herd). authRetry, after refused credentials, doubles on
	// to AuthBackoffMax.
	retry, authRetry backoff.Policy
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
		http: cfg.HTTP, rep: cfg.Reporter, log: cfg.Logger, metrics: newMetrics(cfg.Registerer),
		retry:     backoff.Policy{Floor: cfg.BackoffMin, Cap: cfg.BackoffMax, Jitter: backoff.Half},
		authRetry: backoff.Policy{Floor: cfg.BackoffMin, Cap: cfg.AuthBackoffMax, Jitter: backoff.Half}}
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
	m := &mailboxRun{r: r, job: job, log: r.log.With("mailbox", job.Mailbox.MailboxID),
		slot: setupSlot{r: r, host: job.Mailbox.IMAP.Host}}
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
	slot        setupSlot    // the run's goroutine only
	access      *accessToken // OAuth mailboxes: the current access token
	// sealed replaces the job's sealed credentials once the provider
	// rotated the refresh token (nil: the job's); pending is that rotation
	// while its credentials_rotated is not recorded yet.
	sealed  *domain.SealedSecret
	pending *domain.SealedSecret
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

func (m *mailboxRun) currentTier() domain.SyncTier {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tier
}
