package roles

import (
	"context"

	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/billing"
	"github.com/mailplane/mailplane/internal/console"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/health"
	"github.com/mailplane/mailplane/internal/imapsync"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/opsaudit"
	"github.com/mailplane/mailplane/internal/opshttp"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/internal/ownership"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/internal/query"
	"github.com/mailplane/mailplane/internal/workerapi"
	"github.com/mailplane/mailplane/producer"
)

// assignmentChangesRetained is how many of the newest decision-log offsets
// keep their per-worker assignment changes. A worker whose change token is
// older gets 410 expired and resyncs in full, which is cheap; the bound
// keeps the changes table from growing with the log.
const assignmentChangesRetained = 5_000_000

// startProjectors starts the projectors (registry, placement, health
// scorer), the health ticker and the pruning of what they keep.
func (p *process) startProjectors() error {
	if !p.rc.project {
		return nil
	}
	log := p.log.With("role", "projector")
	pr, err := projections.New(p.kcfg("projector-registry"), p.pools.Work, projections.NewRegistry(),
		projections.WithLogger(log), projections.WithRegisterer(p.reg), projections.WithGroup(p.rc.projectorGroup.group()))
	if err != nil {
		return err
	}
	p.onShutdown(pr.Close)
	p.start("projector registry", pr.Run)

	// The placement projection reads the decision log with offsets,
	// so it has its own runner (see postgres.Projection).
	pp, err := postgres.NewProjector(p.kcfg("projector-placement"), p.pools.Work,
		postgres.WithLogger(log), postgres.WithRegisterer(p.reg))
	if err != nil {
		return err
	}
	p.start("projector placement", pp.Run)
	p.start("assignment change pruning", pruneHourly("assignment changes", log, p.pruneAssignmentChanges))
	return p.startHealthScorer()
}

// pruneAssignmentChanges drops the assignment changes of decision-log
// offsets older than the newest assignmentChangesRetained.
func (p *process) pruneAssignmentChanges(ctx context.Context) (int64, []any, error) {
	cp, err := postgres.ReadCheckpoint(ctx, p.pools.Work)
	if err != nil || cp.NextOffset <= assignmentChangesRetained {
		return 0, nil, err
	}
	below := cp.NextOffset - assignmentChangesRetained
	n, err := postgres.PruneChanges(ctx, p.pools.Work, below)
	return n, []any{"below_offset", below}, err
}

// startHealthScorer starts the health scorer (a projection of the warmup
// observations that decides health states), its ticker for ended
// penalties and the pruning of reported warmup messages.
func (p *process) startHealthScorer() error {
	log := p.log.With("role", "health")
	hm := health.NewMetrics(p.reg)
	policy := domain.DefaultHealthPolicy()
	scorer, err := health.NewScorer(policy, health.WithEmitted(func(ev domain.Event) { hm.Committed([]domain.Event{ev}) }))
	if err != nil {
		return err
	}
	hp, err := projections.New(p.kcfg("projector-health"), p.pools.Work, scorer,
		projections.WithLogger(log), projections.WithRegisterer(p.reg), projections.WithCommitted(hm.Committed),
		projections.WithGroup(p.rc.projectorGroup.group()))
	if err != nil {
		return err
	}
	p.onShutdown(hp.Close)
	p.start("projector health", hp.Run)
	p.start("health ticker", health.NewTicker(p.pools.Work, policy, health.WithMetrics(hm), health.WithLogger(log)).Run)
	// A warmup message reported longer ago than the scoring window no
	// longer counts when seen again.
	p.start("warmup seen pruning", pruneHourly("reported warmup messages", log, func(ctx context.Context) (int64, []any, error) {
		n, err := imapsync.PruneWarmupSeen(ctx, p.pools.Work, time.Now().Add(-policy.Window-24*time.Hour))
		return n, nil, err
	}))
	return nil
}

