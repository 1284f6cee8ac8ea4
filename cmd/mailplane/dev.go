package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/devfleet"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/pgcluster"
)

// Dev mode's IMAP server and simulated fleet (package devfleet).
var (
	cfgDevIMAPAddr       = register(setting{"dev-imap-addr", "MAILPLANE_DEV_IMAP_ADDR", devfleet.DefaultAddr, "dev mode: listen address of the in-process IMAP server with the sample mailboxes (plain IMAP, loopback only; port 0 picks one)"})
	cfgDevFleet          = register(setting{"dev-fleet", "MAILPLANE_DEV_FLEET", "true", "dev mode: register the sample orgs and mailboxes, heartbeat the simulated sending workers and deliver warmup mail"})
	cfgDevWarmupInterval = register(setting{"dev-warmup-interval", "MAILPLANE_DEV_WARMUP_INTERVAL", devfleet.DefaultWarmupInterval.String(), "dev mode: how often the simulated fleet delivers a round of warmup mail"})
	cfgDevSeed           = register(setting{"dev-seed", "MAILPLANE_DEV_SEED", strconv.Itoa(devfleet.DefaultSeed), "dev mode: seed of the simulated fleet's choices (recipients, Junk placements)"})
)

// boolSetting registers s as a boolean flag.
func boolSetting(fs *flag.FlagSet, s setting) *bool {
	v, err := strconv.ParseBool(s.envOr())
	if err != nil {
		fatalf("%s: %q is not a boolean", s.env, s.envOr())
	}
	return fs.Bool(s.flag, v, s.help+" (env "+s.env+")")
}

