// Package config is mailplane's configuration: every setting (a flag with
// an environment fallback) is registered in the table below, and `mailplane
// help config` prints that table, which is README.md's configuration
// reference. Roles and commands take the settings they need on their own
// flag sets; the broker settings come as a group (BrokerFlags).
package config

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

	"github.com/mailplane/mailplane/internal/devfleet"
	"github.com/mailplane/mailplane/internal/imapsync"
)

// Setting is one configuration knob: a flag with an environment fallback.
// Every setting is listed by `mailplane help config`, which is where the
// README's configuration reference comes from.
type Setting struct {
	Flag, Env, Default, Help string
}

var settings = map[string]Setting{}

func register(s Setting) Setting {
	settings[s.Flag] = s
	return s
}

// envOr returns the environment value of s, else its default.
func (s Setting) envOr() string {
	if v, ok := os.LookupEnv(s.Env); ok && v != "" {
		return v
	}
	return s.Default
}

func (s Setting) usage() string { return s.Help + " (env " + s.Env + ")" }

// String registers s on fs as a string flag.
func (s Setting) String(fs *flag.FlagSet) *string {
	return fs.String(s.Flag, s.envOr(), s.usage())
}

// Int registers s on fs as an integer flag; a malformed environment value
// stops the command.
func (s Setting) Int(fs *flag.FlagSet) *int {
	v, err := strconv.Atoi(s.envOr())
	if err != nil {
		fatalf("%s: %q is not an integer", s.Env, s.envOr())
	}
	return fs.Int(s.Flag, v, s.usage())
}

// Float registers s on fs as a number flag.
func (s Setting) Float(fs *flag.FlagSet) *float64 {
	v, err := strconv.ParseFloat(s.envOr(), 64)
	if err != nil {
		fatalf("%s: %q is not a number", s.Env, s.envOr())
	}
	return fs.Float64(s.Flag, v, s.usage())
}

// Bool registers s on fs as a boolean flag.
func (s Setting) Bool(fs *flag.FlagSet) *bool {
	v, err := strconv.ParseBool(s.envOr())
	if err != nil {
		fatalf("%s: %q is not a boolean", s.Env, s.envOr())
	}
	return fs.Bool(s.Flag, v, s.usage())
}

// Duration registers s on fs as a duration flag.
func (s Setting) Duration(fs *flag.FlagSet) *time.Duration {
	v, err := time.ParseDuration(s.envOr())
	if err != nil {
		fatalf("%s: %q is not a duration", s.Env, s.envOr())
	}
	return fs.Duration(s.Flag, v, s.usage())
}