// startRelay starts the outbox relay of a process that writes to the
// outbox (projectors, sync workers); one per database publishes, the
// others stand by. It stops after every other role, so what they queued
// while stopping (a sync worker's ownership_lost) is still published.
func (p *process) startRelay() error {
	if !p.rc.project && p.rc.syncWorkers == 0 {
		return nil
	}
	rctx, rcancel := context.WithCancel(context.WithoutCancel(p.ctx))
	relayDone := make(chan struct{})
	go func() {
		defer close(relayDone)
		_ = outbox.NewRelay(p.pools.Work, p.kcfg("outbox"), outbox.WithLogger(p.log.With("role", "outbox")), outbox.WithRegisterer(p.reg)).Run(rctx)
	}()
	p.onShutdown(func() {
		rcancel()
		// Bounded: a stop must fit compose's 10 s grace. A relay stuck in
		// its Kafka client (seen once right after a broker restart) leaves
		// its transaction uncommitted, which the next relay fences, and
		// its rows in the outbox, which the next relay publishes.
		select {
		case <-relayDone:
		case <-time.After(relayStopWait):
			// With where it hangs: the cause of the hang seen once is
			// not known (TestRelayStopsAfterABrokerRestart does not
			// reproduce it).
			p.log.Warn("outbox relay did not stop in time; leaving it", "waited", relayStopWait,
				"goroutines", goroutineStacks("mailplane/internal/outbox."))
		}
	})
	return nil
}

// relayStopWait bounds how long a stopping process waits for its relay.
const relayStopWait = 4 * time.Second

func (p *process) startEngine() error {
	if !p.rc.engine {
		return nil
	}
	eng, err := engine.New(p.kcfg("placement-engine"),
		engine.WithLogger(p.log.With("role", "engine")),
		engine.WithRegisterer(p.reg),
		engine.WithPlacementConfig(p.rc.placement),
		engine.WithSessionTimeout(p.rc.engineGroup.orDefault().session),
		engine.WithHeartbeatInterval(p.rc.engineGroup.orDefault().heartbeat),
		// Restore from the placement projection and read only the
		// decision log's tail.
		engine.WithSnapshotter(postgres.NewSnapshotter(p.pools.Work)))
	if err != nil {
		return err
	}
	p.start("placement engine", eng.Run)
	return nil
}

func (p *process) startStateProcessor() error {
	if !p.rc.stateProc {
		return nil
	}
	proc, err := mailboxstate.New(p.kcfg("mailbox-state"),
		mailboxstate.WithLogger(p.log.With("role", "mailbox-state")), mailboxstate.WithRegisterer(p.reg),
		mailboxstate.WithGroup(p.rc.stateGroup.group()))
	if err != nil {
		return err
	}
	p.start("mailbox.state processor", proc.Run)
	return nil
}

// startSyncWorkers starts the process's sync workers; they share one
// runner and one sync.audit producer.
func (p *process) startSyncWorkers() error {
	if p.rc.syncWorkers == 0 {
		return nil
	}
	audit, err := kafka.NewProducer(p.kcfg("sync-audit"))
	if err != nil {
		return err
	}
	p.onShutdown(audit.Close)
	runner, err := newRunner(p.rc, audit, p.log.With("role", "sync"))
	if err != nil {
		return err
	}
	for i := range p.rc.syncWorkers {
		cfg := p.rc.syncConfig
		cfg.WorkerID = syncWorkerID(cfg.WorkerID, i, p.rc.syncWorkers)
		cfg.Logger, cfg.Registerer = p.log.With("role", "sync", "worker", i+1), p.reg
		cfg.NoOutboxRelay = true // the process's relay publishes
		w, err := mailsync.New(p.kcfg(fmt.Sprintf("sync-%d", i+1)), p.pools.Runners, runner, cfg)
		if err != nil {
			return err
		}
		p.start(fmt.Sprintf("sync worker %d", i+1), w.Run)
	}
	return nil
}

