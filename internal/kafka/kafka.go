// Package kafka is mailplane's one place for Kafka client setup: every
// client is built by NewClient on one base (connection, deadlines, client
// id, kprom metrics, franz-go's logs through kslog); producers idempotent
// with acks=all, consumer groups on the classic protocol with the
// cooperative-sticky balancer; ReadToEnd reads partitions to their end. It
// also runs the embedded kfake broker used by dev mode and tests.
package kafka

import (
	"compress/gzip"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/mailplane/mailplane/internal/promreg"
	"github.com/mailplane/mailplane/topics"
)

// Config is what every client needs.
type Config struct {
	Brokers  []string
	ClientID string
	// Namespace prefixes every topic, group and transactional id this
	// configuration's users name (topics.Namespace); empty: the catalog's
	// names. The clients do not rewrite names themselves: each user maps
	// the catalog's names through it (Topic, Group, TransactionalID).
	Namespace topics.Namespace
	// Registerer, when set, receives franz-go's client metrics (kprom)
	// under the mailplane_kafka namespace, labelled by client id and kind.
	Registerer prometheus.Registerer
	// SASL authenticates every connection when its mechanism is set.
	SASL SASL
	// TLS, when not nil, encrypts every connection to the brokers.
	TLS *tls.Config
	// Logger, when set, receives franz-go's warnings and errors (through
	// its kslog plugin); nil logs nothing.
	Logger *slog.Logger
	// Compression of produced record batches: gzip (the default: every
	// stock client reads it without a plugin; KafkaJS reads no snappy,
	// lz4 or zstd on its own), snappy, lz4, zstd or none.
	Compression string
}

// DefaultCompression is what Config.Compression "" means.
const DefaultCompression = "gzip"

// Compressions are the values Config.Compression takes ("" is
// DefaultCompression).
var Compressions = []string{DefaultCompression, "snappy", "lz4", "zstd", "none"}

// compression returns the codec of a Config.Compression value.
func compression(name string) (kgo.CompressionCodec, error) {
	switch name {
	case "", DefaultCompression:
		return kgo.GzipCompression().WithLevel(gzip.BestSpeed), nil
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	case "none":
		return kgo.NoCompression(), nil
	}
	return kgo.CompressionCodec{}, fmt.Errorf("kafka: unknown compression %q (one of %v)", name, Compressions)
}

// ValidCompression checks a Config.Compression value.
func ValidCompression(name string) error {
	_, err := compression(name)
	return err
}

// WithLogger returns c logging to l, unless c has a logger already: a
// component's own logger is the default for the clients it builds.
func (c Config) WithLogger(l *slog.Logger) Config {
	if c.Logger == nil {
		c.Logger = l
	}
	return c
}

// clientMetrics returns a kprom plugin for one client. kprom registers its
// collectors when the client is created, so each client gets its own,
// told apart by constant labels. A second client with the same id and kind
// goes unmeasured rather than panicking the process (promreg.Lenient).
func clientMetrics(reg prometheus.Registerer, clientID, kind string) *kprom.Metrics {
	labels := prometheus.Labels{"client": clientID, "kind": kind}
	return kprom.NewMetrics("mailplane_kafka", kprom.Registerer(promreg.Lenient(prometheus.WrapRegistererWith(labels, reg))))
}

// Topic returns the catalog topic name within c's namespace.
func (c Config) Topic(name string) string { return c.Namespace.Topic(name) }

// Group returns the consumer group name within c's namespace.
func (c Config) Group(name string) string { return c.Namespace.Group(name) }

// TransactionalID returns the transactional id within c's namespace.
func (c Config) TransactionalID(id string) string { return c.Namespace.TransactionalID(id) }

// WithClientID returns c with another client id: a role's second client
// keeps the brokers, credentials and metrics of the first.
func (c Config) WithClientID(id string) Config {
	c.ClientID = id
	return c
}