// Settings shared by the roles and commands.
var (
	Brokers           = register(Setting{"brokers", "MAILPLANE_BROKERS", "127.0.0.1:19092", "comma-separated Kafka bootstrap brokers"})
	DatabaseURL       = register(Setting{"database-url", "DATABASE_URL", "", "Postgres URL; dev mode starts a private cluster when empty"})
	HTTP              = register(Setting{"http", "MAILPLANE_HTTP", "127.0.0.1:8080", "public HTTP listen address of the API (ingest, worker API, public health)"})
	OpsHTTP           = register(Setting{"ops-http", "MAILPLANE_OPS_HTTP", "127.0.0.1:9090", "ops HTTP listen address of every role: /metrics and the detailed /healthz (keep it private); empty: none"})
	APITokens         = register(Setting{"api-token", "MAILPLANE_API_TOKEN", "", "bearer token the CLI sends to the API (publish --api); dev mode generates one when empty and grants it every scope"})
	APITokensFile     = register(Setting{"api-tokens-file", "MAILPLANE_API_TOKENS_FILE", "", "the API's callers, one a line: name, sha256 of the token, scopes, source (mailplane token makes lines); reread on SIGHUP and when it changes; required by the api role"})
	WorkerFleetSecret = register(Setting{"worker-fleet-secret", "MAILPLANE_WORKER_FLEET_SECRET", "", "secret (32 bytes or more) the sending workers' credentials derive from (mailplane token worker prints one); prefer the environment; dev mode keeps one in its data dir"})
	HTTPInflightBytes = register(Setting{"http-inflight-bytes", "MAILPLANE_HTTP_INFLIGHT_BYTES", "67108864", "cap on the bytes of producers' (bearer callers') request bodies the API reads at once; beyond it 503 with Retry-After"})
	WorkerNewRate     = register(Setting{"worker-new-rate", "MAILPLANE_WORKER_NEW_RATE", "2", "worker ids unknown to placement admitted per second (heartbeats of more get 429)"})
	WorkerNewBurst    = register(Setting{"worker-new-burst", "MAILPLANE_WORKER_NEW_BURST", "20", "burst of new worker ids admitted at once"})
	SealKeys          = register(Setting{"seal-keys", "MAILPLANE_SEAL_KEYS", "", "credential sealing keys, id:base64(32 bytes)[,...]; first is active; dev mode keeps one in its data dir"})
	SealKeyID         = register(Setting{"seal-key-id", "MAILPLANE_SEAL_KEY_ID", "", "id of the sealing key that seals new credentials (default: the first)"})
	DataDir           = register(Setting{"data-dir", "MAILPLANE_DATA_DIR", "./var", "dev mode: where the embedded broker, Postgres and the sealing key persist"})
	KafkaPort         = register(Setting{"kafka-port", "MAILPLANE_KAFKA_PORT", "19092", "dev mode: port of the embedded Kafka broker on 127.0.0.1"})
	PGPort            = register(Setting{"pg-port", "MAILPLANE_PG_PORT", "54329", "dev mode: port of the private Postgres cluster on 127.0.0.1"})
	StatePartitions   = register(Setting{"state-partitions", "MAILPLANE_STATE_PARTITIONS", "256", "partitions of mailbox.state and sync.tier (bounds the sync fleet size)"})
	LogLevel          = register(Setting{"log-level", "MAILPLANE_LOG_LEVEL", "info", "debug, info, warn or error"})
	LogFormat         = register(Setting{"log-format", "MAILPLANE_LOG_FORMAT", "text", "text or json"})
	Source            = register(Setting{"source", "MAILPLANE_SOURCE", "/cli", "ce_source of events published by the CLI (through --api: the caller's source or a path below it)"})
	APIURL            = register(Setting{"api", "MAILPLANE_API_URL", "", "publish through this API (e.g. http://127.0.0.1:8080) instead of straight to the brokers"})
	SchemaRegistry    = register(Setting{"registry", "MAILPLANE_SCHEMA_REGISTRY_URL", "http://127.0.0.1:18081", "Schema Registry (Confluent REST, e.g. Redpanda's) that schemas register writes every record type's reader schema to"})
)

// The API's request bodies: a budget per caller class (anonymous, console,
// producer above, billing, heartbeat), a minimum rate and a deadline
// (internal/api limits.go), and login attempts per client address
// (internal/console).
var (
	HTTPInflightAnonymousBytes = register(Setting{"http-inflight-anonymous-bytes", "MAILPLANE_HTTP_INFLIGHT_ANONYMOUS_BYTES", "1048576", "cap on the bytes of request bodies read at once before any credential (the console login form, posts without a console session); beyond it 503"})
	HTTPInflightConsoleBytes   = register(Setting{"http-inflight-console-bytes", "MAILPLANE_HTTP_INFLIGHT_CONSOLE_BYTES", "1048576", "cap on the bytes of console-session form posts read at once; beyond it 503"})
	HTTPInflightBillingBytes   = register(Setting{"http-inflight-billing-bytes", "MAILPLANE_HTTP_INFLIGHT_BILLING_BYTES", "8388608", "cap on the bytes of Stripe webhook bodies (at most 256 KiB each) read at once; beyond it 503"})
	HTTPInflightHeartbeatBytes = register(Setting{"http-inflight-heartbeat-bytes", "MAILPLANE_HTTP_INFLIGHT_HEARTBEAT_BYTES", "16777216", "cap on the bytes of sending workers' heartbeat bodies read at once, reserved for them; beyond it 503"})
	HTTPMinBodyRate            = register(Setting{"http-min-body-rate", "MAILPLANE_HTTP_MIN_BODY_RATE", "1024", "bytes a second a request body must keep up on average after the grace; slower: cut with 408 request_timeout"})
	HTTPBodyGrace              = register(Setting{"http-body-grace", "MAILPLANE_HTTP_BODY_GRACE", "2s", "time a request body has before the minimum rate applies"})
	HTTPBodyDeadline           = register(Setting{"http-body-deadline", "MAILPLANE_HTTP_BODY_DEADLINE", "10s", "time a request body of every class but producers' has to arrive whole (producers: 30s); later: 408 request_timeout"})
	HTTPTrustedProxies         = register(Setting{"http-trusted-proxies", "MAILPLANE_HTTP_TRUSTED_PROXIES", "", "comma-separated addresses or CIDRs of proxies whose X-Forwarded-For names the client of console logins; empty: the peer address is the client"})
	ConsoleLoginsPerMinute     = register(Setting{"console-logins-per-minute", "MAILPLANE_CONSOLE_LOGINS_PER_MINUTE", "10", "console login attempts a minute per client address (per /64 for IPv6); beyond them 429 with Retry-After"})
	ConsoleLoginBurst          = register(Setting{"console-login-burst", "MAILPLANE_CONSOLE_LOGIN_BURST", "10", "console login attempts a client address may make at once"})
)

