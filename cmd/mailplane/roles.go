package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/billing"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/internal/health"
	"github.com/mailplane/mailplane/internal/imapsync"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/placement/projection"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/internal/workerapi"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// roleConfig is what the roles of one process share.
type roleConfig struct {
	log             *slog.Logger
	kafka           kafka.Config // brokers, SASL and TLS; each client adds its id
	databaseURL     string
	httpAddr        string // the public API (api role)
	opsAddr         string // metrics and detailed health, every role; "" for none
	tokensFile      string // the API's callers (access package)
	fleetSecret     []byte // derives the sending workers' credentials
	inflightBytes   int64  // cap on request bodies being read by the API
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
	imapWarmupHeader string
	imapWarmupKey    []byte
	imapOAuth        map[domain.Provider]imapsync.OAuthClient
	// imapTransport is the IMAP allowlist (MAILPLANE_IMAP_ALLOW), applied
	// by the API at ingest and by the IMAP runner at dial time.
	imapTransport domain.TransportPolicy

	reg       *prometheus.Registry // set by runRoles
	project   bool                 // run the projectors
	applyTops bool                 // apply the topic catalog first (dev mode)
}

// runRoles starts the configured roles and blocks until ctx is done or a
// role fails; then it stops every role and returns the first error.
func runRoles(ctx context.Context, rc *roleConfig, ready func()) error {
	log := rc.log
	reg := prometheus.NewRegistry()
	rc.reg = reg
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	kcfg := func(role string) kafka.Config {
		c := rc.kafka.WithClientID("mailplane-" + role)
		c.Registerer = reg
		return c
	}

	if rc.databaseURL == "" {
		return errors.New("no database: set DATABASE_URL (or --database-url)")
	}
	pool, err := openDB(ctx, rc.databaseURL, log)
	if err != nil {
		return err
	}
	defer pool.Close()

	if rc.applyTops {
		if err := applyTopics(ctx, rc); err != nil {
			return err
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	fail := func(role string, err error) {
		if err != nil && !errors.Is(err, context.Canceled) {
			once.Do(func() { firstErr = fmt.Errorf("%s: %w", role, err) })
			log.Error("role failed", "role", role, "err", err)
		}
		cancel()
	}
	start := func(role string, run func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail(role, run(ctx))
		}()
	}

	if rc.project {
		p, err := projections.New(kcfg("projector-registry"), pool, projections.NewRegistry(),
			projections.WithLogger(log.With("role", "projector")),
			projections.WithRegisterer(reg))
		if err != nil {
			return err
		}
		defer p.Close()
		start("projector registry", p.Run)

		// The placement projection reads the decision log with offsets,
		// so it has its own runner (see projection.Projection).
		pp, err := projection.NewProjector(kcfg("projector-placement"), pool,
			projection.WithLogger(log.With("role", "projector")),
			projection.WithRegisterer(reg))
		if err != nil {
			return err
		}
		start("projector placement", pp.Run)
		start("assignment change pruning", func(ctx context.Context) error {
			return pruneAssignmentChanges(ctx, pool, log.With("role", "projector"))
		})

		// The health scorer: a projection of the warmup observations that
		// decides health states, and its ticker for ended penalties.
		hm := health.NewMetrics(reg)
		policy := domain.DefaultHealthPolicy()
		scorer, err := health.NewScorer(policy, health.WithEmitted(func(ev domain.Event) { hm.Committed([]domain.Event{ev}) }))
		if err != nil {
			return err
		}
		hp, err := projections.New(kcfg("projector-health"), pool, scorer,
			projections.WithLogger(log.With("role", "health")),
			projections.WithRegisterer(reg),
			projections.WithCommitted(hm.Committed))
		if err != nil {
			return err
		}
		defer hp.Close()
		start("projector health", hp.Run)
		start("health ticker", health.NewTicker(pool, policy, health.WithMetrics(hm),
			health.WithLogger(log.With("role", "health"))).Run)
		start("warmup seen pruning", func(ctx context.Context) error {
			return pruneWarmupSeen(ctx, pool, policy.Window, log.With("role", "health"))
		})
	}

	// Every process that writes to the outbox (projectors, sync workers)
	// runs a relay; one per database publishes, the others stand by. It
	// stops after every other role, so what they queued while stopping
	// (a sync worker's ownership_lost) is still published.
	if rc.project || rc.syncWorkers > 0 {
		rctx, rcancel := context.WithCancel(context.WithoutCancel(ctx))
		relayDone := make(chan struct{})
		go func() {
			defer close(relayDone)
			_ = outbox.NewRelay(pool, kcfg("outbox"), outbox.WithLogger(log.With("role", "outbox")), outbox.WithRegisterer(reg)).Run(rctx)
		}()
		defer func() {
			rcancel()
			<-relayDone
		}()
	}

	if rc.engine {
		eng, err := engine.New(kcfg("placement-engine"),
			engine.WithLogger(log.With("role", "engine")),
			engine.WithRegisterer(reg),
			engine.WithPlacementConfig(rc.placement),
			// Restore from the placement projection and read only the
			// decision log's tail.
			engine.WithSnapshotter(projection.NewSnapshotter(pool)))
		if err != nil {
			return err
		}
		start("placement engine", eng.Run)
	}

	if rc.stateProc {
		proc, err := mailboxstate.New(kcfg("mailbox-state"),
			mailboxstate.WithLogger(log.With("role", "mailbox-state")), mailboxstate.WithRegisterer(reg))
		if err != nil {
			return err
		}
		start("mailbox.state processor", proc.Run)
	}
	var runner mailsync.Runner
	if rc.syncWorkers > 0 {
		audit, err := kafka.NewProducer(kcfg("sync-audit"))
		if err != nil {
			return err
		}
		defer audit.Close()
		if runner, err = newRunner(rc, audit, log.With("role", "sync")); err != nil {
			return err
		}
	}
	for i := range rc.syncWorkers {
		cfg := rc.syncConfig
		cfg.WorkerID = syncWorkerID(cfg.WorkerID, i, rc.syncWorkers)
		cfg.Logger, cfg.Registerer = log.With("role", "sync", "worker", i+1), reg
		cfg.NoOutboxRelay = true // the process's relay publishes
		w, err := mailsync.New(kcfg(fmt.Sprintf("sync-%d", i+1)), pool, runner, cfg)
		if err != nil {
			return err
		}
		start(fmt.Sprintf("sync worker %d", i+1), w.Run)
	}

	dbCheck := func(ctx context.Context) error { return pool.Ping(ctx) }
	var ops http.Handler
	if rc.api {
		kc, err := kafka.NewProducer(kcfg("api"))
		if err != nil {
			return err
		}
		defer kc.Close()
		auth, err := access.New(rc.tokensFile, access.WithFleetSecret(rc.fleetSecret),
			access.WithLogger(log.With("role", "api")), access.WithRegisterer(reg))
		if err != nil {
			return err
		}
		if len(rc.fleetSecret) == 0 {
			log.Warn("no worker fleet secret (MAILPLANE_WORKER_FLEET_SECRET): sending workers cannot authenticate")
		}
		if rc.tokensFile != "" {
			// Returns only when ctx is done (a role returning stops them all).
			start("tokens file watch", func(ctx context.Context) error { auth.Watch(ctx, 0); return nil })
		}
		pgStore := projection.NewStore(pool)
		limiter := workerapi.NewWorkerLimiter(pgStore, rc.newWorkerRate, rc.newWorkerBurst, reg)
		pc := producer.New(kc, producer.WithSealer(rc.keyring), producer.WithSource("mailplane/api"), producer.WithRegisterer(reg))
		srv, err := api.New(pc,
			api.WithAddr(rc.httpAddr),
			api.WithAuthenticator(auth),
			api.WithAdmission(limiter.Admit),
			api.WithMaxInflightBytes(rc.inflightBytes),
			api.WithSealer(rc.keyring),
			api.WithTransportPolicy(rc.imapTransport),
			api.WithSchemaValidator(eventschema.Default()),
			api.WithBrokerCheck(kc),
			api.WithDatabaseCheck(dbCheck),
			api.WithRegisterer(reg),
			api.WithGatherer(reg),
			api.WithLogger(log.With("role", "api")),
		)
		if err != nil {
			return err
		}
		if err := workerapi.Register(srv, workerapi.WithLogger(log.With("role", "api")),
			workerapi.WithAssignmentStore(pgStore)); err != nil {
			return err
		}
		if rc.billing != nil {
			if err := billing.Register(srv, *rc.billing, billing.WithLogger(log.With("role", "billing")),
				billing.WithDatabase(pool), billing.WithRegisterer(reg)); err != nil {
				return err
			}
		}
		start("api", srv.Run)
		ops = srv.OpsHandler()
	}
	if rc.opsAddr != "" {
		if ops == nil {
			kc, err := kgo.NewClient(kafka.ConnOptions(rc.kafka)...)
			if err != nil {
				return err
			}
			defer kc.Close()
			ops = opsMux(reg, kc, dbCheck)
		}
		start("ops http", func(ctx context.Context) error { return serveOps(ctx, rc.opsAddr, ops, log) })
	}

	if ready != nil {
		ready()
	}
	wg.Wait()
	return firstErr
}

func openDB(ctx context.Context, url string, log *slog.Logger) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := migrations.Apply(mctx, pool, migrations.WithLogger(log)); err != nil {
		pool.Close()
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return pool, nil
}

func applyTopics(ctx context.Context, rc *roleConfig) error {
	kc, err := kgo.NewClient(kafka.ConnOptions(rc.kafka)...)
	if err != nil {
		return err
	}
	defer kc.Close()
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	rep, err := topics.Apply(tctx, kc, topics.Catalog(topics.Config{StatePartitions: rc.statePartitions}))
	if err != nil {
		return fmt.Errorf("topics: %w", err)
	}
	if len(rep.Created) > 0 {
		rc.log.Info("topics created", "topics", rep.Created)
	}
	return rep.Err()
}

// opsMux serves /metrics and the detailed /healthz for roles without the
// API (the API's own is api.Server.OpsHandler).
func opsMux(reg *prometheus.Registry, kc *kgo.Client, dbCheck func(context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		cctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		res := map[string]string{"broker": "ok", "database": "ok"}
		status := http.StatusOK
		if err := kc.Ping(cctx); err != nil {
			res["broker"], status = err.Error(), http.StatusServiceUnavailable
		}
		if err := dbCheck(cctx); err != nil {
			res["database"], status = err.Error(), http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(res)
	})
	return mux
}

// serveOps serves h on the ops listener (--ops-http): metrics and health
// with error text, for operators only, never on the public listener.
func serveOps(ctx context.Context, addr string, h http.Handler, log *slog.Logger) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("ops listener: %w", err)
	}
	log.Info("ops listening (metrics, detailed health)", "addr", ln.Addr().String())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	}
}

