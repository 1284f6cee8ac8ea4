// Package roles wires mailplane's roles into one process: the ingest API,
// the projectors, the placement engine, the mailbox.state processor, the
// sync workers and the outbox relay, each started from the same
// configuration, stopped together when one fails, with one ops listener
// (metrics and detailed health, package opshttp). The role commands
// (mailplane api, project, engine, sync, state and dev) parse their flags
// here and run Run's process.
package roles

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/billing"
	"github.com/mailplane/mailplane/internal/buildinfo"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/dbpools"
	"github.com/mailplane/mailplane/internal/imapsync"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/opshttp"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/topics"
)

// bodyLimits are the API's body limits per caller class and the console's
// login limit; zero fields take the packages' defaults.
type bodyLimits struct {
	classes         map[api.Class]api.ClassLimits
	rate            api.BodyRate
	loginsPerMinute float64
	loginBurst      int
	trustedProxies  []netip.Prefix
}

// apiOptions are the api.Server options of the limits set.
func (b bodyLimits) apiOptions() []api.Option {
	set := map[api.Class]api.ClassLimits{}
	for k, v := range b.classes {
		if v.Budget > 0 && v.Deadline > 0 {
			set[k] = v
		}
	}
	opts := []api.Option{api.WithClassLimits(set)}
	if b.rate.Min > 0 {
		opts = append(opts, api.WithBodyRate(b.rate))
	}
	return opts
}

// roleConfig is what the roles of one process share.
type roleConfig struct {
	log             *slog.Logger
	kafka           kafka.Config // brokers, SASL and TLS; each client adds its id
	databaseURL     string
	httpAddr        string // the public API (api role)
	opsAddr         string // metrics and detailed health, every role; "" for none
	tokensFile      string // the API's callers (access package)
	fleetSecret     []byte // derives the sending workers' credentials
	inflightBytes   int64  // cap on producers' request bodies being read by the API
	bodies          bodyLimits
	newWorkerRate   float64
	newWorkerBurst  int
	keyring         *sealing.Keyring
	statePartitions int32

	billing *billing.Config // mount the Stripe webhook when set

	api    bool // serve the ingest API
	engine bool // run the placement engine (active or standby)
	// placement configures the engine's decider (zero fields: defaults).
	placement placement.Config
	stateProc bool // run the mailbox.state processor
	// syncWorkers sync workers run in the process (dev mode runs several
	// to show partitions moving between them).
	syncWorkers      int
	syncConfig       mailsync.Config
	syncRunner       string // imap or record
	imapCAFile       string
	imapDisableAfter time.Duration
	// imapBounds are the IMAP runner's bounds on slow and oversized
	// servers (zero fields: imapsync's defaults).
	imapBounds       imapsync.Config
	imapWarmupHeader string
	imapWarmupKey    []byte
	imapOAuth        map[domain.Provider]imapsync.OAuthClient
	// imapTransport is the IMAP allowlist (MAILPLANE_IMAP_ALLOW), applied
	// by the API at ingest and by the IMAP runner at dial time.
	imapTransport domain.TransportPolicy

	// Consumer-group timings per role (zero fields: defaultGroupSession
	// and defaultGroupHeartbeat); sync's are in syncConfig.
	projectorGroup, engineGroup, stateGroup groupTimings

	// pgSizes are the Postgres pools' sizes (zero: the settings'
	// defaults); poolSizes opens only those the roles use.
	pgSizes dbpools.Sizes

	reg       *prometheus.Registry // set by runRoles
	project   bool                 // run the projectors
	applyTops bool                 // apply the topic catalog first (dev mode)
}

// poolSizes are the pools this process opens: serve always (the health
// check), runners for sync workers, work for projectors, the relay and
// the engine.
func (rc *roleConfig) poolSizes() dbpools.Sizes {
	def := func(n int32, s config.Setting) int32 {
		if n > 0 {
			return n
		}
		d, _ := strconv.Atoi(s.Default)
		return int32(d)
	}
	sz := dbpools.Sizes{Serve: def(rc.pgSizes.Serve, config.PGServeConns)}
	if rc.syncWorkers > 0 {
		sz.Runners = def(rc.pgSizes.Runners, config.PGRunnerConns)
	}
	if rc.project || rc.engine || rc.syncWorkers > 0 {
		sz.Work = def(rc.pgSizes.Work, config.PGWorkConns)
	}
	return sz
}

