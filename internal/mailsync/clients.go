package mailsync

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/consume"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/internal/sla"
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

// groupCallbacks are the consumer group's rebalance callbacks, the
// watchdog's hook and what the runtime runs before leaving.
type groupCallbacks struct {
	assigned, revoked, lost consume.PartitionsFunc
	hook                    kgo.Hook
	beforeLeave             func()
}

// leaveTimeout bounds the leave at shutdown (consume.LeaveWithin).
const leaveTimeout = 5 * time.Second

// newGroupConsumer is the member of the sync group on mailbox.state, on
// the consumer runtime: it blocks rebalances while a poll's records are
// applied (records reach handle only for partitions it owns, and rebalance
// callbacks never run meanwhile), and handle runs at least every 250 ms
// for housekeeping (sooner on Wake).
func newGroupConsumer(kcfg kafka.Config, cfg Config, log *slog.Logger, cb groupCallbacks, lag *sla.Meter, handle consume.Handler) (*consume.Consumer, error) {
	opts := []kgo.Opt{
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
	c, err := consume.New(kcfg, string(sla.Sync), consume.Group(kafka.GroupConfig{
		Group: cfg.Group, Topics: []string{kcfg.Topic(topics.MailboxState)},
		SessionTimeout: cfg.SessionTimeout, HeartbeatInterval: cfg.HeartbeatInterval,
	}), handle,
		consume.WithKgoOptions(append(opts, cfg.KgoOptions...)...),
		consume.OnAssigned(cb.assigned), consume.OnRevoked(cb.revoked), consume.OnLost(cb.lost),
		consume.WithPollWait(250*time.Millisecond), consume.WithMaxRecords(20000),
		// The position is the live set's (measureLocked), which reads
		// each partition from its start.
		consume.MeteredByEffect(lag),
		// The revoke in the leave stops the runners first; when the
		// leave waits on the coordinator (a JoinGroup it holds for a
		// rebalance), the runners are stopped after the bound instead,
		// and the fence keeps whatever they might still write from
		// landing (a process stopping must be gone within its grace
		// period).
		consume.BeforeLeave(cb.beforeLeave), consume.LeaveWithin(min(cfg.RebalanceTimeout, leaveTimeout)),
		consume.WithLogger(log), consume.WithRegisterer(cfg.Registerer))
	if err != nil {
		return nil, fmt.Errorf("mailsync: consumer: %w", err)
	}
	return c, nil
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
