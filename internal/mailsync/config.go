package mailsync

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
)

// DefaultGroup is the consumer group of the sync fleet on mailbox.state.
const DefaultGroup = "mailplane-sync"

// Config tunes a sync worker. Zero fields take the defaults of
// DefaultConfig; the command wires each knob to a flag and an environment
// variable (names in the field comments).
type Config struct {
	// WorkerID names this worker as the owner of partitions (in Postgres,
	// audit events and logs). Default: host-pid-random. It must be unique
	// per running worker.
	WorkerID string
	// Group is the consumer group on mailbox.state (default
	// DefaultGroup), within the Kafka configuration's namespace.
	Group string

	// SessionTimeout and HeartbeatInterval are the group timings
	// (MAILPLANE_SYNC_SESSION_TIMEOUT, MAILPLANE_SYNC_HEARTBEAT_INTERVAL,
	// else the shared MAILPLANE_GROUP_SESSION_TIMEOUT and
	// MAILPLANE_GROUP_HEARTBEAT_INTERVAL). The session timeout bounds
	// failover after a crash; the heartbeat interval bounds how quickly
	// members notice a rebalance. Defaults kafka.DefaultSessionTimeout and
	// kafka.DefaultHeartbeatInterval (6s and 500ms).
	SessionTimeout    time.Duration
	HeartbeatInterval time.Duration
	// RebalanceTimeout bounds how long the group waits for members to
	// rejoin (default 30s).
	RebalanceTimeout time.Duration
	// WatchdogMargin: all runners stop when no group request (heartbeat,
	// join, sync) has been answered for SessionTimeout - WatchdogMargin,
	// counted from when the request was sent (not a setting). Default
	// max(SessionTimeout/4, 2*HeartbeatInterval). Negative disables the
	// watchdog (tests of the fence alone).
	WatchdogMargin time.Duration

	// PollWarm is how often a warm mailbox is polled, and how often a hot
	// one polls its special-use folders (MAILPLANE_POLL_WARM, default 2m).
	// PollCold is how often a cold mailbox is polled (MAILPLANE_POLL_COLD,
	// default 30m).
	PollWarm time.Duration
	PollCold time.Duration
	// TierSessionGrace: a user is in session for this long after a
	// user.active, and each worker reads the user topic from this far back
	// (MAILPLANE_TIER_SESSION_GRACE, default 15m).
	TierSessionGrace time.Duration
	// TierHotActivity: a mailbox whose newest mail is this recent is hot
	// (MAILPLANE_TIER_HOT_ACTIVITY, default 2h).
	TierHotActivity time.Duration
	// TierColdAfter: a mailbox with no mail, session or registration more
	// recent than this is cold (MAILPLANE_TIER_COLD_AFTER, default 168h).
	TierColdAfter time.Duration
	// HotBudgetPerWorker caps the hot mailboxes of one worker; above it
	// the least recently active mailboxes that are hot without a session
	// are demoted to warm (MAILPLANE_HOT_BUDGET_PER_WORKER, default 2000;
	// 0 or less: no cap).
	HotBudgetPerWorker int
	// TierEvaluateEvery is the cadence of the full tier evaluation (not a
	// setting; default 30s). user.active promotes at once, and reported
	// mail triggers an evaluation within a second.
	TierEvaluateEvery time.Duration
	// TierUnknownGrace: while a mailbox's runner has not yet reported its
	// newest mail, its tier (inherited from sync.tier or default warm) is
	// kept for this long (default 10m).
	TierUnknownGrace time.Duration

	// ConnectRatePerHost and ConnectBurstPerHost pace connection setup
	// per IMAP host: a token bucket per host (MAILPLANE_SYNC_CONNECT_RATE,
	// default 50/s, burst 50). Every warm and cold poll is a connection
	// setup, so the rate bounds what one worker polls on one host: 50/s is
	// 15,000 polls per 300 s. Rate 0 or less: no pacing.
	ConnectRatePerHost  float64
	ConnectBurstPerHost int
	// PollsInFlight bounds the warm and cold polls the worker runs at once
	// on one IMAP host (Job.PollSlot; MAILPLANE_SYNC_POLLS_IN_FLIGHT,
	// default 256); less than 0: unbounded.
	PollsInFlight int

	// RestartBackoff and RestartMaxBackoff pace the restart of a runner
	// that returned an error (defaults 1s and 60s, with jitter).
	RestartBackoff    time.Duration
	RestartMaxBackoff time.Duration
	// WriteIdleTimeout bounds how long a fenced write's transaction may sit
	// idle (its client paused or gone) holding the partition's share lock,
	// which would block the next owner from taking its epoch (default 5s).
	WriteIdleTimeout time.Duration
	// LoadStallTimeout: a partition being read to its end that makes no
	// progress for this long is considered read (default 5s).
	LoadStallTimeout time.Duration

	// NoOutboxRelay: the worker does not run an outbox relay of its own.
	// Tier records and the sync.audit ownership and tier events are written
	// to the Postgres outbox (event_outbox) in the partition's fenced
	// transaction and reach Kafka only through an outbox relay
	// (outbox.NewRelay) on the same database. By default each worker runs
	// one (only one relay per database publishes at a time; the others
	// stand by); set this when the process runs one relay itself for all
	// its workers.
	NoOutboxRelay bool

	// Logger (default discard) and Registerer (default a private registry)
	// receive the worker's logs and metrics. Workers sharing a registerer
	// add up in the same series.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Now is the worker's one clock (default time.Now): tier decisions,
	// session windows, and the time of every record and event it writes.
	// The watchdog, load stalls, backoffs and connection pacing measure
	// elapsed real time on the monotonic clock instead.
	Now func() time.Time
	// KgoOptions are added to the group consumer's options (tests).
	KgoOptions []kgo.Opt
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Group:               DefaultGroup,
		SessionTimeout:      kafka.DefaultSessionTimeout,
		HeartbeatInterval:   kafka.DefaultHeartbeatInterval,
		RebalanceTimeout:    30 * time.Second,
		PollWarm:            2 * time.Minute,
		PollCold:            30 * time.Minute,
		TierSessionGrace:    15 * time.Minute,
		TierHotActivity:     2 * time.Hour,
		TierColdAfter:       7 * 24 * time.Hour,
		HotBudgetPerWorker:  2000,
		TierEvaluateEvery:   30 * time.Second,
		TierUnknownGrace:    10 * time.Minute,
		ConnectRatePerHost:  50,
		ConnectBurstPerHost: 50,
		PollsInFlight:       256,
		RestartBackoff:      time.Second,
		RestartMaxBackoff:   time.Minute,
		WriteIdleTimeout:    5 * time.Second,
		LoadStallTimeout:    5 * time.Second,
	}
}