// commonRoleFlags registers the flags every production role takes.
func commonRoleFlags(fs *flag.FlagSet) (brokers *brokerFlags, dbURL, opsAddr, logLevel, logFormat *string, parts *int) {
	return registerBrokerFlags(fs), cfgDatabaseURL.String(fs), cfgOpsHTTP.String(fs), cfgLogLevel.String(fs), cfgLogFormat.String(fs), cfgStatePartitions.Int(fs)
}

// apiFlags are the api role's own settings (dev mode takes them too).
type apiFlags struct {
	http, tokensFile, fleetSecret *string
	inflight, newWorkerBurst      *int
	newWorkerRate                 *float64
}

func registerAPIFlags(fs *flag.FlagSet) apiFlags {
	return apiFlags{
		http: cfgHTTP.String(fs), tokensFile: cfgAPITokensFile.String(fs), fleetSecret: cfgWorkerFleetSecret.String(fs),
		inflight: cfgHTTPInflightBytes.Int(fs), newWorkerRate: cfgWorkerNewRate.Float(fs), newWorkerBurst: cfgWorkerNewBurst.Int(fs),
	}
}

// apply copies the API settings into rc.
func (f apiFlags) apply(rc *roleConfig) {
	rc.httpAddr, rc.tokensFile, rc.fleetSecret = *f.http, *f.tokensFile, []byte(*f.fleetSecret)
	rc.inflightBytes, rc.newWorkerRate, rc.newWorkerBurst = int64(*f.inflight), *f.newWorkerRate, *f.newWorkerBurst
}

