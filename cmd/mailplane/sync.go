package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/imapsync"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/sealing"
)

// Sync worker settings. The tier knobs keep the names operators of the
// predecessor know (POLL_WARM, ...).
var (
	cfgSyncWorkerID   = register(setting{"sync-worker-id", "MAILPLANE_SYNC_WORKER_ID", "", "sync worker identity, unique per running worker (default host-pid-random)"})
	cfgSyncSession    = register(setting{"sync-session-timeout", "MAILPLANE_SYNC_SESSION_TIMEOUT", "6s", "sync group session timeout: failover time after a worker dies"})
	cfgSyncHeartbeat  = register(setting{"sync-heartbeat-interval", "MAILPLANE_SYNC_HEARTBEAT_INTERVAL", "500ms", "sync group heartbeat interval"})
	cfgPollWarm       = register(setting{"poll-warm", "POLL_WARM", "2m", "poll interval of warm mailboxes (and of hot mailboxes' special-use folders)"})
	cfgPollCold       = register(setting{"poll-cold", "POLL_COLD", "30m", "poll interval of cold mailboxes"})
	cfgSessionGrace   = register(setting{"tier-session-grace", "TIER_SESSION_GRACE", "15m", "a user.active within this long keeps the user's mailboxes hot"})
	cfgHotActivity    = register(setting{"tier-hot-activity", "TIER_HOT_ACTIVITY", "2h", "mail newer than this keeps a mailbox hot"})
	cfgColdAfter      = register(setting{"tier-cold-after", "TIER_COLD_AFTER", "168h", "a mailbox with no mail, session or registration for this long is cold"})
	cfgHotBudget      = register(setting{"hot-budget-per-worker", "HOT_BUDGET_PER_WORKER", "2000", "most hot mailboxes per sync worker; the least recently active session-less ones are demoted"})
	cfgConnectRate    = register(setting{"sync-connect-rate", "MAILPLANE_SYNC_CONNECT_RATE", "50", "IMAP connection setups per second per IMAP host and sync worker (burst the same); every warm or cold poll is one"})
	cfgWarmupHeader   = register(setting{"warmup-header", "MAILPLANE_WARMUP_HEADER", "X-Mailplane-Warmup", "header marking warmup messages (value: mailbox=<sender id>; id=<warmup id>); where they land is health evidence"})
	cfgWarmupKey      = register(setting{"warmup-key", "MAILPLANE_WARMUP_KEY", "", "key warmup headers must be signed with (HMAC-SHA256, sig=); unsigned or forged headers are ignored; required by `mailplane sync` (dev mode keeps one in its data dir)"})
	cfgInsecureWarmup = register(setting{"insecure-unsigned-warmup", "MAILPLANE_INSECURE_UNSIGNED_WARMUP", "false", "sync: run without a warmup key, counting unsigned warmup headers (anyone who can mail a monitored mailbox then moves senders between risk pools); never in production"})
	cfgSyncWorkers    = register(setting{"sync-workers", "MAILPLANE_SYNC_WORKERS", "2", "dev mode: sync workers run in the process"})
)

type syncFlags struct {
	workerID                                                      *string
	session, heartbeat, warm, cold, grace, hotActivity, coldAfter *time.Duration
	budget, connectRate                                           *int
	runner, caFile, warmupHeader, warmupKey, imapAllow            *string
	disableAfter                                                  *time.Duration
	oauth                                                         func() map[domain.Provider]imapsync.OAuthClient
}

func registerSyncFlags(fs *flag.FlagSet) *syncFlags {
	return &syncFlags{
		workerID: cfgSyncWorkerID.String(fs), session: cfgSyncSession.Duration(fs), heartbeat: cfgSyncHeartbeat.Duration(fs),
		warm: cfgPollWarm.Duration(fs), cold: cfgPollCold.Duration(fs), grace: cfgSessionGrace.Duration(fs),
		hotActivity: cfgHotActivity.Duration(fs), coldAfter: cfgColdAfter.Duration(fs), budget: cfgHotBudget.Int(fs), connectRate: cfgConnectRate.Int(fs),
		runner: cfgSyncRunner.String(fs), caFile: cfgIMAPCAFile.String(fs), disableAfter: cfgIMAPDisableAfter.Duration(fs),
		warmupHeader: cfgWarmupHeader.String(fs), warmupKey: cfgWarmupKey.String(fs), oauth: oauthFlags(fs),
		imapAllow: cfgIMAPAllow.String(fs),
	}
}

