package roles

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/billing"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/console"
	"github.com/mailplane/mailplane/internal/dbpools"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/sealing"
)

// commonFlags are the flags every production role takes.
type commonFlags struct {
	brokers                             *config.BrokerFlags
	dbURL, opsAddr, logLevel, logFormat *string
	parts                               *int
	pgServe, pgRunners, pgWork          *int
}

func registerCommonFlags(fs *flag.FlagSet) commonFlags {
	return commonFlags{
		brokers: config.RegisterBrokerFlags(fs), dbURL: config.DatabaseURL.String(fs), opsAddr: config.OpsHTTP.String(fs),
		logLevel: config.LogLevel.String(fs), logFormat: config.LogFormat.String(fs), parts: config.StatePartitions.Int(fs),
		pgServe: config.PGServeConns.Int(fs), pgRunners: config.PGRunnerConns.Int(fs), pgWork: config.PGWorkConns.Int(fs),
	}
}

func (f commonFlags) logger() *slog.Logger { return config.NewLogger(*f.logLevel, *f.logFormat) }

// roleConfig returns the shared part of a role's configuration, once fs
// is parsed.
func (f commonFlags) roleConfig(log *slog.Logger) *roleConfig {
	return &roleConfig{
		log: log, kafka: f.brokers.Config(""), databaseURL: *f.dbURL,
		opsAddr: *f.opsAddr, statePartitions: int32(*f.parts),
		pgSizes: dbpools.Sizes{Serve: int32(*f.pgServe), Runners: int32(*f.pgRunners), Work: int32(*f.pgWork)},
	}
}

// apiFlags are the api role's own settings (dev mode takes them too).
type apiFlags struct {
	http, tokensFile, fleetSecret *string
	inflight, newWorkerBurst      *int
	newWorkerRate                 *float64
	limits                        bodyFlags
}

// bodyFlags are the API's body limits per caller class and the console's
// login limit.
type bodyFlags struct {
	anonymous, console, billing, heartbeat, minRate, loginBurst *int
	grace, deadline                                             *time.Duration
	loginsPerMinute                                             *float64
	trustedProxies                                              *string
}

func registerAPIFlags(fs *flag.FlagSet) apiFlags {
	return apiFlags{
		http: config.HTTP.String(fs), tokensFile: config.APITokensFile.String(fs), fleetSecret: config.WorkerFleetSecret.String(fs),
		inflight: config.HTTPInflightBytes.Int(fs), newWorkerRate: config.WorkerNewRate.Float(fs), newWorkerBurst: config.WorkerNewBurst.Int(fs),
		limits: bodyFlags{
			anonymous: config.HTTPInflightAnonymousBytes.Int(fs), console: config.HTTPInflightConsoleBytes.Int(fs),
			billing: config.HTTPInflightBillingBytes.Int(fs), heartbeat: config.HTTPInflightHeartbeatBytes.Int(fs),
			minRate: config.HTTPMinBodyRate.Int(fs), grace: config.HTTPBodyGrace.Duration(fs), deadline: config.HTTPBodyDeadline.Duration(fs),
			trustedProxies: config.HTTPTrustedProxies.String(fs), loginsPerMinute: config.ConsoleLoginsPerMinute.Float(fs),
			loginBurst: config.ConsoleLoginBurst.Int(fs),
		},
	}
}

// apply copies the API settings into rc.
func (f apiFlags) apply(rc *roleConfig) error {
	rc.httpAddr, rc.tokensFile, rc.fleetSecret = *f.http, *f.tokensFile, []byte(*f.fleetSecret)
	rc.inflightBytes, rc.newWorkerRate, rc.newWorkerBurst = int64(*f.inflight), *f.newWorkerRate, *f.newWorkerBurst
	l := f.limits
	proxies, err := console.ParseTrustedProxies(*l.trustedProxies)
	if err != nil {
		return fmt.Errorf("%s: %w", config.HTTPTrustedProxies.Env, err)
	}
	small := func(n int) api.ClassLimits { return api.ClassLimits{Budget: int64(n), Deadline: *l.deadline} }
	rc.bodies = bodyLimits{
		classes: map[api.Class]api.ClassLimits{
			api.ClassAnonymous: small(*l.anonymous), api.ClassConsole: small(*l.console),
			api.ClassBilling: small(*l.billing), api.ClassHeartbeat: small(*l.heartbeat),
		},
		rate:            api.BodyRate{Min: int64(*l.minRate), Grace: *l.grace},
		loginsPerMinute: *l.loginsPerMinute, loginBurst: *l.loginBurst, trustedProxies: proxies,
	}
	return nil
}