func runAPI(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("api", flag.ExitOnError)
	brokers, dbURL, opsAddr, logLevel, logFormat, parts := commonRoleFlags(fs)
	af := registerAPIFlags(fs)
	sealKeys := cfgSealKeys.String(fs)
	sealKeyID := cfgSealKeyID.String(fs)
	imapAllow := cfgIMAPAllow.String(fs)
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
	rc := &roleConfig{billing: bc,
		log: newLogger(*logLevel, *logFormat), kafka: brokers.config(""), databaseURL: *dbURL,
		opsAddr: *opsAddr, keyring: keyring, statePartitions: int32(*parts), api: true,
		imapTransport: transport,
	}
	af.apply(rc)
	return runRoles(ctx, rc, nil)
}

func runProject(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("project", flag.ExitOnError)
	brokers, dbURL, opsAddr, logLevel, logFormat, parts := commonRoleFlags(fs)
	fs.Parse(args)
	return runRoles(ctx, &roleConfig{
		log: newLogger(*logLevel, *logFormat), kafka: brokers.config(""), databaseURL: *dbURL,
		opsAddr: *opsAddr, statePartitions: int32(*parts), project: true,
	}, nil)
}

func runMigrate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ExitOnError)
	dbURL := cfgDatabaseURL.String(fs)
	logLevel, logFormat := cfgLogLevel.String(fs), cfgLogFormat.String(fs)
	fs.Parse(args)
	if *dbURL == "" {
		return errors.New("no database: set DATABASE_URL (or --database-url)")
	}
	pool, err := openDB(ctx, *dbURL, newLogger(*logLevel, *logFormat))
	if err != nil {
		return err
	}
	pool.Close()
	fmt.Println("migrations applied")
	return nil
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

