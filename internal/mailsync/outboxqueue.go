package mailsync

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/topics"
)

// Writes of the outbox queue.
const (
	// maxWriteRecords bounds the records of one outbox transaction, so a
	// burst of tier changes (a partition's first evaluation) does not hold
	// its epoch row for long.
	maxWriteRecords = 1000
	// writeTimeout bounds one outbox transaction.
	writeTimeout = 10 * time.Second
	// dropFlushTimeout bounds the flush a revoke or loss makes before
	// its callback returns.
	dropFlushTimeout = 5 * time.Second
)

// pendingWrite is one entry of the outbox queue: a tier record (or
// tombstone) with its tier_changed event, decided under an epoch and written
// only if that epoch is still the partition's; or, with epoch 0, an
// ownership event (lost, suspended), history that is true whatever the
// epoch and written unfenced.
type pendingWrite struct {
	partition int32
	epoch     int64           // 0: not fenced
	mailboxID string          // a tier write's mailbox
	from, to  domain.SyncTier // a tier write's change; to is empty for a tombstone
	recs      []*kgo.Record
}

// outboxQueue holds the worker's tier records and ownership events until
// they are written to the transactional outbox (package outbox), in order;
// its loop writes them, retrying while the database fails.
type outboxQueue struct {
	pool  *pgxpool.Pool
	fence *Fence
	owner string
	log   *slog.Logger
	// fenced is told of tier writes the fence refused at epoch.
	fenced func(partition int32, epoch int64, items []pendingWrite, err error)

	mu       sync.Mutex
	pending  []pendingWrite
	kick     chan struct{}
	flushing chan struct{} // held by the one flush running
}

func newOutboxQueue(pool *pgxpool.Pool, fence *Fence, owner string, log *slog.Logger) *outboxQueue {
	return &outboxQueue{pool: pool, fence: fence, owner: owner, log: log,
		kick: make(chan struct{}, 1), flushing: make(chan struct{}, 1)}
}

// add queues pw after everything queued before.
func (q *outboxQueue) add(pw pendingWrite) {
	q.mu.Lock()
	q.pending = append(q.pending, pw)
	q.mu.Unlock()
	kick(q.kick)
}

// addEvent queues an ownership event of partition for sync.audit,
// unfenced, stamped at.
func (q *outboxQueue) addEvent(partition int32, d domain.Data, at time.Time) {
	r, err := encodeRecord(topics.SyncAudit, q.owner, at, d)
	if err != nil {
		q.log.Error("encoding an audit event", "type", d.EventType(), "err", err)
		return
	}
	q.add(pendingWrite{partition: partition, recs: []*kgo.Record{r}})
}

// outboxQueueRetry paces the queue's writes while the database fails:
// from a second to half a minute, half jittered, so that the workers of a
// fleet do not strike a recovering Postgres together.
var outboxQueueRetry = backoff.Policy{Floor: time.Second, Cap: 30 * time.Second, Jitter: backoff.Half}

// loop writes queued tier changes and ownership events to the outbox (see
// flush), retrying with a backoff while the database fails. At the end it
// flushes once more.
func (q *outboxQueue) loop(ctx context.Context) {
	b := backoff.New(outboxQueueRetry, nil)
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
			if err := q.flush(fctx); err != nil {
				q.log.Warn("tier records and ownership events not written at shutdown", "err", err)
			}
			cancel()
			return
		case <-q.kick:
		}
		err := q.flush(ctx)
		if err == nil || ctx.Err() != nil {
			b.Reset()
			continue
		}
		wait := b.Next()
		q.log.Warn("writing tier records to the outbox failed; retrying", "err", err, "retry_in", wait)
		_ = backoff.Sleep(ctx, wait) // ctx done: the next round flushes a last time
		kick(q.kick)
	}
}

// writeGroup is the entries of the queue written in one transaction.
type writeGroup struct {
	partition int32
	epoch     int64
	items     []int // indexes into the batch
	records   int
}

// groupWrites splits batch into transactions: per partition and epoch, up
// to maxWriteRecords records each (the unfenced ownership events of all
// partitions together), in the order of their first entry. groupOf maps
// each entry to its group.
func groupWrites(batch []pendingWrite) (groups []*writeGroup, groupOf []int) {
	open := map[[2]int64]*writeGroup{}
	groupOf = make([]int, len(batch))
	for i, pw := range batch {
		k := [2]int64{int64(pw.partition), pw.epoch}
		if pw.epoch == 0 {
			k = [2]int64{-1, 0} // unfenced: all in one transaction
		}
		g := open[k]
		if g == nil || g.records+len(pw.recs) > maxWriteRecords {
			g = &writeGroup{partition: pw.partition, epoch: pw.epoch}
			open[k] = g
			groups = append(groups, g)
		}
		g.items = append(g.items, i)
		g.records += len(pw.recs)
		groupOf[i] = len(groups) - 1
	}
	return groups, groupOf
}

