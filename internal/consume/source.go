package consume

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
)

type sourceKind int

const (
	kindGroup sourceKind = iota + 1
	kindTransactGroup
	kindPartitions
	kindTopics
)

// Source is where a consumer reads: Group, TransactGroup, Partitions or
// Topics. See the package doc.
type Source struct {
	kind    sourceKind
	group   kafka.GroupConfig
	offsets map[string]map[int32]kgo.Offset
	topics  []string
	from    kgo.Offset
}

// Group reads g's topics as a member of g's group (the name as the broker
// knows it: kafka.Config.Group), blocking rebalances while a batch is
// handled.
func Group(g kafka.GroupConfig) Source { return Source{kind: kindGroup, group: g} }

// TransactGroup reads g's topics as a member of g's group through a
// kgo.GroupTransactSession; WithKgoOptions must carry the transactional
// id and the producer settings (kgo.TransactionalID and friends).
func TransactGroup(g kafka.GroupConfig) Source {
	return Source{kind: kindTransactGroup, group: g}
}

// Partitions reads the given partitions from the given offsets, without a
// group.
func Partitions(offsets map[string]map[int32]kgo.Offset) Source {
	return Source{kind: kindPartitions, offsets: offsets}
}

// Topics reads every partition of topics from the offset from (say
// kgo.NewOffset().AfterMilli(ms)), without a group.
func Topics(from kgo.Offset, topics ...string) Source {
	return Source{kind: kindTopics, topics: topics, from: from}
}

func (s Source) validate() error {
	switch s.kind {
	case kindGroup, kindTransactGroup:
		if s.group.Group == "" || len(s.group.Topics) == 0 {
			return errors.New("consume: a group source needs a group and topics")
		}
	case kindPartitions:
		if len(s.offsets) == 0 {
			return errors.New("consume: a partitions source needs partitions")
		}
	case kindTopics:
		if len(s.topics) == 0 {
			return errors.New("consume: a topics source needs topics")
		}
	default:
		return errors.New("consume: no source")
	}
	return nil
}

// connect builds the consumer's client with the kit.
func (c *Consumer) connect(kcfg kafka.Config) error {
	switch c.src.kind {
	case kindGroup:
		opts := append([]kgo.Opt{kgo.BlockRebalanceOnPoll()}, c.callbacks()...)
		cl, err := kafka.NewConsumer(kcfg, c.src.group, append(opts, c.cfg.kgoOpts...)...)
		c.cl = cl
		return err
	case kindTransactGroup:
		sess, err := kafka.NewGroupTransactSession(kcfg, c.src.group, append(c.callbacks(), c.cfg.kgoOpts...)...)
		if err != nil {
			return err
		}
		c.sess, c.cl = sess, sess.Client()
		return nil
	case kindPartitions:
		opts := []kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumePartitions(c.src.offsets)}
		cl, err := kafka.NewClient(kcfg, kafka.KindReader, append(opts, c.cfg.kgoOpts...)...)
		c.cl = cl
		return err
	default:
		opts := []kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeTopics(c.src.topics...), kgo.ConsumeResetOffset(c.src.from)}
		cl, err := kafka.NewClient(kcfg, kafka.KindReader, append(opts, c.cfg.kgoOpts...)...)
		c.cl = cl
		return err
	}
}

// callbacks are the group's partition callbacks: the meter learns what
// was assigned and forgets what was revoked or lost, then the consumer's
// hooks run.
func (c *Consumer) callbacks() []kgo.Opt {
	return []kgo.Opt{
		kgo.OnPartitionsAssigned(c.callback("assigned", c.own, c.cfg.assigned)),
		kgo.OnPartitionsRevoked(c.callback("revoked", c.forget, c.cfg.revoked)),
		kgo.OnPartitionsLost(c.callback("lost", c.forget, c.cfg.lost)),
	}
}

// callback is one partition callback: it waits until New has returned,
// counts the event, lets the meter track the change, then runs hooks.
func (c *Consumer) callback(event string, track func(map[string][]int32), hooks []PartitionsFunc) func(context.Context, *kgo.Client, map[string][]int32) {
	return func(ctx context.Context, _ *kgo.Client, m map[string][]int32) {
		<-c.ready
		c.m.rebalances.WithLabelValues(c.name, event).Inc()
		track(m)
		for _, fn := range hooks {
			fn(ctx, c, m)
		}
	}
}
