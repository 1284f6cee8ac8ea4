package roles

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/devfleet"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/pgcluster"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/sealing"
)

// devFlags are dev mode's settings.
type devFlags struct {
	dataDir, dbURL, opsAddr, tokens, sealKeys, sealKeyID *string
	imapAddr, logLevel, logFormat                        *string
	kafkaPort, pgPort, parts, syncWorkers, seed          *int
	fleet                                                *bool
	warmupEvery                                          *time.Duration
	api                                                  apiFlags
	sync                                                 *syncFlags
	placement                                            func() (placement.Config, error)
	groups                                               allGroupFlags
}

func registerDevFlags(fs *flag.FlagSet) *devFlags {
	return &devFlags{
		dataDir: config.DataDir.String(fs), kafkaPort: config.KafkaPort.Int(fs), pgPort: config.PGPort.Int(fs),
		dbURL: config.DatabaseURL.String(fs), api: registerAPIFlags(fs), opsAddr: config.OpsHTTP.String(fs),
		tokens: config.APITokens.String(fs), sealKeys: config.SealKeys.String(fs), sealKeyID: config.SealKeyID.String(fs),
		parts: config.StatePartitions.Int(fs), sync: registerSyncFlags(fs), syncWorkers: config.SyncWorkers.Int(fs),
		imapAddr: config.DevIMAPAddr.String(fs), fleet: config.DevFleet.Bool(fs), warmupEvery: config.DevWarmupInterval.Duration(fs),
		seed: config.DevSeed.Int(fs), placement: placementFlags(fs), groups: registerAllGroupFlags(fs),
		logLevel: config.LogLevel.String(fs), logFormat: config.LogFormat.String(fs),
	}
}

// devEnv is what dev mode runs beside the roles: the embedded broker, the
// private Postgres, the IMAP server with the sample mailboxes and the
// simulated fleet, with the secrets kept in the data dir. close stops
// them in the reverse order of starting.
type devEnv struct {
	f       *devFlags
	log     *slog.Logger
	dir     string
	brokers []string
	url     string
	keyring *sealing.Keyring

	tokens                 []string
	tokenFrom, tokensFrom  string
	tokensFile             string
	fleetSecret, warmupKey []byte
	imap                   *devfleet.Server
	sim                    *devfleet.Simulator
	closers                []func()
}

func (e *devEnv) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// Dev is `mailplane dev`: everything embedded (broker, Postgres, API,
// engine, projectors, sync, a simulated fleet); what `make run` runs.
func Dev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ExitOnError)
	f := registerDevFlags(fs)
	fs.Parse(args)
	pc, err := f.placement()
	if err != nil {
		return err
	}
	setGroups, err := f.groups.timings()
	if err != nil {
		return err
	}
	e := &devEnv{f: f, log: config.NewLogger(*f.logLevel, *f.logFormat)}
	defer e.close()
	for _, step := range []func(context.Context) error{e.startBroker, e.startPostgres, e.loadSecrets, e.startIMAP, e.newFleet} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	rc, err := e.roleConfig(pc)
	if err != nil {
		return err
	}
	setGroups(rc)
	return e.run(ctx, rc)
}

// startBroker starts the embedded broker first: everything else talks to
// it.
func (e *devEnv) startBroker(context.Context) error {
	dir, err := filepath.Abs(*e.f.dataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	e.dir = dir
	emb, err := kafka.StartEmbedded(kafka.WithPort(*e.f.kafkaPort), kafka.WithDataDir(filepath.Join(dir, "kafka")), kafka.WithSyncWrites())
	if err != nil {
		return fmt.Errorf("embedded broker on 127.0.0.1:%d: %w", *e.f.kafkaPort, err)
	}
	e.closers = append(e.closers, func() {
		emb.Close()
		e.log.Info("embedded broker stopped")
	})
	e.brokers = emb.Addrs()
	return nil
}

// startPostgres uses MAILPLANE_DATABASE_URL, else starts a private
// cluster under the data dir.
func (e *devEnv) startPostgres(ctx context.Context) error {
	if e.url = *e.f.dbURL; e.url != "" {
		return nil
	}
	pg := pgcluster.New(filepath.Join(e.dir, "postgres"), pgcluster.WithPort(*e.f.pgPort), pgcluster.WithLogger(e.log))
	sctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	err := pg.Start(sctx)
	cancel()
	if errors.Is(err, pgcluster.ErrBinariesNotFound) {
		return fmt.Errorf("%w\n(mailplane dev runs a private PostgreSQL from the system's binaries unless MAILPLANE_DATABASE_URL is set)", err)
	}
	if err != nil {
		return fmt.Errorf("private postgres: %w", err)
	}
	e.closers = append(e.closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := pg.Stop(sctx); err != nil {
			e.log.Error("stop postgres", "err", err)
		} else {
			e.log.Info("postgres stopped")
		}
	})
	e.url = pg.URL()
	return nil
}

