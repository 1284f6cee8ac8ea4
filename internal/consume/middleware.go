package consume

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/sla"
)

// wrap puts h inside the consumer's policies, outermost first: the meter
// (it sees every poll, retries included), the redrive skip, retry, then
// the consumer's own middleware.
func (c *Consumer) wrap(h Handler) Handler {
	for i := len(c.cfg.mws) - 1; i >= 0; i-- {
		h = c.cfg.mws[i](h)
	}
	if r := c.cfg.retry; r != nil {
		h = retrying(r, h)
	}
	if c.cfg.skipFor != "" {
		h = c.skipRedriven(h)
	}
	if c.cfg.meter != nil && !c.cfg.byEffect {
		h = metered(c.cfg.meter, h)
	}
	return h
}

// metered holds each polled partition at its first record while next
// runs, and moves it past its last once next returned nil (and no
// transaction of the batch aborted: its records come again).
func metered(m *sla.Meter, next Handler) Handler {
	return func(ctx context.Context, b *Batch) error {
		b.Fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				m.Set(p.Topic, p.Partition, sla.Position{Next: p.Records[0].Offset, End: kafka.FetchEnd(p), Oldest: p.Records[0].Timestamp})
			}
		})
		if err := next(ctx, b); err != nil || b.aborted {
			return err
		}
		b.Fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if n := len(p.Records); n > 0 {
				at := p.Records[n-1].Offset + 1
				m.Set(p.Topic, p.Partition, sla.Position{Next: at, End: max(at, kafka.FetchEnd(p))})
			}
		})
		return nil
	}
}

// skipRedriven drops records redriven for another consumer.
func (c *Consumer) skipRedriven(next Handler) Handler {
	return func(ctx context.Context, b *Batch) error {
		kept := b.Records[:0:0]
		for _, r := range b.Records {
			if dlq.ForOtherConsumer(r, c.cfg.skipFor) {
				c.m.skipped.Inc()
				continue
			}
			kept = append(kept, r)
		}
		b.Records = kept
		return next(ctx, b)
	}
}

// retrying calls next again with backoff while it fails.
func retrying(r *retryPolicy, next Handler) Handler {
	return func(ctx context.Context, b *Batch) error {
		return backoff.Retry(ctx, r.p, r.onRetry, func(ctx context.Context) error { return next(ctx, b) })
	}
}