// API is `mailplane api`: the ingest API role.
func API(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("api", flag.ExitOnError)
	cf := registerCommonFlags(fs)
	af := registerAPIFlags(fs)
	sealKeys := config.SealKeys.String(fs)
	sealKeyID := config.SealKeyID.String(fs)
	imapAllow := config.IMAPAllow.String(fs)
	fs.Parse(args)
	transport, err := domain.ParseTransportPolicy(*imapAllow)
	if err != nil {
		return err
	}
	if *af.tokensFile == "" {
		return errors.New("no API tokens file: set MAILPLANE_API_TOKENS_FILE (or --api-tokens-file); `mailplane token` makes its lines")
	}
	if *sealKeys == "" {
		return errors.New("no sealing keys: set MAILPLANE_SEAL_KEYS (id:base64 of 32 bytes)")
	}
	keyring, err := sealing.ParseKeys(*sealKeys, *sealKeyID)
	if err != nil {
		return err
	}
	bc, err := billingConfig()
	if err != nil {
		return err
	}
	rc := cf.roleConfig(cf.logger())
	rc.billing, rc.keyring, rc.api, rc.imapTransport = bc, keyring, true, transport
	if err := af.apply(rc); err != nil {
		return err
	}
	return runRoles(ctx, rc, nil)
}

// Project is `mailplane project`: the projectors.
func Project(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("project", flag.ExitOnError)
	cf := registerCommonFlags(fs)
	gf := registerGroupFlags(fs, config.ProjectorSession, config.ProjectorHeartbeat)
	fs.Parse(args)
	g, err := gf.timings()
	if err != nil {
		return err
	}
	rc := cf.roleConfig(cf.logger())
	rc.project, rc.projectorGroup = true, g
	return runRoles(ctx, rc, nil)
}

// State is `mailplane state`: the mailbox.state processor.
func State(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("state", flag.ExitOnError)
	cf := registerCommonFlags(fs)
	gf := registerGroupFlags(fs, config.StateSession, config.StateHeartbeat)
	fs.Parse(args)
	g, err := gf.timings()
	if err != nil {
		return err
	}
	rc := cf.roleConfig(cf.logger())
	rc.stateProc, rc.stateGroup = true, g
	return runRoles(ctx, rc, nil)
}

// Engine is `mailplane engine`: the placement engine (one active, others
// standby).
func Engine(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("engine", flag.ExitOnError)
	cf := registerCommonFlags(fs)
	placementCfg := placementFlags(fs)
	gf := registerGroupFlags(fs, config.EngineSession, config.EngineHeartbeat)
	fs.Parse(args)
	pc, err := placementCfg()
	if err != nil {
		return err
	}
	g, err := gf.timings()
	if err != nil {
		return err
	}
	rc := cf.roleConfig(cf.logger())
	rc.engine, rc.placement, rc.engineGroup = true, pc, g
	return runRoles(ctx, rc, nil)
}

// placementFlags registers the engine's decider settings on fs; the
// returned func reads them once fs is parsed.
func placementFlags(fs *flag.FlagSet) func() (placement.Config, error) {
	retention := config.WorkerRetention.Duration(fs)
	share := config.LivenessHoldShare.Float(fs)
	minWorkers := config.LivenessHoldMinWorkers.Int(fs)
	holdMax := config.LivenessHoldMax.Duration(fs)
	dwell := config.TierDwell.Duration(fs)
	return func() (placement.Config, error) {
		permille := int64(math.Round(*share * 1000))
		switch {
		case *retention < time.Minute || *retention > domain.MaxWorkerRetentionSeconds*time.Second:
			return placement.Config{}, fmt.Errorf("--%s %s: want a minute to ten years", config.WorkerRetention.Flag, *retention)
		case math.IsNaN(*share) || permille < 1 || permille > 1000:
			return placement.Config{}, fmt.Errorf("--%s %v: want a share above 0 and at most 1", config.LivenessHoldShare.Flag, *share)
		case *minWorkers < 1:
			return placement.Config{}, fmt.Errorf("--%s %d: want at least 1", config.LivenessHoldMinWorkers.Flag, *minWorkers)
		case *holdMax < 0 || *holdMax > 0 && *holdMax < time.Minute:
			return placement.Config{}, fmt.Errorf("--%s %s: want 0 (no bound) or at least a minute", config.LivenessHoldMax.Flag, *holdMax)
		case *dwell < 0 || *dwell > 24*time.Hour:
			return placement.Config{}, fmt.Errorf("--%s %s: want 0 (no dwell) to a day", config.TierDwell.Flag, *dwell)
		}
		pc := placement.Config{WorkerRetention: *retention, LivenessHoldPermille: permille, LivenessHoldMinWorkers: *minWorkers,
			LivenessHoldMax: *holdMax, TierDwell: *dwell}
		// The decider's zero means its default: none is spelled negative.
		if pc.LivenessHoldMax == 0 {
			pc.LivenessHoldMax = -1
		}
		if pc.TierDwell == 0 {
			pc.TierDwell = -1
		}
		return pc, nil
	}
}

// billingConfig reads the Stripe webhook configuration; nil when no
// webhook secret is configured (the route is then not mounted).
func billingConfig() (*billing.Config, error) {
	if os.Getenv("MAILPLANE_STRIPE_WEBHOOK_SECRETS") == "" {
		return nil, nil
	}
	cfg, err := billing.ConfigFromEnv(os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("billing webhook: %w", err)
	}
	return &cfg, nil
}