// loadSecrets reads the configured secrets, else keeps each in the data
// dir (generated on first start): the sealing key, the API tokens and
// their callers file, the worker fleet secret and the warmup key.
func (e *devEnv) loadSecrets(context.Context) error {
	var err error
	if e.keyring, err = sealing.Load(*e.f.sealKeys, *e.f.sealKeyID, e.dir, true); err != nil {
		return err
	}
	if e.tokens, e.tokenFrom, err = devTokens(*e.f.tokens, filepath.Join(e.dir, "api.token")); err != nil {
		return err
	}
	// The API's callers: the configured file, else one dev mode writes at
	// every start, giving the dev tokens every scope (listed, so that even
	// dev mode has no wildcard) and every "/..." source.
	if e.tokensFile = *e.f.api.tokensFile; e.tokensFile == "" {
		e.tokensFile = filepath.Join(e.dir, "api-tokens")
		if err := writeDevTokensFile(e.tokensFile, e.tokens); err != nil {
			return err
		}
		e.tokensFrom = e.tokensFile + ": every scope, sources /..."
	}
	if e.fleetSecret, err = orDevSecret(*e.f.api.fleetSecret, filepath.Join(e.dir, "worker-fleet.key")); err != nil {
		return err
	}
	// Warmup headers are signed in dev mode too: with MAILPLANE_WARMUP_KEY,
	// else a key kept in the data dir.
	e.warmupKey, err = orDevSecret(*e.f.sync.warmupKey, filepath.Join(e.dir, "warmup.key"))
	return err
}

// startIMAP starts the IMAP server with the sample mailboxes, before the
// sync workers that connect to it; it stops after them.
func (e *devEnv) startIMAP(ctx context.Context) error {
	srv, err := devfleet.Start(ctx, devfleet.WithAddr(*e.f.imapAddr), devfleet.WithServerLogger(e.log.With("role", "dev-imap")))
	if err != nil {
		return fmt.Errorf("dev IMAP server on %s: %w", *e.f.imapAddr, err)
	}
	e.closers = append(e.closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Stop(sctx); err != nil {
			e.log.Warn("stop the dev IMAP server", "err", err)
		} else {
			e.log.Info("dev IMAP server stopped")
		}
	})
	e.imap = srv
	return nil
}

// newFleet builds the simulated fleet (unless --dev-fleet=false); it runs
// once the roles do.
func (e *devEnv) newFleet(context.Context) error {
	if !*e.f.fleet {
		return nil
	}
	sf := e.f.sync
	sim, err := devfleet.New(kafka.Config{Brokers: e.brokers, ClientID: "mailplane-devfleet"}, e.keyring, e.imap,
		devfleet.WithSeed(uint64(*e.f.seed)), devfleet.WithWarmupInterval(*e.f.warmupEvery), devfleet.WithWarmupHeader(*sf.warmupHeader),
		devfleet.WithWarmupKey(e.warmupKey), devfleet.WithLogger(e.log.With("role", "devfleet")),
		// The simulated workers heartbeat through the worker API with
		// their own credentials, as real ones do.
		devfleet.WithWorkerAPI("http://"+*e.f.api.http, e.fleetSecret))
	if err != nil {
		return err
	}
	e.closers = append(e.closers, sim.Close)
	e.sim = sim
	return nil
}

