package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// setting is one configuration knob: a flag with an environment fallback.
// Every setting is listed by `mailplane help config`, which is where the
// README's configuration reference comes from.
type setting struct {
	flag, env, def, help string
}

var settings = map[string]setting{}

func register(s setting) setting {
	settings[s.flag] = s
	return s
}

// envOr returns the environment value of s, else its default.
func (s setting) envOr() string {
	if v, ok := os.LookupEnv(s.env); ok && v != "" {
		return v
	}
	return s.def
}

func (s setting) String(fs *flag.FlagSet) *string {
	return fs.String(s.flag, s.envOr(), s.help+" (env "+s.env+")")
}

func (s setting) Int(fs *flag.FlagSet) *int {
	v, err := strconv.Atoi(s.envOr())
	if err != nil {
		fatalf("%s: %q is not an integer", s.env, s.envOr())
	}
	return fs.Int(s.flag, v, s.help+" (env "+s.env+")")
}

func (s setting) Float(fs *flag.FlagSet) *float64 {
	v, err := strconv.ParseFloat(s.envOr(), 64)
	if err != nil {
		fatalf("%s: %q is not a number", s.env, s.envOr())
	}
	return fs.Float64(s.flag, v, s.help+" (env "+s.env+")")
}

func (s setting) Bool(fs *flag.FlagSet) *bool {
	v, err := strconv.ParseBool(s.envOr())
	if err != nil {
		fatalf("%s: %q is not a boolean", s.env, s.envOr())
	}
	return fs.Bool(s.flag, v, s.help+" (env "+s.env+")")
}

func (s setting) Duration(fs *flag.FlagSet) *time.Duration {
	v, err := time.ParseDuration(s.envOr())
	if err != nil {
		fatalf("%s: %q is not a duration", s.env, s.envOr())
	}
	return fs.Duration(s.flag, v, s.help+" (env "+s.env+")")
}

// Settings shared by the roles.
var (
	cfgBrokers           = register(setting{"brokers", "MAILPLANE_BROKERS", "127.0.0.1:19092", "comma-separated Kafka bootstrap brokers"})
	cfgDatabaseURL       = register(setting{"database-url", "DATABASE_URL", "", "Postgres URL; dev mode starts a private cluster when empty"})
	cfgHTTP              = register(setting{"http", "MAILPLANE_HTTP", "127.0.0.1:8080", "public HTTP listen address of the API (ingest, worker API, public health)"})
	cfgOpsHTTP           = register(setting{"ops-http", "MAILPLANE_OPS_HTTP", "127.0.0.1:9090", "ops HTTP listen address of every role: /metrics and the detailed /healthz (keep it private); empty: none"})
	cfgAPITokens         = register(setting{"api-token", "MAILPLANE_API_TOKEN", "", "bearer token the CLI sends to the API (publish --api); dev mode generates one when empty and grants it every scope"})
	cfgAPITokensFile     = register(setting{"api-tokens-file", "MAILPLANE_API_TOKENS_FILE", "", "the API's callers, one a line: name, sha256 of the token, scopes, source (mailplane token makes lines); reread on SIGHUP and when it changes; required by the api role"})
	cfgWorkerFleetSecret = register(setting{"worker-fleet-secret", "MAILPLANE_WORKER_FLEET_SECRET", "", "secret (32 bytes or more) the sending workers' credentials derive from (mailplane token worker prints one); prefer the environment; dev mode keeps one in its data dir"})
	cfgHTTPInflightBytes = register(setting{"http-inflight-bytes", "MAILPLANE_HTTP_INFLIGHT_BYTES", "67108864", "cap on the bytes of request bodies the API reads at once; beyond it 503 with Retry-After"})
	cfgWorkerNewRate     = register(setting{"worker-new-rate", "MAILPLANE_WORKER_NEW_RATE", "2", "worker ids unknown to placement admitted per second (heartbeats of more get 429)"})
	cfgWorkerNewBurst    = register(setting{"worker-new-burst", "MAILPLANE_WORKER_NEW_BURST", "20", "burst of new worker ids admitted at once"})
	cfgSealKeys          = register(setting{"seal-keys", "MAILPLANE_SEAL_KEYS", "", "credential sealing keys, id:base64(32 bytes)[,...]; first is active; dev mode keeps one in its data dir"})
	cfgSealKeyID         = register(setting{"seal-key-id", "MAILPLANE_SEAL_KEY_ID", "", "id of the sealing key that seals new credentials (default: the first)"})
	cfgDataDir           = register(setting{"data-dir", "MAILPLANE_DATA_DIR", "./var", "dev mode: where the embedded broker, Postgres and the sealing key persist"})
	cfgKafkaPort         = register(setting{"kafka-port", "MAILPLANE_KAFKA_PORT", "19092", "dev mode: port of the embedded Kafka broker on 127.0.0.1"})
	cfgPGPort            = register(setting{"pg-port", "MAILPLANE_PG_PORT", "54329", "dev mode: port of the private Postgres cluster on 127.0.0.1"})
	cfgStatePartitions   = register(setting{"state-partitions", "MAILPLANE_STATE_PARTITIONS", "256", "partitions of mailbox.state and sync.tier (bounds the sync fleet size)"})
	cfgLogLevel          = register(setting{"log-level", "MAILPLANE_LOG_LEVEL", "info", "debug, info, warn or error"})
	cfgLogFormat         = register(setting{"log-format", "MAILPLANE_LOG_FORMAT", "text", "text or json"})
	cfgSource            = register(setting{"source", "MAILPLANE_SOURCE", "/cli", "ce_source of events published by the CLI (through --api: the caller's source or a path below it)"})
	cfgAPIURL            = register(setting{"api", "MAILPLANE_API_URL", "", "publish through this API (e.g. http://127.0.0.1:8080) instead of straight to the brokers"})
)

func newLogger(level, format string) *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		fatalf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// printConfig writes the configuration reference as a Markdown table.
func printConfig(w io.Writer) {
	names := make([]string, 0, len(settings))
	for n := range settings {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "| flag | environment | default | meaning |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, n := range names {
		s := settings[n]
		def := s.def
		if def == "" {
			def = "—"
		} else {
			def = "`" + def + "`"
		}
		fmt.Fprintf(w, "| `--%s` | `%s` | %s | %s |\n", s.flag, s.env, def, strings.ReplaceAll(s.help, "|", "\\|"))
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "mailplane: "+format+"\n", args...)
	os.Exit(2)
}