// Postgres pool sizes, by purpose (internal/dbpools). A process opens
// only the pools its roles use.
var (
	PGServeConns  = register(Setting{"pg-serve-conns", "MAILPLANE_PG_SERVE_CONNS", "4", "Postgres connections of the health check and the HTTP APIs, never shared with background work"})
	PGRunnerConns = register(Setting{"pg-runner-conns", "MAILPLANE_PG_RUNNER_CONNS", "16", "sync: Postgres connections the IMAP runners' writes and the workers' ownership share; a runner waits for one"})
	PGWorkConns   = register(Setting{"pg-work-conns", "MAILPLANE_PG_WORK_CONNS", "8", "Postgres connections of the projectors, the outbox relay, the engine's snapshot and pruning"})
)

// Broker connection settings, shared by every command that talks to Kafka.
var (
	KafkaSASLMechanism = register(Setting{"kafka-sasl-mechanism", "MAILPLANE_KAFKA_SASL_MECHANISM", "", "SASL mechanism to the brokers: SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN; empty: none (SECURITY.md: one user per role)"})
	KafkaSASLUser      = register(Setting{"kafka-sasl-user", "MAILPLANE_KAFKA_SASL_USER", "", "SASL user of this role at the brokers"})
	KafkaSASLPassword  = register(Setting{"kafka-sasl-password", "MAILPLANE_KAFKA_SASL_PASSWORD", "", "SASL password (prefer the environment to the flag)"})
	KafkaTLS           = register(Setting{"kafka-tls", "MAILPLANE_KAFKA_TLS", "false", "connect to the brokers over TLS (system roots plus --kafka-ca-file)"})
	KafkaCAFile        = register(Setting{"kafka-ca-file", "MAILPLANE_KAFKA_CA_FILE", "", "PEM bundle of extra CAs trusted for the brokers (implies --kafka-tls)"})
	KafkaNamespace     = register(Setting{"kafka-namespace", "MAILPLANE_KAFKA_NAMESPACE", "", "prefix of every topic, consumer group and transactional id (\"staging\" names staging.mailplane.mailbox.events.v1): deployments sharing a cluster each take one; empty: the plain names (docs/namespaces.md)"})
	KafkaCompression   = register(Setting{"kafka-compression", "MAILPLANE_KAFKA_COMPRESSION", "gzip", "compression of the record batches mailplane produces: gzip (every stock client reads it; KafkaJS needs a plugin for the others), snappy, lz4, zstd or none"})
)

// Placement engine settings.
var WorkerRetention = register(Setting{"placement-worker-retention", "MAILPLANE_PLACEMENT_WORKER_RETENTION", "168h", // placement.DefaultWorkerRetention
	"placement engine: a sending worker dead this long (no heartbeat) is forgotten (worker_forgotten), so placement state stays bounded; every engine of a deployment must use the same"})