// roleConfig is every role, against the embedded broker and database.
func (e *devEnv) roleConfig(pc placement.Config) (*roleConfig, error) {
	// Dev mode's own IMAP server is on loopback, in plain text: allowlist
	// exactly it (its address and port: not the Postgres, broker and ops
	// ports on the same loopback address), on top of the operator's list.
	transport, err := e.f.sync.transport(e.imap.Addr())
	if err != nil {
		return nil, err
	}
	syncCfg, err := e.f.sync.config()
	if err != nil {
		return nil, err
	}
	if syncCfg.WorkerID == "" {
		syncCfg.WorkerID = "dev-sync"
	}
	bc, err := billingConfig()
	if err != nil {
		return nil, err
	}
	rc := &roleConfig{
		billing: bc, api: true, engine: true, placement: pc, stateProc: true, project: true, applyTops: true,
		syncWorkers: *e.f.syncWorkers, syncConfig: syncCfg,
		log: e.log, kafka: kafka.Config{Brokers: e.brokers}, databaseURL: e.url, opsAddr: *e.f.opsAddr,
		keyring: e.keyring, statePartitions: int32(*e.f.parts),
	}
	// The IMAP runner, against the dev IMAP server (unless --sync-runner
	// record asks for the recording runner).
	e.f.sync.applyIMAP(rc, e.warmupKey, transport)
	if err := e.f.api.apply(rc); err != nil {
		return nil, err
	}
	rc.tokensFile, rc.fleetSecret = e.tokensFile, e.fleetSecret
	return rc, nil
}

// run runs the roles; the simulated fleet starts once they run (the
// topics exist) and stops with them; if it fails, dev mode stops.
func (e *devEnv) run(ctx context.Context, rc *roleConfig) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var fleetWG sync.WaitGroup
	var fleetErr error
	err := runRoles(ctx, rc, func() {
		fmt.Fprint(os.Stderr, e.banner(rc))
		if e.sim == nil {
			return
		}
		fleetWG.Go(func() {
			if err := e.sim.Run(ctx); err != nil {
				fleetErr = err
				e.log.Error("simulated fleet failed", "err", err)
				cancel()
			}
		})
	})
	cancel()
	fleetWG.Wait()
	if err == nil && fleetErr != nil {
		err = fmt.Errorf("dev fleet: %w", fleetErr)
	}
	return err
}

// banner is what dev mode prints once everything runs.
func (e *devEnv) banner(rc *roleConfig) string {
	return devBanner(rc, e.dir, e.brokers, e.url, e.tokens[0], e.tokenFrom, e.tokensFrom, e.imap.Addr(), e.sim != nil, *e.f.warmupEvery, *e.f.seed)
}

