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
	"github.com/mailplane/mailplane/internal/promreg"
	"github.com/mailplane/mailplane/topics"
)

// The construction of every Kafka client a sync worker uses, in one file,
// so that moving them onto a shared client kit changes this file only.

// newOutClient is the worker's producer: sync.failed events, the watchdog's
// probes and the admin requests (listing offsets, checking partitioning).
func newOutClient(kcfg kafka.Config, log *slog.Logger) (*kgo.Client, error) {
	out, err := kafka.NewProducer(kcfg.WithClientID(kcfg.ClientID+"-out"), kgo.WithLogger(kgoLogger{log}))
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
func newGroupClient(kcfg kafka.Config, cfg Config, log *slog.Logger, cb groupCallbacks) (*kgo.Client, error) {
	opts := kafka.ConsumerOptions(kcfg, kafka.GroupConfig{
		Group: cfg.Group, Topics: []string{topics.MailboxState},
		SessionTimeout: cfg.SessionTimeout, HeartbeatInterval: cfg.HeartbeatInterval,
	},
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
		kgo.WithLogger(kgoLogger{log}),
	)
	opts = append(opts, cfg.KgoOptions...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("mailsync: consumer: %w", err)
	}
	return cl, nil
}

// newTierReader reads sync.tier partitions from the given offsets, committed
// records and control records (so that "to the end" sees every offset).
func newTierReader(kcfg kafka.Config, log *slog.Logger, offsets map[int32]kgo.Offset) (*kgo.Client, error) {
	return kgo.NewClient(append(kafka.ConnOptions(kcfg),
		kgo.ClientID(kcfg.ClientID+"-tiers"),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topics.SyncTier: offsets}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100*time.Millisecond), kgo.WithLogger(kgoLogger{log}))...)
}

// newUserReader reads every partition of the user topic from since on, as
// a plain consumer.
func newUserReader(kcfg kafka.Config, log *slog.Logger, since time.Time) (*kgo.Client, error) {
	return kgo.NewClient(append(kafka.ConnOptions(kcfg),
		kgo.ClientID(kcfg.ClientID+"-users"),
		kgo.ConsumeTopics(topics.UserEvents),
		kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(since.UnixMilli())),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(500*time.Millisecond),
		kgo.MetadataMinAge(250*time.Millisecond),
		kgo.WithLogger(kgoLogger{log}),
	)...)
}

// newRelay is the worker's own outbox relay (its producer is built by
// package outbox).
func newRelay(pool *pgxpool.Pool, kcfg kafka.Config, log *slog.Logger, reg prometheus.Registerer) *outbox.Relay {
	rcfg := kcfg.WithClientID(kcfg.ClientID + "-outbox")
	return outbox.NewRelay(pool, rcfg, outbox.WithLogger(log.With("component", "outbox-relay")),
		outbox.WithRegisterer(sharedRegisterer{reg}))
}

// sharedRegisterer lets several workers of one process, sharing a
// registerer, each run a relay: package outbox registers with
// MustRegister, and a second relay's metrics are already registered (only
// one relay per database publishes anyway).
type sharedRegisterer struct{ prometheus.Registerer }

// MustRegister registers cs, accepting collectors already registered and
// panicking on a real conflict, as promreg.MustRegister does.
func (r sharedRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		promreg.MustRegister(r.Registerer, c)
	}
}

// kgoLogger passes franz-go's warnings and errors to slog.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	sl := slog.LevelWarn
	if level == kgo.LogLevelError {
		sl = slog.LevelError
	}
	k.l.Log(context.Background(), sl, "kafka: "+msg, keyvals...)
}
