package consume

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
)

// Batch is what one poll brought.
type Batch struct {
	// Records are the records polled, in fetch order (each partition's
	// in offset order), less those a policy skipped (SkipRedriven).
	Records []*kgo.Record
	// Fetches are the poll's fetches, skipped records included: what
	// positions count.
	Fetches kgo.Fetches
	// Polled is when the poll returned, on the consumer's clock.
	Polled time.Time

	c *Consumer
	// aborted says a Transact of the batch did not commit: its records
	// are polled again, so the meter does not count them applied.
	aborted bool
}

// Consumer returns the consumer the batch was polled by.
func (b *Batch) Consumer() *Consumer { return b.c }

// End returns a fetched partition's end as this poll fetched it
// (kafka.FetchEnd: the last stable offset when reading committed), or -1
// when the poll did not fetch it.
func (b *Batch) End(topic string, partition int32) int64 {
	end := int64(-1)
	b.Fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if p.Topic == topic && p.Partition == partition {
			end = max(end, kafka.FetchEnd(p))
		}
	})
	return end
}

// Ends returns the end of every partition the poll fetched (see End).
func (b *Batch) Ends() map[string]map[int32]int64 {
	out := map[string]map[int32]int64{}
	b.Fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if out[p.Topic] == nil {
			out[p.Topic] = map[int32]int64{}
		}
		e, ok := out[p.Topic][p.Partition]
		if !ok {
			e = -1
		}
		out[p.Topic][p.Partition] = max(e, kafka.FetchEnd(p))
	})
	return out
}

// errNotTransactional is Transact's error on a source without a session.
var errNotTransactional = errors.New("consume: Transact needs a TransactGroup source")

// Transact runs fn in a Kafka transaction of a TransactGroup consumer's
// session; the commit carries the offsets polled so far, so the
// transaction's records and the input positions commit together. fn's
// error aborts it (and is returned); a rebalance since the poll or a
// failed offset commit aborts it too (committed false, no error). After an
// abort the session rewinds to the last committed offsets: the records are
// polled again. An error from ending the transaction is not retryable:
// end the session.
func (b *Batch) Transact(ctx context.Context, fn func(ctx context.Context) error) (committed bool, err error) {
	var ferr error
	committed, err = b.TransactTry(ctx, func(ctx context.Context) kgo.TransactionEndTry {
		ferr = fn(ctx)
		return kgo.TransactionEndTry(ferr == nil)
	})
	if ferr != nil {
		return false, errors.Join(ferr, err)
	}
	return committed, err
}

// TransactTry is Transact for a handler that judges its own failures: fn
// returns kgo.TryCommit to commit (the offsets polled with it) or
// kgo.TryAbort to abort (a produce failed: the records are polled again),
// and err is only beginning's or ending's error, never fn's. The placement
// engine and the mailbox.state processor count an abort they asked for
// apart from an end that failed (which ends their session).
func (b *Batch) TransactTry(ctx context.Context, fn func(ctx context.Context) kgo.TransactionEndTry) (committed bool, err error) {
	sess := b.c.sess
	if sess == nil {
		return false, errNotTransactional
	}
	if err := sess.Begin(); err != nil {
		return false, err
	}
	try := fn(ctx)
	committed, err = sess.End(ctx, try)
	if !committed {
		b.aborted = true
		b.c.m.aborts.Inc()
	}
	return committed, err
}
