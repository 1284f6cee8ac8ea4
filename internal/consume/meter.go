package consume

import (
	"github.com/mailplane/mailplane/internal/sla"
)

// The runtime's part of the lag meter (Metered, MeteredByEffect): which
// partitions the meter may hear of, and forgetting those the consumer no
// longer owns. Only this package and internal/sla set and forget a
// meter's positions (a conventions test keeps it so).

type topicPartition struct {
	topic     string
	partition int32
}

// meterState is what the meter may hear of, guarded by Consumer.meterMu.
type meterState struct {
	// owned are a group's partitions, between their assignment and
	// their revocation or loss (group sources only: the other sources
	// own what they read).
	owned map[topicPartition]bool
	// left: Run ended and the meter forgot every partition; later
	// reports are ignored.
	left bool
}

// Position reports where the effect of a MeteredByEffect consumer stands
// on a partition it owns: pos.Next is the first offset the effect has not
// made durable, pos.End the partition's end as last known (Batch.End),
// pos.Oldest the append time of the record at Next if the consumer holds
// it. It is ignored for a partition a group revoked or took away (the
// report came late), after Run ended, and on a consumer that is not
// MeteredByEffect. Safe from the handler, partition callbacks and other
// goroutines.
func (c *Consumer) Position(topic string, partition int32, pos sla.Position) {
	if c.cfg.meter == nil || !c.cfg.byEffect {
		return
	}
	c.meterMu.Lock()
	defer c.meterMu.Unlock()
	if c.ms.left || c.group() && !c.ms.owned[topicPartition{topic, partition}] {
		return
	}
	c.cfg.meter.Set(topic, partition, pos)
}

func (c *Consumer) group() bool {
	return c.src.kind == kindGroup || c.src.kind == kindTransactGroup
}

// own records a group's assignment, before the consumer's hooks run
// (they may report positions).
func (c *Consumer) own(m map[string][]int32) {
	c.meterMu.Lock()
	defer c.meterMu.Unlock()
	if c.ms.owned == nil {
		c.ms.owned = map[topicPartition]bool{}
	}
	for t, ps := range m {
		for _, p := range ps {
			c.ms.owned[topicPartition{t, p}] = true
		}
	}
}

// forget drops partitions revoked or lost, before the consumer's hooks
// run.
func (c *Consumer) forget(m map[string][]int32) {
	c.meterMu.Lock()
	defer c.meterMu.Unlock()
	for t, ps := range m {
		for _, p := range ps {
			delete(c.ms.owned, topicPartition{t, p})
			if c.cfg.meter != nil {
				c.cfg.meter.Forget(t, p)
			}
		}
	}
}

// forgetAll drops every partition when Run ends.
func (c *Consumer) forgetAll() {
	c.meterMu.Lock()
	defer c.meterMu.Unlock()
	c.ms.left, c.ms.owned = true, nil
	if c.cfg.meter != nil {
		c.cfg.meter.ForgetAll()
	}
}