func runDev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ExitOnError)
	dataDir := cfgDataDir.String(fs)
	kafkaPort := cfgKafkaPort.Int(fs)
	pgPort := cfgPGPort.Int(fs)
	dbURL := cfgDatabaseURL.String(fs)
	af := registerAPIFlags(fs)
	opsAddr := cfgOpsHTTP.String(fs)
	tokens := cfgAPITokens.String(fs)
	sealKeys := cfgSealKeys.String(fs)
	sealKeyID := cfgSealKeyID.String(fs)
	parts := cfgStatePartitions.Int(fs)
	sf := registerSyncFlags(fs)
	syncWorkers := cfgSyncWorkers.Int(fs)
	imapAddr := cfgDevIMAPAddr.String(fs)
	fleet := boolSetting(fs, cfgDevFleet)
	warmupEvery := cfgDevWarmupInterval.Duration(fs)
	seed := cfgDevSeed.Int(fs)
	placementCfg := placementFlags(fs)
	logLevel := cfgLogLevel.String(fs)
	logFormat := cfgLogFormat.String(fs)
	fs.Parse(args)
	pc, err := placementCfg()
	if err != nil {
		return err
	}
	log := newLogger(*logLevel, *logFormat)

	dir, err := filepath.Abs(*dataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}

	// The broker first: everything else talks to it.
	emb, err := kafka.StartEmbedded(kafka.WithPort(*kafkaPort), kafka.WithDataDir(filepath.Join(dir, "kafka")), kafka.WithSyncWrites())
	if err != nil {
		return fmt.Errorf("embedded broker on 127.0.0.1:%d: %w", *kafkaPort, err)
	}
	defer func() {
		emb.Close()
		log.Info("embedded broker stopped")
	}()
	brokers := emb.Addrs()

	// Postgres: DATABASE_URL, else a private cluster under the data dir.
	url := *dbURL
	if url == "" {
		pg := pgcluster.New(filepath.Join(dir, "postgres"), pgcluster.WithPort(*pgPort), pgcluster.WithLogger(log))
		sctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		err := pg.Start(sctx)
		cancel()
		if errors.Is(err, pgcluster.ErrBinariesNotFound) {
			return fmt.Errorf("%w\n(mailplane dev runs a private PostgreSQL from the system's binaries unless DATABASE_URL is set)", err)
		}
		if err != nil {
			return fmt.Errorf("private postgres: %w", err)
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := pg.Stop(sctx); err != nil {
				log.Error("stop postgres", "err", err)
			} else {
				log.Info("postgres stopped")
			}
		}()
		url = pg.URL()
	}

	keyring, err := loadKeyring(*sealKeys, *sealKeyID, dir, true)
	if err != nil {
		return err
	}
	tokenList, generated, err := devTokens(*tokens, filepath.Join(dir, "api.token"))
	if err != nil {
		return err
	}
	// The API's callers: the configured file, else one dev mode writes at
	// every start, giving the dev tokens every scope (listed, so that even
	// dev mode has no wildcard) and every "/..." source.
	tokensFile, tokensFrom := *af.tokensFile, ""
	if tokensFile == "" {
		tokensFile = filepath.Join(dir, "api-tokens")
		if err := writeDevTokensFile(tokensFile, tokenList); err != nil {
			return err
		}
		tokensFrom = tokensFile + ": every scope, sources /..."
	}
	fleetSecret := []byte(*af.fleetSecret)
	if len(fleetSecret) == 0 {
		if fleetSecret, err = devSecret(filepath.Join(dir, "worker-fleet.key")); err != nil {
			return err
		}
	}

	// The IMAP server with the sample mailboxes, before the sync workers
	// that connect to it; stopped after them.
	imapSrv, err := devfleet.Start(ctx, devfleet.WithAddr(*imapAddr), devfleet.WithServerLogger(log.With("role", "dev-imap")))
	if err != nil {
		return fmt.Errorf("dev IMAP server on %s: %w", *imapAddr, err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := imapSrv.Stop(sctx); err != nil {
			log.Warn("stop the dev IMAP server", "err", err)
		} else {
			log.Info("dev IMAP server stopped")
		}
	}()
	// Warmup headers are signed in dev mode too: with MAILPLANE_WARMUP_KEY,
	// else a key kept in the data dir.
	warmupKey := []byte(*sf.warmupKey)
	if len(warmupKey) == 0 {
		if warmupKey, err = devSecret(filepath.Join(dir, "warmup.key")); err != nil {
			return err
		}
	}
	var sim *devfleet.Simulator
	if *fleet {
		sim, err = devfleet.New(kafka.Config{Brokers: brokers, ClientID: "mailplane-devfleet"}, keyring, imapSrv,
			devfleet.WithSeed(uint64(*seed)), devfleet.WithWarmupInterval(*warmupEvery), devfleet.WithWarmupHeader(*sf.warmupHeader),
			devfleet.WithWarmupKey(warmupKey), devfleet.WithLogger(log.With("role", "devfleet")),
			// The simulated workers heartbeat through the worker API with
			// their own credentials, as real ones do.
			devfleet.WithWorkerAPI("http://"+*af.http, fleetSecret))
		if err != nil {
			return err
		}
		defer sim.Close()
	}

	// Dev mode's own IMAP server is on loopback, in plain text: allowlist
	// exactly it (its host), on top of the operator's list.
	devHost, _, err := net.SplitHostPort(imapSrv.Addr())
	if err != nil {
		return err
	}
	transport, err := sf.transport(devHost)
	if err != nil {
		return err
	}
	syncCfg := sf.config()
	if syncCfg.WorkerID == "" {
		syncCfg.WorkerID = "dev-sync"
	}
	bc, err := billingConfig()
	if err != nil {
		return err
	}
	roles := &roleConfig{
		billing:     bc,
		api:         true,
		engine:      true,
		placement:   pc,
		stateProc:   true,
		syncWorkers: *syncWorkers,
		syncConfig:  syncCfg,
		// The IMAP runner, against the dev IMAP server (unless
		// --sync-runner record asks for the recording runner).
		syncRunner:       *sf.runner,
		imapCAFile:       *sf.caFile,
		imapDisableAfter: *sf.disableAfter,
		imapWarmupHeader: *sf.warmupHeader,
		imapWarmupKey:    warmupKey,
		imapOAuth:        sf.oauth(),
		imapTransport:    transport,
		project:          true,
		applyTops:        true,
		log:              log,
		kafka:            kafka.Config{Brokers: brokers},
		databaseURL:      url,
		opsAddr:          *opsAddr,
		keyring:          keyring,
		statePartitions:  int32(*parts),
	}
	af.apply(roles)
	roles.tokensFile, roles.fleetSecret = tokensFile, fleetSecret
	// The simulated fleet starts once the roles run (the topics exist)
	// and stops with them; if it fails, dev mode stops.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var fleetWG sync.WaitGroup
	var fleetErr error
	err = runRoles(ctx, roles, func() {
		fmt.Fprint(os.Stderr, devBanner(roles, dir, brokers, url, tokenList[0], generated, tokensFrom, imapSrv.Addr(), sim != nil, *warmupEvery, *seed))
		if sim == nil {
			return
		}
		fleetWG.Add(1)
		go func() {
			defer fleetWG.Done()
			if err := sim.Run(ctx); err != nil {
				fleetErr = err
				log.Error("simulated fleet failed", "err", err)
				cancel()
			}
		}()
	})
	cancel()
	fleetWG.Wait()
	if err == nil && fleetErr != nil {
		err = fmt.Errorf("dev fleet: %w", fleetErr)
	}
	return err
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
	if ts := splitList(configured); len(ts) > 0 {
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

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

var _ = slog.Default

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