// The placement engine's liveness hold and tier dwell
// (internal/placement, package comment). Every engine of a deployment
// must use the same.
var (
	LivenessHoldShare = register(Setting{"placement-liveness-hold-share", "MAILPLANE_PLACEMENT_LIVENESS_HOLD_SHARE", "0.55", // placement.DefaultLivenessHoldPermille
		"placement engine: when a worker's liveness window runs out while at least this share (0 to 1, in thousandths) of the live workers went silent at once, the engine holds liveness (liveness_held) instead of declaring them dead, until heartbeats flow again"})
	LivenessHoldMinWorkers = register(Setting{"placement-liveness-hold-min-workers", "MAILPLANE_PLACEMENT_LIVENESS_HOLD_MIN_WORKERS", "3", // placement.DefaultLivenessHoldMinWorkers
		"placement engine: with fewer live sending workers liveness is never held (a one- or two-worker fleet fails over)"})
	LivenessHoldMax = register(Setting{"placement-liveness-hold-max", "MAILPLANE_PLACEMENT_LIVENESS_HOLD_MAX", "10m", // placement.DefaultLivenessHoldMax
		"placement engine: the longest a liveness hold lasts; then the workers silent through it die a window later; 0: no bound"})
	TierDwell = register(Setting{"placement-tier-dwell", "MAILPLANE_PLACEMENT_TIER_DWELL", "5m", // placement.DefaultTierDwell
		"placement engine: a sending worker's tier changes at most once per this long (a change asked for sooner is ignored); 0: no dwell"})
)

// Consumer-group timings of the roles that consume in a group (sync has
// its own below). The session timeout is how long after a member dies its
// partitions move to the others; a member stopped with SIGTERM leaves its
// groups and hands over at once. 6 s is the shortest session Kafka and
// Redpanda accept by default (group.min.session.timeout.ms).
var (
	ProjectorSession   = register(Setting{"projector-session-timeout", "MAILPLANE_PROJECTOR_SESSION_TIMEOUT", "6s", "projector groups' (registry, health) session timeout: failover time after a projector dies"})
	ProjectorHeartbeat = register(Setting{"projector-heartbeat-interval", "MAILPLANE_PROJECTOR_HEARTBEAT_INTERVAL", "500ms", "projector groups' heartbeat interval (shorter than the session timeout)"})
	EngineSession      = register(Setting{"engine-session-timeout", "MAILPLANE_ENGINE_SESSION_TIMEOUT", "6s", "placement engine group session timeout: how long after the active engine dies a standby takes over"})
	EngineHeartbeat    = register(Setting{"engine-heartbeat-interval", "MAILPLANE_ENGINE_HEARTBEAT_INTERVAL", "500ms", "placement engine group heartbeat interval (shorter than the session timeout)"})
	StateSession       = register(Setting{"state-session-timeout", "MAILPLANE_STATE_SESSION_TIMEOUT", "6s", "mailbox.state processor group session timeout: failover time after a processor dies"})
	StateHeartbeat     = register(Setting{"state-heartbeat-interval", "MAILPLANE_STATE_HEARTBEAT_INTERVAL", "500ms", "mailbox.state processor group heartbeat interval (shorter than the session timeout)"})
)