// flush writes the queue to the outbox, in order, grouped by groupWrites,
// each tier write in a transaction fenced on its epoch
// (Fence.writeRecords), so a change decided under an epoch that is no
// longer current never reaches sync.tier or sync.audit: it is rolled back,
// counted and recorded as a fenced write of kind "tier", and handed to
// fenced (the worker suspends the partition as for a runner's fenced
// write). The outbox relay publishes what was committed.
//
// Per-key order: a key's writes are queued in order, one flush runs at a
// time, groups are written in the order of their first entry, and a
// mailbox's entries of a later epoch are queued after those of an earlier
// one. On an error other than a refusal, what was not written goes back to
// the front of the queue and the error is returned.
func (q *outboxQueue) flush(ctx context.Context) error {
	select {
	case q.flushing <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-q.flushing }()
	q.mu.Lock()
	batch := q.pending
	q.pending = nil
	q.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	groups, groupOf := groupWrites(batch)
	for gi, g := range groups {
		err := q.write(ctx, batch, g)
		switch {
		case err == nil:
		case errors.Is(err, ErrFenced):
			items := make([]pendingWrite, len(g.items))
			for k, i := range g.items {
				items[k] = batch[i]
			}
			q.fenced(g.partition, g.epoch, items, err)
		default:
			var rest []pendingWrite
			for i, pw := range batch {
				if groupOf[i] >= gi {
					rest = append(rest, pw)
				}
			}
			q.mu.Lock()
			q.pending = append(rest, q.pending...)
			q.mu.Unlock()
			return err
		}
	}
	return nil
}

// write writes one group's records in one transaction, fenced on the
// group's epoch unless it is 0.
func (q *outboxQueue) write(ctx context.Context, batch []pendingWrite, g *writeGroup) error {
	recs := make([]*kgo.Record, 0, g.records)
	mailboxID := batch[g.items[0]].mailboxID
	for _, i := range g.items {
		recs = append(recs, batch[i].recs...)
		if batch[i].mailboxID != mailboxID {
			mailboxID = ""
		}
	}
	wctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	if g.epoch == 0 {
		return pgx.BeginFunc(wctx, q.pool, func(tx pgx.Tx) error { return outbox.Add(wctx, tx, recs...) })
	}
	return q.fence.writeRecords(wctx, g.partition, g.epoch, q.owner, mailboxID, recs)
}

// kick wakes the loop reading ch without ever blocking.
func kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Waits for the outbox relay.
const (
	// tierOutboxWait bounds how long a partition being loaded waits for
	// the outbox to publish the sync.tier records committed before its
	// epoch; tierOutboxStall gives up sooner when no relay is publishing.
	tierOutboxWait  = 2 * time.Second
	tierOutboxStall = 500 * time.Millisecond
)

// errRelayStalled: records are waiting in the outbox and no relay is
// publishing (none runs, or the one holding the publishing lock is stuck).
var errRelayStalled = errors.New("no outbox relay is publishing")

// awaitPublished waits until every outbox record of topics committed before
// the call has been published (deleted by a relay, whichever process runs
// it). It gives up when ctx is done, or with errRelayStalled when the
// relay's front (the oldest record of any topic) has not moved for stall.
func awaitPublished(ctx context.Context, pool *pgxpool.Pool, stall time.Duration, topics ...string) error {
	var last int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM event_outbox WHERE topic = ANY($1)`, topics).Scan(&last); err != nil {
		return err
	}
	if last == 0 {
		return nil
	}
	front, moved := int64(-1), time.Now()
	for {
		var (
			left bool
			head int64
		)
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM event_outbox WHERE seq <= $1 AND topic = ANY($2)),
    coalesce((SELECT min(seq) FROM event_outbox), 0)`, last, topics).Scan(&left, &head); err != nil {
			return err
		}
		if !left {
			return nil
		}
		if head != front {
			front, moved = head, time.Now()
		} else if time.Since(moved) >= stall {
			return errRelayStalled
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