// devBanner is what dev mode prints once everything runs.
func devBanner(rc *roleConfig, dir string, brokers []string, url, token, tokenFrom, callersFrom, imapAddr string, fleet bool, warmupEvery time.Duration, seed int) string {
	var b strings.Builder
	broker := strings.Join(brokers, ",")
	fmt.Fprintf(&b, `
mailplane dev is running
  broker     %s (embedded kfake, data in %s)
  postgres   %s
  api        http://%s  (POST /v1/events, POST /v1/workers/heartbeat, GET /v1/workers/{id}/assignments, GET /healthz)
  ops        http://%s  (GET /metrics, GET /healthz with details)
  roles      placement engine, registry, placement and health projectors (health scorer), outbox relay, mailbox.state processor, %d sync worker(s) (%s runner)
  imap       %s  (in-process sample server, tls none: plain IMAP on loopback only; mail kept in memory)
  login      ada@example.com / %s  (also spammy@, grace@, alan@, edsger@, barbara@example.com, same password)
`, broker, filepath.Join(dir, "kafka"), url, rc.httpAddr, rc.opsAddr, rc.syncWorkers, rc.syncRunner, imapAddr, devfleet.DevPassword)
	if fleet {
		fmt.Fprintf(&b, "  fleet      %d orgs and %d mailboxes registered; %d simulated sending workers heartbeating;\n"+
			"             warmup mail every %s (seed %d), spammy@example.com's mostly to Junk\n",
			len(devfleet.Orgs()), len(devfleet.Mailboxes()), len(devfleet.Workers()), warmupEvery, seed)
	} else {
		b.WriteString("  fleet      off (--dev-fleet=false): nothing registered, no heartbeats, no warmup mail\n")
	}
	if callersFrom != "" {
		fmt.Fprintf(&b, "  callers    %s (the api token below is an all-scopes dev caller)\n", callersFrom)
	} else {
		fmt.Fprintf(&b, "  callers    from %s\n", rc.tokensFile)
	}
	fmt.Fprintf(&b, "  workers    credentials derive from the fleet secret: mailplane token worker --worker-id ID --data-dir %s\n", dir)
	fmt.Fprintf(&b, `  api token  %s%s
  seal key   %s (in %s)

  publish:   curl -X POST http://%s/v1/events -H "Authorization: Bearer $(cat %s)" \
               -H 'Content-Type: application/cloudevents+json' --data @examples/events/mailbox.added.json
  read:      kcat -b %s -C -t mailplane.mailbox.events.v1 -o beginning -e -f '%%k %%h\n%%s\n'
  placement: kcat -b %s -C -t mailplane.placement.decisions.v1 -o beginning -f '%%h\n%%s\n\n'
  query:     psql '%s' -c 'select * from mailboxes'
  synced:    psql '%s' -c 'select mailbox_id, folder, uid, from_addr, subject from imap_messages order by synced_at desc limit 20'

Ctrl-C stops everything.
`, token, tokenFrom, rc.keyring.ActiveKeyID(), filepath.Join(dir, "seal.key"),
		rc.httpAddr, filepath.Join(dir, "api.token"), broker, broker, url, url)
	return b.String()
}

// devTokens returns the API tokens: configured ones, else the token kept in
// path (generated on first start).
func devTokens(configured, path string) ([]string, string, error) {
	if ts := config.SplitList(configured); len(ts) > 0 {
		return ts, " (from MAILPLANE_API_TOKEN)", nil
	}
	if b, err := os.ReadFile(path); err == nil {
		if t := strings.TrimSpace(string(b)); t != "" {
			return []string{t}, " (kept in " + path + ")", nil
		}
	}
	buf := make([]byte, 24)
	if _, err := rand.Read(buf); err != nil {
		return nil, "", err
	}
	t := "mp_dev_" + hex.EncodeToString(buf)
	if err := os.WriteFile(path, []byte(t+"\n"), 0o600); err != nil {
		return nil, "", err
	}
	return []string{t}, " (generated, kept in " + path + ")", nil
}

// writeDevTokensFile writes dev mode's callers: each dev token with every
// scope, speaking as any "/..." source (the examples' sources).
func writeDevTokensFile(path string, tokens []string) error {
	var b strings.Builder
	b.WriteString("# written by mailplane dev at every start: the dev tokens hold every scope\n")
	for i, t := range tokens {
		name := "dev"
		if i > 0 {
			name = fmt.Sprintf("dev-%d", i+1)
		}
		b.WriteString(access.Line(name, t, domain.AllScopes(), "/") + "\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// orDevSecret returns the configured secret, else devSecret(path).
func orDevSecret(configured, path string) ([]byte, error) {
	if configured != "" {
		return []byte(configured), nil
	}
	return devSecret(path)
}

// devSecret returns the secret kept in path (the warmup signing key, the
// worker fleet secret), generated on first start.
func devSecret(path string) ([]byte, error) {
	if b, err := os.ReadFile(path); err == nil {
		if k := strings.TrimSpace(string(b)); k != "" {
			return []byte(k), nil
		}
	}
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return nil, err
	}
	k := hex.EncodeToString(buf)
	if err := os.WriteFile(path, []byte(k+"\n"), 0o600); err != nil {
		return nil, err
	}
	return []byte(k), nil
}