// startOps starts the ops listener, before the roles and before the
// database answers, with the one health shape both it (detailed) and the
// API (public) answer /healthz from. Its broker client is the API's
// producer in the api role.
func (p *process) startOps() error {
	var err error
	if p.rc.api {
		p.broker, err = kafka.NewProducer(p.kcfg("api"))
	} else {
		p.broker, err = kafka.NewClient(p.kcfg("health"), kafka.KindAdmin)
	}
	if err != nil {
		return err
	}
	p.onShutdown(p.broker.Close)
	p.health = opshttp.NewHealth(0, map[string]opshttp.Check{"broker": p.broker.Ping, "database": p.dbWait.Err})
	if p.rc.opsAddr != "" {
		ops := opshttp.Handler(p.health, p.reg, p.reg, p.log)
		p.start("ops http", func(ctx context.Context) error { return opshttp.Serve(ctx, p.rc.opsAddr, ops, p.log) })
	}
	return nil
}

// startAPI starts the ingest API (api role) with the worker API and,
// when configured, the billing webhook; they read Postgres through the
// serve pool, never behind background work.
func (p *process) startAPI() error {
	if !p.rc.api {
		return nil
	}
	srv, err := p.buildAPI()
	if err != nil {
		return err
	}
	p.start("api", srv.Run)
	p.start("ownership backfill", p.backfillOwnership(ownership.NewStore(p.pools.Serve), p.log.With("role", "api")))
	return nil
}

// buildAPI builds the api role's server with every route it mounts.
func (p *process) buildAPI() (*api.Server, error) {
	rc, log, kc, hc := p.rc, p.log.With("role", "api"), p.broker, p.health
	audit := p.opsAudit(log)
	auth, err := access.New(rc.tokensFile, access.WithFleetSecret(rc.fleetSecret),
		access.WithLogger(log), access.WithRegisterer(p.reg), access.WithReloadHook(audit.tokensReloaded))
	if err != nil {
		return nil, err
	}
	if len(rc.fleetSecret) == 0 {
		p.log.Warn("no worker fleet secret (MAILPLANE_WORKER_FLEET_SECRET): sending workers cannot authenticate")
	}
	if rc.tokensFile != "" {
		// Returns only when ctx is done (a role returning stops them all).
		p.start("tokens file watch", func(ctx context.Context) error { auth.Watch(ctx, 0); return nil })
	}
	pgStore := postgres.NewStore(p.pools.Serve)
	limiter := workerapi.NewWorkerLimiter(pgStore, rc.newWorkerRate, rc.newWorkerBurst, p.reg)
	pc := producer.New(kc, producer.WithSealer(rc.keyring), producer.WithSource("mailplane/api"), producer.WithRegisterer(p.reg),
		producer.WithNamespace(rc.kafka.Namespace))
	// Who owns each mailbox and org: claimed before producing, released
	// once a removal is on the log (internal/ownership).
	owners := ownership.NewGuard(ownership.NewStore(p.pools.Serve), ownership.WithLogger(log), ownership.WithRegisterer(p.reg))
	srv, err := api.New(api.OwnershipProducer(pc, owners), append(rc.bodies.apiOptions(),
		api.WithAddr(rc.httpAddr),
		api.WithAuthenticator(auth),
		// Ownership last: it records claims, which a refusal by the
		// limiter must not leave behind.
		api.WithAdmission(api.Admissions(limiter.Admit, api.OwnershipAdmission(owners))),
		api.WithMaxInflightBytes(rc.inflightBytes),
		api.WithSealer(rc.keyring),
		api.WithTransportPolicy(rc.imapTransport),
		// No api.WithSchemaValidator: the domain's Go validation is the
		// authority at ingest and the schemas are held to agree with it by
		// tests, so it would re-check the same rules at a third of the CPU
		// of a mailbox.added (docs/architecture.md §4, api).
		// The schemas, for any authenticated caller (analysts, producers).
		api.WithRoute("GET /v1/schemas", api.SchemaListHandler(), true),
		api.WithRoute("GET /v1/schemas/{type}", api.SchemaHandler(), true),
		api.WithHealth(hc),
		api.WithRegisterer(p.reg),
		api.WithGatherer(p.reg),
		api.WithLogger(log),
	)...)
	if err != nil {
		return nil, err
	}
	if err := workerapi.Register(srv, workerapi.WithLogger(log), workerapi.WithAssignmentStore(pgStore)); err != nil {
		return nil, err
	}
	if err := p.mountQuery(srv, auth, audit.rec, log); err != nil {
		return nil, err
	}
	if rc.billing != nil {
		if err := billing.Register(srv, *rc.billing, billing.WithLogger(p.log.With("role", "billing")),
			billing.WithDatabase(p.pools.Serve), billing.WithRegisterer(p.reg)); err != nil {
			return nil, err
		}
	}
	return srv, nil
}