// withDefaults fills zero fields and checks the result.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	def := func(v *time.Duration, dv time.Duration) {
		if *v == 0 {
			*v = dv
		}
	}
	if c.WorkerID == "" {
		host, _ := os.Hostname()
		c.WorkerID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), domain.NewEventID()[24:])
	}
	if c.Group == "" {
		c.Group = d.Group
	}
	def(&c.SessionTimeout, d.SessionTimeout)
	def(&c.HeartbeatInterval, d.HeartbeatInterval)
	def(&c.RebalanceTimeout, d.RebalanceTimeout)
	if c.WatchdogMargin == 0 {
		c.WatchdogMargin = max(c.SessionTimeout/4, 2*c.HeartbeatInterval)
	}
	def(&c.PollWarm, d.PollWarm)
	def(&c.PollCold, d.PollCold)
	def(&c.TierSessionGrace, d.TierSessionGrace)
	def(&c.TierHotActivity, d.TierHotActivity)
	def(&c.TierColdAfter, d.TierColdAfter)
	if c.HotBudgetPerWorker == 0 {
		c.HotBudgetPerWorker = d.HotBudgetPerWorker
	}
	def(&c.TierEvaluateEvery, d.TierEvaluateEvery)
	def(&c.TierUnknownGrace, d.TierUnknownGrace)
	if c.ConnectRatePerHost == 0 {
		c.ConnectRatePerHost = d.ConnectRatePerHost
	}
	if c.ConnectBurstPerHost <= 0 {
		c.ConnectBurstPerHost = d.ConnectBurstPerHost
	}
	if c.PollsInFlight == 0 {
		c.PollsInFlight = d.PollsInFlight
	}
	def(&c.RestartBackoff, d.RestartBackoff)
	def(&c.RestartMaxBackoff, d.RestartMaxBackoff)
	def(&c.WriteIdleTimeout, d.WriteIdleTimeout)
	def(&c.LoadStallTimeout, d.LoadStallTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	switch {
	case c.HeartbeatInterval >= c.SessionTimeout:
		return c, errors.New("mailsync: the heartbeat interval must be shorter than the session timeout")
	case c.WatchdogMargin >= c.SessionTimeout-c.HeartbeatInterval:
		return c, fmt.Errorf("mailsync: watchdog margin %s leaves no room for a heartbeat in the session timeout %s", c.WatchdogMargin, c.SessionTimeout)
	case c.PollWarm <= 0 || c.PollCold <= 0 || c.TierSessionGrace < 0 || c.TierHotActivity < 0 || c.TierColdAfter < 0:
		return c, errors.New("mailsync: poll intervals must be positive and tier windows not negative")
	}
	return c, nil
}

func (c Config) policy() domain.SyncTierPolicy {
	return domain.SyncTierPolicy{
		SessionGrace: c.TierSessionGrace,
		HotActivity:  c.TierHotActivity,
		ColdAfter:    c.TierColdAfter,
		UnknownGrace: c.TierUnknownGrace,
		HotBudget:    c.HotBudgetPerWorker,
	}
}
