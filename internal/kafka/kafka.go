// Package kafka is mailplane's one place for Kafka client setup (producers
// idempotent with acks=all, consumer groups on the classic protocol with the
// cooperative-sticky balancer, deadlines on every request) and for the
// embedded kfake broker used by dev mode and tests.
package kafka

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"
)

// Config is what every client needs.
type Config struct {
	Brokers  []string
	ClientID string
	// Registerer, when set, receives franz-go's client metrics (kprom)
	// under the mailplane_kafka namespace, labelled by client id and kind.
	Registerer prometheus.Registerer
	// SASL authenticates every connection when its mechanism is set.
	SASL SASL
	// TLS, when not nil, encrypts every connection to the brokers.
	TLS *tls.Config
}

// clientMetrics returns a kprom plugin for one client. kprom registers its
// collectors when the client is created, so each client gets its own,
// told apart by constant labels.
func clientMetrics(reg prometheus.Registerer, clientID, kind string) *kprom.Metrics {
	labels := prometheus.Labels{"client": clientID, "kind": kind}
	return kprom.NewMetrics("mailplane_kafka", kprom.Registerer(tolerant{prometheus.WrapRegistererWith(labels, reg)}))
}

// tolerant skips collectors already registered: a second client with the
// same id and kind goes unmeasured rather than panicking the process.
type tolerant struct{ prometheus.Registerer }

func (t tolerant) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := t.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				panic(err)
			}
		}
	}
}

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

func base(cfg Config, kind string) []kgo.Opt {
	opts := append(ConnOptions(cfg),
		kgo.RequestTimeoutOverhead(10*time.Second),
		kgo.RetryTimeout(30*time.Second),
		kgo.MetadataMinAge(250*time.Millisecond),
	)
	id := cfg.ClientID
	if id == "" {
		host, _ := os.Hostname()
		id = "mailplane-" + host
	}
	opts = append(opts, kgo.ClientID(id))
	if cfg.Registerer != nil {
		opts = append(opts, kgo.WithHooks(clientMetrics(cfg.Registerer, id, kind)))
	}
	return opts
}

// ProducerOptions are the options of every mailplane producer: idempotent,
// acks from all in-sync replicas, records keyed by aggregate id and
// partitioned by the Kafka-compatible murmur2 hash, so that per-key order
// holds and any Kafka client agrees on where a key lives.
func ProducerOptions(cfg Config, extra ...kgo.Opt) []kgo.Opt {
	opts := append(base(cfg, "producer"),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(2*time.Millisecond),
		kgo.ProduceRequestTimeout(10*time.Second),
		kgo.RecordDeliveryTimeout(30*time.Second),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
	)
	return append(opts, extra...)
}

// NewProducer returns a client with ProducerOptions.
func NewProducer(cfg Config, extra ...kgo.Opt) (*kgo.Client, error) {
	cl, err := kgo.NewClient(ProducerOptions(cfg, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka producer: %w", err)
	}
	return cl, nil
}

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
	opts := append(base(cfg, "consumer"),
		kgo.ConsumerGroup(g.Group),
		kgo.ConsumeTopics(g.Topics...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
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