// Sync worker settings. The tier knobs keep the names operators of the
// predecessor know (POLL_WARM, ...).
var (
	SyncWorkerID   = register(Setting{"sync-worker-id", "MAILPLANE_SYNC_WORKER_ID", "", "sync worker identity, unique per running worker (default host-pid-random)"})
	SyncSession    = register(Setting{"sync-session-timeout", "MAILPLANE_SYNC_SESSION_TIMEOUT", "6s", "sync group session timeout: failover time after a worker dies"})
	SyncHeartbeat  = register(Setting{"sync-heartbeat-interval", "MAILPLANE_SYNC_HEARTBEAT_INTERVAL", "500ms", "sync group heartbeat interval"})
	PollWarm       = register(Setting{"poll-warm", "POLL_WARM", "2m", "poll interval of warm mailboxes (and of hot mailboxes' special-use folders)"})
	PollCold       = register(Setting{"poll-cold", "POLL_COLD", "30m", "poll interval of cold mailboxes"})
	SessionGrace   = register(Setting{"tier-session-grace", "TIER_SESSION_GRACE", "15m", "a user.active within this long keeps the user's mailboxes hot"})
	HotActivity    = register(Setting{"tier-hot-activity", "TIER_HOT_ACTIVITY", "2h", "mail newer than this keeps a mailbox hot"})
	ColdAfter      = register(Setting{"tier-cold-after", "TIER_COLD_AFTER", "168h", "a mailbox with no mail, session or registration for this long is cold"})
	HotBudget      = register(Setting{"hot-budget-per-worker", "HOT_BUDGET_PER_WORKER", "2000", "most hot mailboxes per sync worker; the least recently active session-less ones are demoted"})
	ConnectRate    = register(Setting{"sync-connect-rate", "MAILPLANE_SYNC_CONNECT_RATE", "50", "IMAP connection setups per second per IMAP host and sync worker (burst the same); every warm or cold poll is one"})
	PollsInFlight  = register(Setting{"sync-polls-in-flight", "MAILPLANE_SYNC_POLLS_IN_FLIGHT", "256", "warm and cold polls a sync worker runs at once per IMAP host (each holds a connection from before its cursors are read until it logs out); the rest wait their turn"})
	WarmupHeader   = register(Setting{"warmup-header", "MAILPLANE_WARMUP_HEADER", "X-Mailplane-Warmup", "header marking warmup messages (value: mailbox=<sender id>; id=<warmup id>); where they land is health evidence"})
	WarmupKey      = register(Setting{"warmup-key", "MAILPLANE_WARMUP_KEY", "", "key warmup headers must be signed with (HMAC-SHA256, sig=); unsigned or forged headers are ignored; required by `mailplane sync` (dev mode keeps one in its data dir)"})
	InsecureWarmup = register(Setting{"insecure-unsigned-warmup", "MAILPLANE_INSECURE_UNSIGNED_WARMUP", "false", "sync: run without a warmup key, counting unsigned warmup headers (anyone who can mail a monitored mailbox then moves senders between risk pools); never in production"})
	SyncMemLimit   = register(Setting{"sync-memory-limit", "MAILPLANE_SYNC_MEMORY_LIMIT", "auto", "sync: the Go runtime's soft memory limit: auto (90% of the container's cgroup memory limit, else 900MiB), off, or a size such as 1500MiB or 4GiB; GOMEMLIMIT, when set, wins (docs/capacity.md, sync worker memory)"})
	SyncWorkers    = register(Setting{"sync-workers", "MAILPLANE_SYNC_WORKERS", "2", "dev mode: sync workers run in the process"})
)

