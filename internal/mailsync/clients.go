package mailsync

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/topics"
)

// The construction of every Kafka client a sync worker uses, in one file,
// all from the Kafka kit (internal/kafka): kcfg carries the worker's logger
// and registerer.

// newOutClient is the worker's producer: sync.failed events, the watchdog's
// probes and the admin requests (listing offsets, checking partitioning).
func newOutClient(kcfg kafka.Config) (*kgo.Client, error) {
	out, err := kafka.NewProducer(kcfg.WithClientID(kcfg.ClientID + "-out"))
	if err != nil {
		return nil, fmt.Errorf("mailsync: producer: %w", err)
	}
	return out, nil
}

// groupCallbacks are the consumer group's rebalance callbacks and the
// watchdog's hook.
type groupCallbacks struct {
	assigned, revoked, lost func(context.Context, *kgo.Client, map[string][]int32)
	hook                    kgo.Hook
}

// newGroupClient is the member of the sync group on mailbox.state.
func newGroupClient(kcfg kafka.Config, cfg Config, cb groupCallbacks) (*kgo.Client, error) {
	opts := []kgo.Opt{
		// Records reach the poll loop only for partitions it owns, and
		// rebalance callbacks never run while it applies them.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(cb.assigned),
		kgo.OnPartitionsRevoked(cb.revoked),
		kgo.OnPartitionsLost(cb.lost),
		kgo.RebalanceTimeout(cfg.RebalanceTimeout),
		// Control records too, so that reading a partition "to its end"
		// (the last stable offset) sees every offset up to it.
		kgo.KeepControlRecords(),
		kgo.WithHooks(cb.hook),
		// An owner reads its partitions from the start, whatever offset
		// the group committed: the offsets committed are only for lag
		// tools (commitPositionsLocked).
		kgo.AdjustFetchOffsetsFn(fromStart),
	}
	cl, err := kafka.NewConsumer(kcfg, kafka.GroupConfig{
		Group: cfg.Group, Topics: []string{kcfg.Topic(topics.MailboxState)},
		SessionTimeout: cfg.SessionTimeout, HeartbeatInterval: cfg.HeartbeatInterval,
	}, append(opts, cfg.KgoOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("mailsync: consumer: %w", err)
	}
	return cl, nil
}

// newUserReader reads every partition of the user topic from since on, as
// a plain consumer.
func newUserReader(kcfg kafka.Config, since time.Time) (*kgo.Client, error) {
	return kafka.NewClient(kcfg.WithClientID(kcfg.ClientID+"-users"), kafka.KindReader,
		kgo.ConsumeTopics(kcfg.Topic(topics.UserEvents)),
		kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(since.UnixMilli())),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(500*time.Millisecond),
	)
}

// newRelay is the worker's own outbox relay (its producer is built by
// package outbox). Several workers of one process share a registerer, and
// their relays share the metrics on it (package outbox registers through
// promreg; only one relay per database publishes anyway).
func newRelay(pool *pgxpool.Pool, kcfg kafka.Config, log *slog.Logger, reg prometheus.Registerer) *outbox.Relay {
	rcfg := kcfg.WithClientID(kcfg.ClientID + "-outbox")
	return outbox.NewRelay(pool, rcfg, outbox.WithLogger(log.With("component", "outbox-relay")),
		outbox.WithRegisterer(reg))
}
