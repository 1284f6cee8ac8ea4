package roles

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/imapsync"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/memlimit"
	"github.com/mailplane/mailplane/internal/sealing"
)

type syncFlags struct {
	workerID                                           *string
	group                                              groupFlags
	warm, cold, grace, hotActivity, coldAfter          *time.Duration
	budget, connectRate, pollsInFlight                 *int
	runner, caFile, warmupHeader, warmupKey, imapAllow *string
	disableAfter, setupTimeout                         *time.Duration
	setupShare, maxResponseKiB, maxSessionMiB          *int
	oauth                                              func() map[domain.Provider]imapsync.OAuthClient
}

func registerSyncFlags(fs *flag.FlagSet) *syncFlags {
	return &syncFlags{
		workerID: config.SyncWorkerID.String(fs), group: registerGroupFlags(fs, config.SyncSession, config.SyncHeartbeat),
		warm: config.PollWarm.Duration(fs), cold: config.PollCold.Duration(fs), grace: config.SessionGrace.Duration(fs),
		hotActivity: config.HotActivity.Duration(fs), coldAfter: config.ColdAfter.Duration(fs), budget: config.HotBudget.Int(fs), connectRate: config.ConnectRate.Int(fs),
		pollsInFlight: config.PollsInFlight.Int(fs),
		runner:        config.SyncRunner.String(fs), caFile: config.IMAPCAFile.String(fs), disableAfter: config.IMAPDisableAfter.Duration(fs),
		warmupHeader: config.WarmupHeader.String(fs), warmupKey: config.WarmupKey.String(fs), oauth: oauthFlags(fs),
		imapAllow: config.IMAPAllow.String(fs), setupTimeout: config.SetupTimeout.Duration(fs), setupShare: config.SetupSharePerHost.Int(fs),
		maxResponseKiB: config.IMAPMaxResponse.Int(fs), maxSessionMiB: config.IMAPMaxSession.Int(fs),
	}
}

// transport parses the IMAP allowlist, plus extra entries (dev mode's own
// IMAP server).
func (f *syncFlags) transport(extra ...string) (domain.TransportPolicy, error) {
	return domain.ParseTransportPolicy(strings.Join(append([]string{*f.imapAllow}, extra...), ","))
}

// applyIMAP copies the IMAP runner's settings into rc, with the warmup
// key and the transport policy in effect.
func (f *syncFlags) applyIMAP(rc *roleConfig, warmupKey []byte, transport domain.TransportPolicy) {
	rc.syncRunner, rc.imapCAFile, rc.imapDisableAfter = *f.runner, *f.caFile, *f.disableAfter
	rc.imapWarmupHeader, rc.imapWarmupKey, rc.imapOAuth, rc.imapTransport = *f.warmupHeader, warmupKey, f.oauth(), transport
	rc.imapBounds = imapsync.Config{SetupTimeout: *f.setupTimeout, SetupSharePerHost: *f.setupShare,
		MaxResponseBytes: int64(*f.maxResponseKiB) << 10, MaxSessionBytes: int64(*f.maxSessionMiB) << 20}
}

// config reads the flags once parsed; group timings that cannot work are
// refused.
func (f *syncFlags) config() (mailsync.Config, error) {
	g, err := f.group.timings()
	if err != nil {
		return mailsync.Config{}, err
	}
	c := mailsync.DefaultConfig()
	c.WorkerID = *f.workerID
	c.SessionTimeout, c.HeartbeatInterval = g.session, g.heartbeat
	c.PollWarm, c.PollCold = *f.warm, *f.cold
	c.TierSessionGrace, c.TierHotActivity, c.TierColdAfter = *f.grace, *f.hotActivity, *f.coldAfter
	c.HotBudgetPerWorker = *f.budget
	c.ConnectRatePerHost, c.ConnectBurstPerHost = float64(*f.connectRate), max(*f.connectRate, 1)
	c.PollsInFlight = *f.pollsInFlight
	return c, nil
}

// Sync is `mailplane sync`: one sync worker; with --state it also runs
// the mailbox.state processor (one per deployment).
func Sync(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sync", flag.ExitOnError)
	cf := registerCommonFlags(fs)
	sf := registerSyncFlags(fs)
	state := fs.Bool("state", false, "also run the mailbox.state processor (exactly one per deployment is active)")
	stateGroup := registerGroupFlags(fs, config.StateSession, config.StateHeartbeat)
	sealKeys, sealKeyID := config.SealKeys.String(fs), config.SealKeyID.String(fs)
	insecureWarmup := config.InsecureWarmup.Bool(fs)
	memLimit := config.SyncMemLimit.String(fs)
	fs.Parse(args)
	log := cf.logger()
	// Before the first mailbox: the ramp is where the heap grows.
	spec, err := memlimit.Parse(*memLimit)
	if err != nil {
		return fmt.Errorf("%s: %w", config.SyncMemLimit.Env, err)
	}
	memlimit.Apply(spec, log)
	if err := checkWarmupKey(*sf.warmupKey, *insecureWarmup, log); err != nil {
		return err
	}
	transport, err := sf.transport()
	if err != nil {
		return err
	}
	rc := cf.roleConfig(log)
	if rc.stateGroup, err = stateGroup.timings(); err != nil {
		return err
	}
	if *sealKeys != "" {
		if rc.keyring, err = sealing.ParseKeys(*sealKeys, *sealKeyID); err != nil {
			return err
		}
	}
	if rc.syncConfig, err = sf.config(); err != nil {
		return err
	}
	rc.syncWorkers, rc.stateProc = 1, *state
	sf.applyIMAP(rc, []byte(*sf.warmupKey), transport)
	return runRoles(ctx, rc, nil)
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

func syncWorkerID(base string, i, n int) string {
	if base == "" || n == 1 {
		return base
	}
	return fmt.Sprintf("%s-%d", base, i+1)
}