// runRoles starts the configured roles and blocks until ctx is done or a
// role fails; then it stops every role and returns the first error.
func runRoles(ctx context.Context, rc *roleConfig, ready func()) error {
	reg := prometheus.NewRegistry()
	rc.reg = reg
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := buildinfo.Register(reg); err != nil {
		return err
	}
	if rc.databaseURL == "" {
		return config.ErrNoDatabase
	}
	p := newProcess(ctx, rc)
	defer p.shutdown()
	// The ops listener first: while the database is awaited, its /healthz
	// says so and its /metrics answer.
	if err := p.startOps(); err != nil {
		return err
	}
	pools, err := dbpools.Open(p.ctx, rc.databaseURL, rc.poolSizes(),
		dbpools.Options{Logger: rc.log, Waiter: p.dbWait})
	if err != nil {
		if p.ctx.Err() != nil {
			return p.firstErr // stopped (or the ops listener failed) while waiting
		}
		return err
	}
	p.pools = pools
	p.onShutdown(pools.Close)
	if rc.applyTops {
		if err := applyTopics(ctx, rc); err != nil {
			return err
		}
	}
	for _, start := range []func() error{p.startProjectors, p.startRelay, p.startEngine,
		p.startStateProcessor, p.startSyncWorkers, p.startAPI} {
		if err := start(); err != nil {
			return err
		}
	}
	if ready != nil {
		ready()
	}
	p.wg.Wait()
	return p.firstErr
}

// process owns the goroutines of the roles it started and what they use:
// shutdown cancels them, waits for every one, then closes their clients
// in the reverse order of opening.
type process struct {
	rc  *roleConfig
	log *slog.Logger
	reg *prometheus.Registry
	ctx context.Context
	// pools are the process's Postgres pools by purpose (nil until the
	// database answered); dbWait says what opening them waits for.
	pools  *dbpools.Pools
	dbWait *dbpools.Waiter
	// broker and health are the ops listener's (and the API's): the
	// broker client the health check pings, and the one health shape.
	broker *kgo.Client
	health *opshttp.Health
	cancel context.CancelFunc

	wg       sync.WaitGroup
	once     sync.Once
	firstErr error
	closers  []func()
}

func newProcess(ctx context.Context, rc *roleConfig) *process {
	ctx, cancel := context.WithCancel(ctx)
	return &process{rc: rc, log: rc.log, reg: rc.reg, ctx: ctx, cancel: cancel, dbWait: &dbpools.Waiter{}}
}

// kcfg is the client configuration of one role: its client id, and its
// metrics on the process's registry.
func (p *process) kcfg(role string) kafka.Config {
	c := p.rc.kafka.WithClientID("mailplane-" + role)
	c.Registerer = p.reg
	// Each role's clients log through the process log, tagged with the
	// role; a role that carries its own logger keeps it.
	return c.WithLogger(p.log.With("role", role))
}

// start runs role until it returns; an error (other than cancellation)
// is kept if it is the first, and any return stops every role.
func (p *process) start(role string, run func(context.Context) error) {
	p.wg.Go(func() { p.fail(role, run(p.ctx)) })
}

func (p *process) fail(role string, err error) {
	if err != nil && !errors.Is(err, context.Canceled) {
		p.once.Do(func() { p.firstErr = fmt.Errorf("%s: %w", role, err) })
		p.log.Error("role failed", "role", role, "err", err)
	}
	p.cancel()
}

// onShutdown queues f to run once every role has returned.
func (p *process) onShutdown(f func()) { p.closers = append(p.closers, f) }

func (p *process) shutdown() {
	p.cancel()
	p.wg.Wait()
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
}

func applyTopics(ctx context.Context, rc *roleConfig) error {
	kc, err := kafka.NewClient(rc.kafka.WithClientID(rc.kafka.ClientID+"-topics"), kafka.KindAdmin)
	if err != nil {
		return err
	}
	defer kc.Close()
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	rep, err := topics.Apply(tctx, kc, topics.Catalog(topics.Config{StatePartitions: rc.statePartitions, Namespace: rc.kafka.Namespace}))
	if err != nil {
		return fmt.Errorf("topics: %w", err)
	}
	if len(rep.Created) > 0 {
		rc.log.Info("topics created", "topics", rep.Created)
	}
	return rep.Err()
}
