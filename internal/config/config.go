// Package config is mailplane's configuration: every setting (a flag with
// an environment fallback) is registered in the table below, and `mailplane
// help config` prints that table, which is docs/configuration.md. A
// setting's default is the owning package's own default, rendered here,
// never a second copy of it. Roles and commands take the settings they
// need on their own flag sets; the broker settings come as a group
// (BrokerFlags). Environment names all start with MAILPLANE_; the former
// names without it are still read for one release (deprecated.go).
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/console"
	"github.com/mailplane/mailplane/internal/devfleet"
	"github.com/mailplane/mailplane/internal/imapsync"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/memlimit"
	"github.com/mailplane/mailplane/internal/pgcluster"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/workerapi"
	"github.com/mailplane/mailplane/topics"
)

// Setting is one configuration knob: a flag with an environment fallback.
// Every setting is listed by `mailplane help config`, which is where
// docs/configuration.md comes from. Default is the flag's value when
// neither the flag nor the environment gives one; where a package owns
// the default, it is rendered from the package's value.
type Setting struct {
	Flag, Env, Default, Help string
}

var settings = map[string]Setting{}

func register(s Setting) Setting {
	settings[s.Flag] = s
	return s
}

// envOr returns the environment value of s (under its former name, for
// one release, when only that is set), else its default.
func (s Setting) envOr() string {
	if v := lookupEnv(s.Env); v != "" {
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

// Override registers s, a setting with no default of its own, on fs as a
// duration that stands for another setting's value unless given (by flag
// or environment): a role's own consumer-group timings over the shared
// ones.
func (s Setting) Override(fs *flag.FlagSet) *Override {
	o := &Override{}
	if v := s.envOr(); v != "" {
		if err := o.Set(v); err != nil {
			fatalf("%s: %q is not a duration", s.Env, v)
		}
	}
	fs.Var(o, s.Flag, s.usage())
	return o
}

// Override is a duration setting that may be left unset (Setting.Override).
type Override struct {
	d     time.Duration
	given bool
}

// Or returns the value given, else def.
func (o *Override) Or(def time.Duration) time.Duration {
	if o.given {
		return o.d
	}
	return def
}

// Given reports whether a value was given.
func (o *Override) Given() bool { return o.given }

// String is the value given, empty when none (flag.Value).
func (o *Override) String() string {
	if o == nil || !o.given {
		return ""
	}
	return o.d.String()
}

// Set parses a duration (flag.Value).
func (o *Override) Set(v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return err
	}
	o.d, o.given = d, true
	return nil
}

// The owning packages' defaults, which the table renders.
var (
	syncDefaults = mailsync.DefaultConfig()
	imapDefaults = imapsync.DefaultConfig()
)

// devKafkaPort is dev mode's broker port, which the CLI's default brokers
// point at.
const devKafkaPort = "19092"

// Settings shared by the roles and commands.
var (
	Brokers           = register(Setting{"brokers", "MAILPLANE_BROKERS", "127.0.0.1:" + devKafkaPort, "comma-separated Kafka bootstrap brokers"})
	DatabaseURL       = register(Setting{"database-url", "MAILPLANE_DATABASE_URL", "", "Postgres URL; dev mode starts a private cluster when empty"})
	HTTP              = register(Setting{"http", "MAILPLANE_HTTP", "127.0.0.1:8080", "public HTTP listen address of the API (ingest, worker API, public health)"})
	OpsHTTP           = register(Setting{"ops-http", "MAILPLANE_OPS_HTTP", "127.0.0.1:9090", "ops HTTP listen address of every role: /metrics and the detailed /healthz (keep it private); empty: none"})
	APITokens         = register(Setting{"api-token", "MAILPLANE_API_TOKEN", "", "bearer token the CLI sends to the API (publish --api); dev mode generates one when empty and grants it every scope"})
	APITokensFile     = register(Setting{"api-tokens-file", "MAILPLANE_API_TOKENS_FILE", "", "the API's callers, one a line: name, sha256 of the token, scopes, source (mailplane token makes lines); reread on SIGHUP and when it changes; required by the api role"})
	WorkerFleetSecret = register(Setting{"worker-fleet-secret", "MAILPLANE_WORKER_FLEET_SECRET", "", "secret (32 bytes or more) the sending workers' credentials derive from (mailplane token worker prints one); prefer the environment; dev mode keeps one in its data dir"})
	HTTPInflightBytes = register(Setting{"http-inflight-bytes", "MAILPLANE_HTTP_INFLIGHT_BYTES", strconv.Itoa(api.DefaultMaxInflightBytes), "cap on the bytes of producers' (bearer callers') request bodies the API reads at once; beyond it 503 with Retry-After"})
	WorkerNewRate     = register(Setting{"worker-new-rate", "MAILPLANE_WORKER_NEW_RATE", strconv.FormatFloat(workerapi.DefaultNewWorkerRate, 'g', -1, 64), "worker ids unknown to placement admitted per second (heartbeats of more get 429)"})
	WorkerNewBurst    = register(Setting{"worker-new-burst", "MAILPLANE_WORKER_NEW_BURST", strconv.Itoa(workerapi.DefaultNewWorkerBurst), "burst of new worker ids admitted at once"})
	SealKeys          = register(Setting{"seal-keys", "MAILPLANE_SEAL_KEYS", "", "credential sealing keys, id:base64(32 bytes)[,...]; first is active; dev mode keeps one in its data dir"})
	SealKeyID         = register(Setting{"seal-key-id", "MAILPLANE_SEAL_KEY_ID", "", "id of the sealing key that seals new credentials (default: the first)"})
	DataDir           = register(Setting{"data-dir", "MAILPLANE_DATA_DIR", "./var", "dev mode: where the embedded broker, Postgres and the sealing key persist"})
	KafkaPort         = register(Setting{"kafka-port", "MAILPLANE_KAFKA_PORT", devKafkaPort, "dev mode: port of the embedded Kafka broker on 127.0.0.1"})
	PGPort            = register(Setting{"pg-port", "MAILPLANE_PG_PORT", strconv.Itoa(pgcluster.DefaultPort), "dev mode: port of the private Postgres cluster on 127.0.0.1"})
	StatePartitions   = register(Setting{"state-partitions", "MAILPLANE_STATE_PARTITIONS", strconv.Itoa(topics.DefaultStatePartitions), "partitions of mailbox.state and sync.tier (bounds the sync fleet size)"})
	LogLevel          = register(Setting{"log-level", "MAILPLANE_LOG_LEVEL", "info", "debug, info, warn or error"})
	LogFormat         = register(Setting{"log-format", "MAILPLANE_LOG_FORMAT", "text", "text or json"})
	Source            = register(Setting{"source", "MAILPLANE_SOURCE", "/cli", "ce_source of events published by the CLI (through --api: the caller's source or a path below it)"})
	APIURL            = register(Setting{"api", "MAILPLANE_API_URL", "", "publish through this API (e.g. http://127.0.0.1:8080) instead of straight to the brokers"})
	SchemaRegistry    = register(Setting{"registry", "MAILPLANE_SCHEMA_REGISTRY_URL", "http://127.0.0.1:18081", "Schema Registry (Confluent REST, e.g. Redpanda's) that schemas register writes every record type's reader schema to"})
)

// ErrNoDatabase is the error of a command that needs Postgres and was
// given no URL.
var ErrNoDatabase = errors.New("no database: set " + DatabaseURL.Env + " (or --" + DatabaseURL.Flag + ")")

// The API's request bodies: a budget per caller class (anonymous, console,
// producer above, billing, heartbeat), a minimum rate and a deadline
// (internal/api limits.go), and login attempts per client address
// (internal/console).
var (
	HTTPInflightAnonymousBytes = register(Setting{"http-inflight-anonymous-bytes", "MAILPLANE_HTTP_INFLIGHT_ANONYMOUS_BYTES", strconv.Itoa(api.DefaultAnonymousBudget), "cap on the bytes of request bodies read at once before any credential (the console login form, posts without a console session); beyond it 503"})
	HTTPInflightConsoleBytes   = register(Setting{"http-inflight-console-bytes", "MAILPLANE_HTTP_INFLIGHT_CONSOLE_BYTES", strconv.Itoa(api.DefaultConsoleBudget), "cap on the bytes of console-session form posts read at once; beyond it 503"})
	HTTPInflightBillingBytes   = register(Setting{"http-inflight-billing-bytes", "MAILPLANE_HTTP_INFLIGHT_BILLING_BYTES", strconv.Itoa(api.DefaultBillingBudget), "cap on the bytes of Stripe webhook bodies (at most 256 KiB each) read at once; beyond it 503"})
	HTTPInflightHeartbeatBytes = register(Setting{"http-inflight-heartbeat-bytes", "MAILPLANE_HTTP_INFLIGHT_HEARTBEAT_BYTES", strconv.Itoa(api.DefaultHeartbeatBudget), "cap on the bytes of sending workers' heartbeat bodies read at once, reserved for them; beyond it 503"})
	HTTPMinBodyRate            = register(Setting{"http-min-body-rate", "MAILPLANE_HTTP_MIN_BODY_RATE", strconv.Itoa(api.DefaultMinBodyRate), "bytes a second a request body must keep up on average after the grace; slower: cut with 408 request_timeout"})
	HTTPBodyGrace              = register(Setting{"http-body-grace", "MAILPLANE_HTTP_BODY_GRACE", dur(api.DefaultBodyRateGrace), "time a request body has before the minimum rate applies"})
	HTTPBodyDeadline           = register(Setting{"http-body-deadline", "MAILPLANE_HTTP_BODY_DEADLINE", dur(api.DefaultSmallDeadline), "time a request body of every class but producers' has to arrive whole (producers: " + dur(api.DefaultProducerTimeout) + "); later: 408 request_timeout"})
	HTTPTrustedProxies         = register(Setting{"http-trusted-proxies", "MAILPLANE_HTTP_TRUSTED_PROXIES", "", "comma-separated addresses or CIDRs of proxies whose X-Forwarded-For names the client of console logins; empty: the peer address is the client"})
	ConsoleLoginsPerMinute     = register(Setting{"console-logins-per-minute", "MAILPLANE_CONSOLE_LOGINS_PER_MINUTE", strconv.Itoa(console.DefaultLoginsPerMinute), "console login attempts a minute per client address (per /64 for IPv6); beyond them 429 with Retry-After"})
	ConsoleLoginBurst          = register(Setting{"console-login-burst", "MAILPLANE_CONSOLE_LOGIN_BURST", strconv.Itoa(console.DefaultLoginBurst), "console login attempts a client address may make at once"})
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
	KafkaCompression   = register(Setting{"kafka-compression", "MAILPLANE_KAFKA_COMPRESSION", kafka.DefaultCompression, "compression of the record batches mailplane produces: gzip (every stock client reads it; KafkaJS needs a plugin for the others), snappy, lz4, zstd or none"})
)

// Placement engine settings.
var WorkerRetention = register(Setting{"placement-worker-retention", "MAILPLANE_PLACEMENT_WORKER_RETENTION", dur(placement.DefaultWorkerRetention),
	"placement engine: a sending worker dead this long (no heartbeat) is forgotten (worker_forgotten), so placement state stays bounded; every engine of a deployment must use the same"})

// The placement engine's liveness hold and tier dwell
// (internal/placement, package comment). Every engine of a deployment
// must use the same.
var (
	LivenessHoldShare = register(Setting{"placement-liveness-hold-share", "MAILPLANE_PLACEMENT_LIVENESS_HOLD_SHARE", strconv.FormatFloat(placement.DefaultLivenessHoldPermille/1000.0, 'g', -1, 64),
		"placement engine: when a worker's liveness window runs out while at least this share (0 to 1, in thousandths) of the live workers went silent at once, the engine holds liveness (liveness_held) instead of declaring them dead, until heartbeats flow again"})
	LivenessHoldMinWorkers = register(Setting{"placement-liveness-hold-min-workers", "MAILPLANE_PLACEMENT_LIVENESS_HOLD_MIN_WORKERS", strconv.Itoa(placement.DefaultLivenessHoldMinWorkers),
		"placement engine: with fewer live sending workers liveness is never held (a one- or two-worker fleet fails over)"})
	LivenessHoldMax = register(Setting{"placement-liveness-hold-max", "MAILPLANE_PLACEMENT_LIVENESS_HOLD_MAX", dur(placement.DefaultLivenessHoldMax),
		"placement engine: the longest a liveness hold lasts; then the workers silent through it die a window later; 0: no bound"})
	TierDwell = register(Setting{"placement-tier-dwell", "MAILPLANE_PLACEMENT_TIER_DWELL", dur(placement.DefaultTierDwell),
		"placement engine: a sending worker's tier changes at most once per this long (a change asked for sooner is ignored); 0: no dwell"})
)

// Consumer-group timings: one pair for every group, and each role's own
// pair over it (empty: the shared one). The session timeout is how long
// after a member dies its partitions move to the others; a member stopped
// with SIGTERM leaves its groups and hands over at once. The heartbeat
// must be shorter than the session (internal/roles checks the pair each
// role ends up with).
var (
	GroupSession   = register(Setting{"group-session-timeout", "MAILPLANE_GROUP_SESSION_TIMEOUT", dur(kafka.DefaultSessionTimeout), "session timeout of every consumer group (projectors, placement engine, mailbox.state processor, sync) unless the role's own is set: how long after a member dies its partitions move (6s is the shortest Kafka and Redpanda accept by default)"})
	GroupHeartbeat = register(Setting{"group-heartbeat-interval", "MAILPLANE_GROUP_HEARTBEAT_INTERVAL", dur(kafka.DefaultHeartbeatInterval), "heartbeat interval of every consumer group unless the role's own is set (shorter than the session timeout)"})

	ProjectorSession   = register(Setting{"projector-session-timeout", "MAILPLANE_PROJECTOR_SESSION_TIMEOUT", "", "projector groups' (registry, health) session timeout: failover time after a projector dies; empty: --group-session-timeout"})
	ProjectorHeartbeat = register(Setting{"projector-heartbeat-interval", "MAILPLANE_PROJECTOR_HEARTBEAT_INTERVAL", "", "projector groups' heartbeat interval; empty: --group-heartbeat-interval"})
	EngineSession      = register(Setting{"engine-session-timeout", "MAILPLANE_ENGINE_SESSION_TIMEOUT", "", "placement engine group session timeout: how long after the active engine dies a standby takes over; empty: --group-session-timeout"})
	EngineHeartbeat    = register(Setting{"engine-heartbeat-interval", "MAILPLANE_ENGINE_HEARTBEAT_INTERVAL", "", "placement engine group heartbeat interval; empty: --group-heartbeat-interval"})
	StateSession       = register(Setting{"state-session-timeout", "MAILPLANE_STATE_SESSION_TIMEOUT", "", "mailbox.state processor group session timeout: failover time after a processor dies; empty: --group-session-timeout"})
	StateHeartbeat     = register(Setting{"state-heartbeat-interval", "MAILPLANE_STATE_HEARTBEAT_INTERVAL", "", "mailbox.state processor group heartbeat interval; empty: --group-heartbeat-interval"})
	SyncSession        = register(Setting{"sync-session-timeout", "MAILPLANE_SYNC_SESSION_TIMEOUT", "", "sync group session timeout: failover time after a worker dies; empty: --group-session-timeout"})
	SyncHeartbeat      = register(Setting{"sync-heartbeat-interval", "MAILPLANE_SYNC_HEARTBEAT_INTERVAL", "", "sync group heartbeat interval; empty: --group-heartbeat-interval"})
)

// Sync worker settings; their defaults are mailsync.DefaultConfig's.
var (
	SyncWorkerID   = register(Setting{"sync-worker-id", "MAILPLANE_SYNC_WORKER_ID", "", "sync worker identity, unique per running worker (default host-pid-random)"})
	PollWarm       = register(Setting{"poll-warm", "MAILPLANE_POLL_WARM", dur(syncDefaults.PollWarm), "poll interval of warm mailboxes (and of hot mailboxes' special-use folders)"})
	PollCold       = register(Setting{"poll-cold", "MAILPLANE_POLL_COLD", dur(syncDefaults.PollCold), "poll interval of cold mailboxes"})
	SessionGrace   = register(Setting{"tier-session-grace", "MAILPLANE_TIER_SESSION_GRACE", dur(syncDefaults.TierSessionGrace), "a user.active within this long keeps the user's mailboxes hot"})
	HotActivity    = register(Setting{"tier-hot-activity", "MAILPLANE_TIER_HOT_ACTIVITY", dur(syncDefaults.TierHotActivity), "mail newer than this keeps a mailbox hot"})
	ColdAfter      = register(Setting{"tier-cold-after", "MAILPLANE_TIER_COLD_AFTER", dur(syncDefaults.TierColdAfter), "a mailbox with no mail, session or registration for this long is cold"})
	HotBudget      = register(Setting{"hot-budget-per-worker", "MAILPLANE_HOT_BUDGET_PER_WORKER", strconv.Itoa(syncDefaults.HotBudgetPerWorker), "most hot mailboxes per sync worker; the least recently active session-less ones are demoted"})
	ConnectRate    = register(Setting{"sync-connect-rate", "MAILPLANE_SYNC_CONNECT_RATE", strconv.Itoa(int(syncDefaults.ConnectRatePerHost)), "IMAP connection setups per second per IMAP host and sync worker (burst the same); every warm or cold poll is one"})
	PollsInFlight  = register(Setting{"sync-polls-in-flight", "MAILPLANE_SYNC_POLLS_IN_FLIGHT", strconv.Itoa(syncDefaults.PollsInFlight), "warm and cold polls a sync worker runs at once per IMAP host (each holds a connection from before its cursors are read until it logs out); the rest wait their turn"})
	WarmupHeader   = register(Setting{"warmup-header", "MAILPLANE_WARMUP_HEADER", imapsync.DefaultWarmupHeader, "header marking warmup messages (value: mailbox=<sender id>; id=<warmup id>); where they land is health evidence"})
	WarmupKey      = register(Setting{"warmup-key", "MAILPLANE_WARMUP_KEY", "", "key warmup headers must be signed with (HMAC-SHA256, sig=); unsigned or forged headers are ignored; required by `mailplane sync` (dev mode keeps one in its data dir)"})
	InsecureWarmup = register(Setting{"insecure-unsigned-warmup", "MAILPLANE_INSECURE_UNSIGNED_WARMUP", "false", "sync: run without a warmup key, counting unsigned warmup headers (anyone who can mail a monitored mailbox then moves senders between risk pools); never in production"})
	SyncMemLimit   = register(Setting{"sync-memory-limit", "MAILPLANE_SYNC_MEMORY_LIMIT", "auto", fmt.Sprintf("sync: the Go runtime's soft memory limit: auto (%d%% of the container's cgroup memory limit, else %dMiB), off, or a size such as 1500MiB or 4GiB; GOMEMLIMIT, when set, wins (docs/capacity.md, sync worker memory)", int(memlimit.Fraction*100), memlimit.Fallback>>20)})
	SyncWorkers    = register(Setting{"sync-workers", "MAILPLANE_SYNC_WORKERS", "2", "dev mode: sync workers run in the process"})
)

// IMAP runner settings; their defaults are imapsync's.
var (
	IMAPCAFile          = register(Setting{"imap-ca-file", "MAILPLANE_IMAP_CA_FILE", "", "PEM bundle of extra CAs trusted for IMAP servers (private servers); the system pool is always trusted"})
	IMAPDisableAfter    = register(Setting{"imap-auth-disable-after", "MAILPLANE_IMAP_AUTH_DISABLE_AFTER", dur(imapDefaults.DisableAfter), "a mailbox whose IMAP login keeps failing this long is disabled (mailbox.disabled)"})
	GmailClientID       = register(Setting{"oauth-gmail-client-id", "MAILPLANE_OAUTH_GMAIL_CLIENT_ID", "", "OAuth client id for gmail mailboxes whose credentials are a refresh token (IMAP login with XOAUTH2)"})
	GmailClientSecret   = register(Setting{"oauth-gmail-client-secret", "MAILPLANE_OAUTH_GMAIL_CLIENT_SECRET", "", "OAuth client secret for gmail (prefer the environment to the flag)"})
	GmailTokenURL       = register(Setting{"oauth-gmail-token-url", "MAILPLANE_OAUTH_GMAIL_TOKEN_URL", imapsync.GoogleTokenURL, "OAuth token endpoint for gmail"})
	OutlookClientID     = register(Setting{"oauth-outlook-client-id", "MAILPLANE_OAUTH_OUTLOOK_CLIENT_ID", "", "OAuth client id for outlook mailboxes whose credentials are a refresh token"})
	OutlookClientSecret = register(Setting{"oauth-outlook-client-secret", "MAILPLANE_OAUTH_OUTLOOK_CLIENT_SECRET", "", "OAuth client secret for outlook (prefer the environment to the flag)"})
	OutlookTokenURL     = register(Setting{"oauth-outlook-token-url", "MAILPLANE_OAUTH_OUTLOOK_TOKEN_URL", imapsync.MicrosoftTokenURL, "OAuth token endpoint for outlook"})
	IMAPAllow           = register(Setting{"imap-allow", "MAILPLANE_IMAP_ALLOW", "", "comma-separated CIDRs, IPs and host names IMAP may reach although internal (loopback, private, link-local, CGNAT, and their NAT64/6to4 forms) and send plain text (tls none) to, on any port; an IP or host name with :port (127.0.0.1:1143, [::1]:1143, imap.internal:993) on that port only; checked at ingest and on the resolved address and port at dial time (dev mode adds its IMAP server's address and port)"})
	SetupTimeout        = register(Setting{"sync-setup-timeout", "MAILPLANE_SYNC_SETUP_TIMEOUT", dur(imapsync.DefaultSetupTimeout), "the IMAP server's time (not the database's) one mailbox's setup (connect to first IDLE), warm or cold poll, or hot round between IDLEs may take in all, however often the server answers; past it the attempt fails server_slow and backs off (its progress kept)"})
	SetupSharePerHost   = register(Setting{"sync-setup-share-per-host", "MAILPLANE_SYNC_SETUP_SHARE_PER_HOST", strconv.Itoa(imapsync.DefaultSetupSharePerHost), "percent of a sync worker's setup slots (" + strconv.Itoa(imapsync.DefaultMaxSettingUp) + ") the mailboxes of one IMAP host may hold at once (at least one): a slow host cannot hold them all"})
	IMAPMaxResponse     = register(Setting{"sync-imap-max-response-kib", "MAILPLANE_SYNC_IMAP_MAX_RESPONSE_KIB", strconv.Itoa(imapsync.DefaultMaxResponseBytes >> 10), "KiB an IMAP server may send for one command's answer, one fetched message or one IDLE; past it the connection is dropped (server_oversized)"})
	IMAPMaxSession      = register(Setting{"sync-imap-max-session-mib", "MAILPLANE_SYNC_IMAP_MAX_SESSION_MIB", strconv.Itoa(imapsync.DefaultMaxSessionBytes >> 20), "MiB an IMAP server may send over one setup, poll or hot round; past it the connection is dropped (server_oversized; the sync's progress is kept)"})
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
// (`mailplane help config`; docs/configuration.md holds a copy, checked
// by a test and rewritten by `make docs-config`).
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

// dur renders a default duration as an operator writes it: 2m, not 2m0s.
func dur(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
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