// Placement engine settings.
var cfgWorkerRetention = register(setting{"placement-worker-retention", "MAILPLANE_PLACEMENT_WORKER_RETENTION", "168h", // placement.DefaultWorkerRetention
	"placement engine: a sending worker dead this long (no heartbeat) is forgotten (worker_forgotten), so placement state stays bounded; every engine of a deployment must use the same"})

// placementFlags registers the engine's decider settings on fs; the
// returned func reads them once fs is parsed.
func placementFlags(fs *flag.FlagSet) func() (placement.Config, error) {
	retention := cfgWorkerRetention.Duration(fs)
	return func() (placement.Config, error) {
		if *retention < time.Minute || *retention > domain.MaxWorkerRetentionSeconds*time.Second {
			return placement.Config{}, fmt.Errorf("--%s %s: want a minute to ten years", cfgWorkerRetention.flag, *retention)
		}
		return placement.Config{WorkerRetention: *retention}, nil
	}
}

func runEngine(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("engine", flag.ExitOnError)
	brokers, dbURL, opsAddr, logLevel, logFormat, parts := commonRoleFlags(fs)
	placementCfg := placementFlags(fs)
	fs.Parse(args)
	pc, err := placementCfg()
	if err != nil {
		return err
	}
	return runRoles(ctx, &roleConfig{
		log: newLogger(*logLevel, *logFormat), kafka: brokers.config(""), databaseURL: *dbURL,
		opsAddr: *opsAddr, statePartitions: int32(*parts), engine: true, placement: pc,
	}, nil)
}

// assignmentChangesRetained is how many of the newest decision-log offsets
// keep their per-worker assignment changes. A worker whose change token is
// older gets 410 expired and resyncs in full, which is cheap; the bound
// keeps the changes table from growing with the log.
const assignmentChangesRetained = 5_000_000

// pruneAssignmentChanges prunes old assignment changes hourly (and once at
// start) until ctx is done.
func pruneAssignmentChanges(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		cp, err := projection.ReadCheckpoint(qctx, pool)
		if err == nil && cp.NextOffset > assignmentChangesRetained {
			var n int64
			n, err = projection.PruneChanges(qctx, pool, cp.NextOffset-assignmentChangesRetained)
			if err == nil && n > 0 {
				log.Info("pruned assignment changes", "rows", n, "below_offset", cp.NextOffset-assignmentChangesRetained)
			}
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("pruning assignment changes failed; retrying in an hour", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// pruneWarmupSeen forgets, hourly, the warmup messages reported longer ago
// than the scoring window: a copy seen again after that no longer counts
// anyway.
func pruneWarmupSeen(ctx context.Context, pool *pgxpool.Pool, window time.Duration, log *slog.Logger) error {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		n, err := imapsync.PruneWarmupSeen(qctx, pool, time.Now().Add(-window-24*time.Hour))
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("pruning reported warmup messages failed; retrying in an hour", "err", err)
		} else if n > 0 {
			log.Info("pruned reported warmup messages", "rows", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