// IMAP runner settings.
var (
	IMAPCAFile          = register(Setting{"imap-ca-file", "IMAP_CA_FILE", "", "PEM bundle of extra CAs trusted for IMAP servers (private servers); the system pool is always trusted"})
	IMAPDisableAfter    = register(Setting{"imap-auth-disable-after", "IMAP_AUTH_DISABLE_AFTER", "24h", "a mailbox whose IMAP login keeps failing this long is disabled (mailbox.disabled)"})
	GmailClientID       = register(Setting{"oauth-gmail-client-id", "MAILPLANE_OAUTH_GMAIL_CLIENT_ID", "", "OAuth client id for gmail mailboxes whose credentials are a refresh token (IMAP login with XOAUTH2)"})
	GmailClientSecret   = register(Setting{"oauth-gmail-client-secret", "MAILPLANE_OAUTH_GMAIL_CLIENT_SECRET", "", "OAuth client secret for gmail (prefer the environment to the flag)"})
	GmailTokenURL       = register(Setting{"oauth-gmail-token-url", "MAILPLANE_OAUTH_GMAIL_TOKEN_URL", imapsync.GoogleTokenURL, "OAuth token endpoint for gmail"})
	OutlookClientID     = register(Setting{"oauth-outlook-client-id", "MAILPLANE_OAUTH_OUTLOOK_CLIENT_ID", "", "OAuth client id for outlook mailboxes whose credentials are a refresh token"})
	OutlookClientSecret = register(Setting{"oauth-outlook-client-secret", "MAILPLANE_OAUTH_OUTLOOK_CLIENT_SECRET", "", "OAuth client secret for outlook (prefer the environment to the flag)"})
	OutlookTokenURL     = register(Setting{"oauth-outlook-token-url", "MAILPLANE_OAUTH_OUTLOOK_TOKEN_URL", imapsync.MicrosoftTokenURL, "OAuth token endpoint for outlook"})
	IMAPAllow           = register(Setting{"imap-allow", "MAILPLANE_IMAP_ALLOW", "", "comma-separated CIDRs, IPs and host names IMAP may reach although internal (loopback, private, link-local, CGNAT, and their NAT64/6to4 forms) and send plain text (tls none) to, on any port; an IP or host name with :port (127.0.0.1:1143, [::1]:1143, imap.internal:993) on that port only; checked at ingest and on the resolved address and port at dial time (dev mode adds its IMAP server's address and port)"})
	SetupTimeout        = register(Setting{"sync-setup-timeout", "MAILPLANE_SYNC_SETUP_TIMEOUT", "3m", "the IMAP server's time (not the database's) one mailbox's setup (connect to first IDLE), warm or cold poll, or hot round between IDLEs may take in all, however often the server answers; past it the attempt fails server_slow and backs off (its progress kept)"})
	SetupSharePerHost   = register(Setting{"sync-setup-share-per-host", "MAILPLANE_SYNC_SETUP_SHARE_PER_HOST", "25", "percent of a sync worker's setup slots (128) the mailboxes of one IMAP host may hold at once (at least one): a slow host cannot hold them all"})
	IMAPMaxResponse     = register(Setting{"sync-imap-max-response-kib", "MAILPLANE_SYNC_IMAP_MAX_RESPONSE_KIB", "4096", "KiB an IMAP server may send for one command's answer, one fetched message or one IDLE; past it the connection is dropped (server_oversized)"})
	IMAPMaxSession      = register(Setting{"sync-imap-max-session-mib", "MAILPLANE_SYNC_IMAP_MAX_SESSION_MIB", "1024", "MiB an IMAP server may send over one setup, poll or hot round; past it the connection is dropped (server_oversized; the sync's progress is kept)"})
	SyncRunner          = register(Setting{"sync-runner", "MAILPLANE_SYNC_RUNNER", "imap", "what sync workers run per mailbox: imap, or record (logs what it is told, syncs nothing)"})
)

// Dev mode's IMAP server and simulated fleet (package devfleet).
var (
	DevIMAPAddr       = register(Setting{"dev-imap-addr", "MAILPLANE_DEV_IMAP_ADDR", devfleet.DefaultAddr, "dev mode: listen address of the in-process IMAP server with the sample mailboxes (plain IMAP, loopback only; port 0 picks one)"})
	DevFleet          = register(Setting{"dev-fleet", "MAILPLANE_DEV_FLEET", "true", "dev mode: register the sample orgs and mailboxes, heartbeat the simulated sending workers and deliver warmup mail"})
	DevWarmupInterval = register(Setting{"dev-warmup-interval", "MAILPLANE_DEV_WARMUP_INTERVAL", devfleet.DefaultWarmupInterval.String(), "dev mode: how often the simulated fleet delivers a round of warmup mail"})
	DevSeed           = register(Setting{"dev-seed", "MAILPLANE_DEV_SEED", strconv.Itoa(devfleet.DefaultSeed), "dev mode: seed of the simulated fleet's choices (recipients, Junk placements)"})
)

// NewLogger returns the logger of a role or command: level and format as
// configured, on stderr. A bad level stops the command.
func NewLogger(level, format string) *slog.Logger {
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

// PrintReference writes the configuration reference as a Markdown table
// (`mailplane help config`; README.md holds a copy, checked by a test).
func PrintReference(w io.Writer) {
	names := make([]string, 0, len(settings))
	for n := range settings {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "| flag | environment | default | meaning |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, n := range names {
		s := settings[n]
		def := s.Default
		if def == "" {
			def = "—"
		} else {
			def = "`" + def + "`"
		}
		fmt.Fprintf(w, "| `--%s` | `%s` | %s | %s |\n", s.Flag, s.Env, def, strings.ReplaceAll(s.Help, "|", "\\|"))
	}
}

// SplitList splits a comma-separated setting, dropping empty entries.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// fatalf stops the command on a malformed setting, as the flag package
// does on a malformed flag.
func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "mailplane: "+format+"\n", args...)
	os.Exit(2)
}