// transport parses the IMAP allowlist, plus extra entries (dev mode's own
// IMAP server).
func (f *syncFlags) transport(extra ...string) (domain.TransportPolicy, error) {
	return domain.ParseTransportPolicy(strings.Join(append([]string{*f.imapAllow}, extra...), ","))
}

func (f *syncFlags) config() mailsync.Config {
	c := mailsync.DefaultConfig()
	c.WorkerID = *f.workerID
	c.SessionTimeout, c.HeartbeatInterval = *f.session, *f.heartbeat
	c.PollWarm, c.PollCold = *f.warm, *f.cold
	c.TierSessionGrace, c.TierHotActivity, c.TierColdAfter = *f.grace, *f.hotActivity, *f.coldAfter
	c.HotBudgetPerWorker = *f.budget
	c.ConnectRatePerHost, c.ConnectBurstPerHost = float64(*f.connectRate), max(*f.connectRate, 1)
	return c
}

// runSync runs one sync worker; with --state it also runs the
// mailbox.state processor (one per deployment).
func runSync(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sync", flag.ExitOnError)
	brokers, dbURL, opsAddr, logLevel, logFormat, parts := commonRoleFlags(fs)
	sf := registerSyncFlags(fs)
	state := fs.Bool("state", false, "also run the mailbox.state processor (exactly one per deployment is active)")
	sealKeys, sealKeyID := cfgSealKeys.String(fs), cfgSealKeyID.String(fs)
	insecureWarmup := cfgInsecureWarmup.Bool(fs)
	fs.Parse(args)
	log := newLogger(*logLevel, *logFormat)
	if err := checkWarmupKey(*sf.warmupKey, *insecureWarmup, log); err != nil {
		return err
	}
	transport, err := sf.transport()
	if err != nil {
		return err
	}
	var keyring *sealing.Keyring
	if *sealKeys != "" {
		var err error
		if keyring, err = sealing.ParseKeys(*sealKeys, *sealKeyID); err != nil {
			return err
		}
	}
	return runRoles(ctx, &roleConfig{
		log: log, kafka: brokers.config(""), databaseURL: *dbURL,
		opsAddr: *opsAddr, statePartitions: int32(*parts), syncWorkers: 1, syncConfig: sf.config(), stateProc: *state,
		keyring: keyring, syncRunner: *sf.runner, imapCAFile: *sf.caFile, imapDisableAfter: *sf.disableAfter,
		imapWarmupHeader: *sf.warmupHeader, imapWarmupKey: []byte(*sf.warmupKey), imapOAuth: sf.oauth(),
		imapTransport: transport,
	}, nil)
}

// errNoWarmupKey: where warmup mail lands moves its sender between risk
// pools, and anyone can send mail with a warmup header; only a signature
// tells mailplane's own warmup mail from a forgery.
var errNoWarmupKey = errors.New("no warmup key: set MAILPLANE_WARMUP_KEY (--warmup-key) to the key the warmup senders sign with; " +
	"without it anyone who can mail a monitored mailbox moves senders between risk pools. " +
	"--insecure-unsigned-warmup runs without signatures (never in production)")

// checkWarmupKey refuses a sync worker without a warmup key unless the
// operator said, explicitly, to run insecurely; that is logged loudly.
func checkWarmupKey(key string, insecure bool, log *slog.Logger) error {
	switch {
	case key != "":
		return nil
	case !insecure:
		return errNoWarmupKey
	}
	log.Error("INSECURE: --insecure-unsigned-warmup: warmup headers are counted unsigned; anyone who can mail a monitored mailbox can move any sender between risk pools")
	return nil
}

func runState(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("state", flag.ExitOnError)
	brokers, dbURL, opsAddr, logLevel, logFormat, parts := commonRoleFlags(fs)
	fs.Parse(args)
	return runRoles(ctx, &roleConfig{
		log: newLogger(*logLevel, *logFormat), kafka: brokers.config(""), databaseURL: *dbURL,
		opsAddr: *opsAddr, statePartitions: int32(*parts), stateProc: true,
	}, nil)
}

func syncWorkerID(base string, i, n int) string {
	if base == "" || n == 1 {
		return base
	}
	return fmt.Sprintf("%s-%d", base, i+1)
}
