package projections

import (
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/applyonce"
	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/sla"
)

// partition is the poll loop's state for one assigned partition, guarded
// by session.mu.
type partition struct {
	topic string
	id    int32

	// next is the partition's offset in Postgres as last seen: the first
	// record not yet applied, and the value the next transaction expects
	// to find in the offset row. -1 until adjustOffsets reads it.
	next int64
	// queue holds fetched records from next on, decoded, in offset order,
	// until a transaction applies them.
	queue []*item
	hwm   int64
	// fetched is the offset after the last record accepted (0: none
	// yet). Like queue and incoming, accept writes it; unlike next, no
	// lane moves it while applying.
	fetched int64
	paused  bool
	// busy: a lane holds the partition (see drain); records polled
	// meanwhile wait in incoming; held is how many were queued when the
	// lane took it (the lane moves the queue meanwhile). All guarded by
	// session.qmu.
	busy     bool
	held     int
	incoming []*item

	// A partition whose transaction failed is failing until one succeeds:
	// it is applied alone, and not before retryAt, so that it holds up no
	// other partition. backoff paces its failures in a row, from floor
	// (RetryPolicy.Backoff) doubling up to RetryPolicy.MaxBackoff; nil
	// until its first failure.
	retryAt time.Time
	floor   time.Duration
	backoff *backoff.Backoff
	// tries counts the refusals of the record the projection refused when
	// applied alone, the suspect (applyonce.Isolate).
	tries applyonce.Tries
}

func newPartition(topic string, id int32, backoff time.Duration) *partition {
	return &partition{topic: topic, id: id, next: -1, hwm: -1, floor: backoff}
}

// restart makes next the partition's position, as Postgres says: records
// queued from elsewhere are dropped, and so is the failure state that came
// with them.
func (pt *partition) restart(next int64, backoff time.Duration) {
	pt.next = next
	pt.queue, pt.incoming = nil, nil
	pt.healthy(backoff)
	pt.tries.Reset()
}

// enqueue queues a fetched record, unless Postgres already covers it (a
// fence moved us forward) or it is queued already.
func (pt *partition) enqueue(it *item) {
	if off := it.rec.Offset; off < pt.next || len(pt.queue) > 0 && off <= pt.queue[len(pt.queue)-1].rec.Offset {
		return
	}
	pt.queue = append(pt.queue, it)
}

// release hands a partition back from a lane and queues what was polled
// for it meanwhile.
func (pt *partition) release() {
	pt.busy = false
	for _, it := range pt.incoming {
		pt.enqueue(it)
	}
	pt.incoming = nil
}

func (pt *partition) failing() bool { return !pt.retryAt.IsZero() }

// due reports whether a failing partition should be tried again.
func (pt *partition) due(now time.Time) bool {
	return pt.failing() && len(pt.queue) > 0 && !now.Before(pt.retryAt)
}

// retryLater marks the partition failing and schedules its next attempt,
// waiting through internal/backoff with half jitter: the partitions of
// every projector fail together when their Postgres does, and should not
// retry in step.
func (pt *partition) retryLater(maxBackoff time.Duration) time.Duration {
	if pt.backoff == nil {
		pt.backoff = backoff.New(backoff.Policy{Floor: pt.floor, Cap: maxBackoff, Jitter: backoff.Half}, nil)
	}
	wait := pt.backoff.Next()
	pt.retryAt = time.Now().Add(wait)
	return wait
}

// healthy ends a failure: the partition joins shared batches again, and
// its next failure waits floor.
func (pt *partition) healthy(floor time.Duration) {
	pt.retryAt = time.Time{}
	if pt.backoff != nil && pt.floor == floor {
		pt.backoff.Reset()
	} else {
		pt.floor, pt.backoff = floor, nil
	}
}

// advance records that Postgres now holds next, and drops what it covers.
func (pt *partition) advance(next int64) {
	pt.next = next
	i := 0
	for i < len(pt.queue) && pt.queue[i].rec.Offset < next {
		i++
	}
	pt.queue = pt.queue[i:]
	if len(pt.queue) == 0 {
		pt.queue = nil
	}
	pt.tries.Passed(next)
}

// retryBatch is what a failing partition applies alone: up to n records,
// and never past a suspect, which is retried on its own.
func (pt *partition) retryBatch(n int) []*item {
	q := pt.queue[:min(n, len(pt.queue))]
	if suspect, ok := pt.tries.Suspect(); ok {
		if i := slices.IndexFunc(q, func(it *item) bool { return it.rec.Offset > suspect }); i >= 0 {
			q = q[:i]
		}
	}
	return slices.Clone(q)
}

// position is the partition's lag as the consumer's meter takes it: the
// oldest record not yet applied is the head of its queue (or of incoming,
// when a lane held it), if fetched.
func (pt *partition) position() sla.Position {
	pos := sla.Position{Next: pt.next, End: pt.hwm}
	for _, q := range [][]*item{pt.queue, pt.incoming} {
		if len(q) > 0 {
			pos.Oldest = q[0].rec.Timestamp
			break
		}
	}
	return pos
}

// item is one fetched record, decoded or not.
type item struct {
	pt   *partition
	rec  *kgo.Record
	ev   domain.Event
	id   [16]byte    // ev.ID
	ok   bool        // decoded
	code domain.Code // why not, when !ok
	err  error       // when !ok
	// dead: the record is in the DLQ, having failed to decode or to apply;
	// its offset may be passed.
	dead bool
	// other: a record redriven for another consumer; its offset is passed
	// and nothing applied.
	other bool
}

func (it *item) live() bool { return it.ok && !it.dead }