// ParseBrokers splits a comma-separated broker list.
func ParseBrokers(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// clientID is cfg's client id, or one naming the host.
func clientID(cfg Config) string {
	if cfg.ClientID != "" {
		return cfg.ClientID
	}
	host, _ := os.Hostname()
	return "mailplane-" + host
}

// base are the options every client starts from: the connection (brokers,
// dial deadline, SASL, TLS), request deadlines, the client id, the kprom
// hooks on cfg.Registerer and franz-go's warnings on cfg.Logger.
func base(cfg Config, kind string) []kgo.Opt {
	opts := append(ConnOptions(cfg),
		kgo.RequestTimeoutOverhead(10*time.Second),
		kgo.RetryTimeout(30*time.Second),
		kgo.MetadataMinAge(250*time.Millisecond),
		// No KIP-714 metrics pushed to the broker (mailplane's client
		// metrics are kprom's): Close waits up to 1 s for a last push,
		// a second every client of a stopping process spends while the
		// broker is away.
		kgo.DisableClientMetrics(),
	)
	// Analysts read mailplane's topics with whatever client they like:
	// by default batches are gzip-compressed (fastest level), which they
	// all read (see Config.Compression). A bad name was refused earlier
	// (ValidCompression); it falls back to the default here.
	codec, err := compression(cfg.Compression)
	if err != nil {
		codec, _ = compression("")
	}
	opts = append(opts, kgo.ProducerBatchCompression(codec))
	id := clientID(cfg)
	opts = append(opts, kgo.ClientID(id))
	if cfg.Registerer != nil {
		opts = append(opts, kgo.WithHooks(clientMetrics(cfg.Registerer, id, kind)))
	}
	if cfg.Logger != nil {
		opts = append(opts, kgo.WithLogger(clientLogger(cfg.Logger, id)))
	}
	return opts
}

// NewClient returns a client of cfg's brokers built on the options every
// mailplane client shares (see base), then opts. kind labels its metrics:
// KindProducer, KindConsumer, KindAdmin or KindReader. Every client of the
// program is built here, so none misses the hooks.
func NewClient(cfg Config, kind string, opts ...kgo.Opt) (*kgo.Client, error) {
	cl, err := kgo.NewClient(append(base(cfg, kind), opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka %s client: %w", kind, err)
	}
	return cl, nil
}

// Kinds of client, the kind label of their metrics.
const (
	KindProducer = "producer"
	KindConsumer = "consumer"
	KindAdmin    = "admin"
	KindReader   = "reader"
)

// NewAdmin returns an admin client of cfg's brokers. Closing it closes its
// Kafka client.
func NewAdmin(cfg Config, opts ...kgo.Opt) (*kadm.Client, error) {
	cl, err := NewClient(cfg, KindAdmin, opts...)
	if err != nil {
		return nil, err
	}
	return kadm.NewClient(cl), nil
}

// ProducerOptions are the options of every mailplane producer: idempotent,
// acks from all in-sync replicas, records keyed by aggregate id and
// partitioned by the Kafka-compatible murmur2 hash, so that per-key order
// holds and any Kafka client agrees on where a key lives.
func ProducerOptions(cfg Config, extra ...kgo.Opt) []kgo.Opt {
	return append(base(cfg, KindProducer), producerSettings(extra)...)
}

func producerSettings(extra []kgo.Opt) []kgo.Opt {
	return append([]kgo.Opt{
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(2 * time.Millisecond),
		kgo.ProduceRequestTimeout(10 * time.Second),
		kgo.RecordDeliveryTimeout(30 * time.Second),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
	}, extra...)
}

// NewProducer returns a client with ProducerOptions.
func NewProducer(cfg Config, extra ...kgo.Opt) (*kgo.Client, error) {
	return NewClient(cfg, KindProducer, producerSettings(extra)...)
}

// DefaultSessionTimeout and DefaultHeartbeatInterval are the group timings
// of every mailplane consumer group unless configured otherwise: 6 s is
// the shortest session Kafka and Redpanda accept by default
// (group.min.session.timeout.ms), so a dead member's partitions move
// within seconds, not after franz-go's 45 s.
const (
	DefaultSessionTimeout    = 6 * time.Second
	DefaultHeartbeatInterval = 500 * time.Millisecond
)

// GroupConfig tunes consumer-group membership.
type GroupConfig struct {
	Group             string
	Topics            []string
	SessionTimeout    time.Duration
	HeartbeatInterval time.Duration
	InstanceID        string
}

// ConsumerOptions are the options of a group consumer: classic protocol with
// the cooperative-sticky balancer (Redpanda lacks KIP-848), read_committed so
// aborted transactions are never seen, manual commits (callers store offsets
// where their effects are), and fetches bounded so a batch fits one
// database transaction.
func ConsumerOptions(cfg Config, g GroupConfig, extra ...kgo.Opt) []kgo.Opt {
	return append(base(cfg, KindConsumer), consumerSettings(g, extra)...)
}

// NewConsumer returns a client with ConsumerOptions.
func NewConsumer(cfg Config, g GroupConfig, extra ...kgo.Opt) (*kgo.Client, error) {
	return NewClient(cfg, KindConsumer, consumerSettings(g, extra)...)
}

func consumerSettings(g GroupConfig, extra []kgo.Opt) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.ConsumerGroup(g.Group),
		kgo.ConsumeTopics(g.Topics...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}
	if g.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(g.SessionTimeout))
	}
	if g.HeartbeatInterval > 0 {
		opts = append(opts, kgo.HeartbeatInterval(g.HeartbeatInterval))
	}
	if g.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(g.InstanceID))
	}
	return append(opts, extra...)
}

// NewGroupTransactSession returns a transactional group session with
// ConsumerOptions; extra carries the transactional id and the producer
// settings the session needs.
func NewGroupTransactSession(cfg Config, g GroupConfig, extra ...kgo.Opt) (*kgo.GroupTransactSession, error) {
	sess, err := kgo.NewGroupTransactSession(ConsumerOptions(cfg, g, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka transactional session: %w", err)
	}
	return sess, nil
}

// CloseWithin runs closeClient (a group client's Close, which leaves the group)
// and waits for it at most d, reporting whether it finished. franz-go's
// leave waits for a JoinGroup in flight, which the coordinator holds until
// its rebalance completes (up to the rebalance timeout, a minute by
// default): a process shutting down must not wait that long. Past d the
// close goes on in the background until the process exits, and the
// coordinator expires the member's session on its own.
func CloseWithin(d time.Duration, closeClient func()) bool {
	done := make(chan struct{})
	go func() { closeClient(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