// mountQuery mounts the query API and the ops console; both read
// through one query.Reader on the serve pool. The console's consumers page
// and DLQ read the broker through the API's client and config.
func (p *process) mountQuery(srv *api.Server, auth api.Authenticator, audit console.Auditor, log *slog.Logger) error {
	reader := query.NewReader(p.pools.Serve, int(p.rc.statePartitions),
		query.WithSyncTiers(p.kcfg("query")), query.WithLogger(log.With("component", "query")))
	if err := query.Register(srv, reader, log); err != nil {
		return err
	}
	kcfg := p.kcfg("console")
	redriveMetrics := dlq.NewRedriveMetrics(p.reg)
	return console.Register(srv, console.Config{
		Auth:      auth,
		Facts:     reader,
		Consumers: query.NewConsumerReader(p.pools.Serve, kadm.NewClient(p.broker), p.reg),
		DLQ: func(ctx context.Context, limit int) ([]dlq.Entry, error) {
			return dlq.List(ctx, kcfg, limit)
		},
		Redrive: func(ctx context.Context, caller *domain.Caller, sel dlq.Selection) (dlq.Report, error) {
			return dlq.Redrive(ctx, kcfg, p.pools.Work, caller, sel, dlq.WithRedriveMetrics(redriveMetrics), dlq.WithRedriveLogger(log.With("component", "console")))
		},
		Redriven: func(ctx context.Context, entries []dlq.Entry) (map[dlq.Location]dlq.Redriven, error) {
			return dlq.Redrives(ctx, p.pools.Serve, entries)
		},
		Audit: audit,
		AuditLog: func(ctx context.Context, limit int) ([]opsaudit.Record, error) {
			return opsaudit.Recent(ctx, kcfg, limit)
		},
		LoginsPerMinute: p.rc.bodies.loginsPerMinute,
		LoginBurst:      p.rc.bodies.loginBurst,
		TrustedProxies:  p.rc.bodies.trustedProxies,
		Logger:          log.With("component", "console"),
		Registerer:      p.reg,
	})
}

// pruneHourly returns a role that runs prune once at start and then
// hourly until ctx is done, each run bounded to five minutes; a failure
// is logged and retried an hour later. prune returns the rows it dropped
// and what to log with them.
func pruneHourly(what string, log *slog.Logger, prune func(context.Context) (int64, []any, error)) func(context.Context) error {
	return func(ctx context.Context) error {
		t := time.NewTicker(time.Hour)
		defer t.Stop()
		for {
			qctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			n, attrs, err := prune(qctx)
			cancel()
			switch {
			case err != nil && ctx.Err() == nil:
				log.Warn("pruning "+what+" failed; retrying in an hour", "err", err)
			case err == nil && n > 0:
				log.Info("pruned "+what, append([]any{"rows", n}, attrs...)...)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}
}
