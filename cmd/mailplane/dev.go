package main

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
	"time"

	"github.com/mailplane/mailplane/kafka"
	"github.com/mailplane/mailplane/pgcluster"
)

func runDev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ExitOnError)
	dataDir := cfgDataDir.String(fs)
	kafkaPort := cfgKafkaPort.Int(fs)
	pgPort := cfgPGPort.Int(fs)
	dbURL := cfgDatabaseURL.String(fs)
	httpAddr := cfgHTTP.String(fs)
	tokens := cfgAPITokens.String(fs)
	sealKeys := cfgSealKeys.String(fs)
	sealKeyID := cfgSealKeyID.String(fs)
	parts := cfgStatePartitions.Int(fs)
	sf := registerSyncFlags(fs)
	syncWorkers := cfgSyncWorkers.Int(fs)
	logLevel := cfgLogLevel.String(fs)
	logFormat := cfgLogFormat.String(fs)
	fs.Parse(args)
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
		stateProc:   true,
		syncWorkers: *syncWorkers,
		syncConfig:  syncCfg,
		// Dev mode has no IMAP server yet: the recording runner shows
		// ownership at work unless --sync-runner imap is given.
		syncRunner:       devRunner(fs, *sf.runner),
		imapCAFile:       *sf.caFile,
		imapDisableAfter: *sf.disableAfter,
		project:          true,
		applyTops:        true,
		log:              log,
		brokers:          brokers,
		databaseURL:      url,
		httpAddr:         *httpAddr,
		tokens:           tokenList,
		keyring:          keyring,
		statePartitions:  int32(*parts),
	}
	return runRoles(ctx, roles, func() {
		fmt.Fprintf(os.Stderr, `
mailplane dev is running
  broker     %s (embedded kfake, data in %s)
  postgres   %s
  api        http://%s  (POST /v1/events, POST /v1/workers/heartbeat, GET /healthz, GET /metrics)
  roles      placement engine, registry and placement projectors, mailbox.state processor, %d sync worker(s)
  api token  %s%s
  seal key   %s (in %s)

  publish:   curl -X POST http://%s/v1/events -H "Authorization: Bearer $(cat %s)" \
               -H 'Content-Type: application/cloudevents+json' --data @examples/events/mailbox.added.json
  read:      kcat -b %s -C -t mailplane.mailbox.events.v1 -o beginning -e -f '%%k %%h\n%%s\n'
  query:     psql '%s' -c 'select * from mailboxes'

Ctrl-C stops everything.
`, strings.Join(brokers, ","), filepath.Join(dir, "kafka"), url, *httpAddr, *syncWorkers, tokenList[0], generated,
			keyring.ActiveKeyID(), filepath.Join(dir, "seal.key"),
			*httpAddr, filepath.Join(dir, "api.token"), strings.Join(brokers, ","), url)
	})
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

// devRunner is record unless the sync runner was set explicitly.
func devRunner(fs *flag.FlagSet, v string) string {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "sync-runner" })
	if set || os.Getenv("MAILPLANE_SYNC_RUNNER") != "" {
		return v
	}
	return "record"
}
