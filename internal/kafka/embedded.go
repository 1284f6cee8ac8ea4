package kafka

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Embedded is an in-process Kafka-protocol broker (kfake).
type Embedded struct {
	Cluster *kfake.Cluster
}

// EmbeddedOption configures StartEmbedded.
type EmbeddedOption func(*embeddedConfig)

type embeddedConfig struct {
	port    int
	dataDir string
	sync    bool
	extra   []kfake.Opt
}

// WithPort makes the broker listen on 127.0.0.1:port (0 picks a free port).
func WithPort(port int) EmbeddedOption { return func(c *embeddedConfig) { c.port = port } }

// WithDataDir persists topics, offsets and groups under dir, so a second
// start reuses the state.
func WithDataDir(dir string) EmbeddedOption { return func(c *embeddedConfig) { c.dataDir = dir } }

// WithSyncWrites fsyncs every batch (acks then mean on disk).
func WithSyncWrites() EmbeddedOption { return func(c *embeddedConfig) { c.sync = true } }

// WithKfakeOptions passes options straight to kfake (tests use its fault
// hooks and shorter group session minimums).
func WithKfakeOptions(opts ...kfake.Opt) EmbeddedOption {
	return func(c *embeddedConfig) { c.extra = append(c.extra, opts...) }
}

// StartEmbedded starts an embedded broker.
func StartEmbedded(opts ...EmbeddedOption) (*Embedded, error) {
	var c embeddedConfig
	for _, o := range opts {
		o(&c)
	}
	kopts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.ClusterID("mailplane-embedded"),
		kfake.Ports(c.port),
	}
	if c.dataDir != "" {
		kopts = append(kopts, kfake.DataDir(c.dataDir))
	}
	if c.sync {
		kopts = append(kopts, kfake.SyncWrites())
	}
	kopts = append(kopts, c.extra...)
	cl, err := kfake.NewCluster(kopts...)
	if err != nil {
		return nil, fmt.Errorf("embedded broker: %w", err)
	}
	return &Embedded{Cluster: cl}, nil
}

// Addrs returns the broker's listen addresses.
func (e *Embedded) Addrs() []string { return e.Cluster.ListenAddrs() }

// Close stops the broker, flushing persisted state.
func (e *Embedded) Close() { e.Cluster.Close() }
