package projections

// The dedupe window: how long applied_events remembers an event id.
//
// Two layers keep an event from being applied twice:
//
//   - By position. A partition's next_offset (projector_offsets) moves in
//     the same transaction as the rows its records produced, and a
//     projector reads a partition from there: a record below it is never
//     applied again, however it is redelivered (a restart, a rebalance, a
//     crash before the Kafka commit). That holds for ever.
//   - By id. A copy of an event at a new offset (a producer's retry, a
//     client resending to the ingest API, a dead letter redriven twice) is
//     past the position, so only its id can refuse it: applied_events
//     holds the id of every event applied, in the same transaction.
//
// The ids are kept for a window W (default DefaultDedupeWindow, as
// mailbox.state's processor; WithDedupeWindow), counted on the projector's
// clock from when the id was applied. A copy applied within W of its
// original is refused by id; a later one is applied again, as in
// mailbox.state. W must therefore cover the longest a producer retries or
// a dead letter waits for its redrive (docs/capacity.md).
//
// Forgetting ids must not weaken the first layer for a seek back (Seek,
// `mailplane projector seek`), which moves a position back on purpose and
// relies on the ids to refuse what it re-reads. So ids are pruned only
// below a floor: each prune first marks where every partition stands
// (applied_event_marks; Seek marks where a partition stood before it moved
// back), then, for the newest mark M at least W old, raises each
// partition's forgotten_below to the highest offset marked up to M, and
// only then deletes the ids applied before M less a slack (twice the
// transaction timeout, so that every transaction stamped before it had
// committed by M). A record below forgotten_below has been applied and may
// have lost its id; the position may not go below it (a check on
// projector_offsets; Seek says so), and if a seek back already took it
// there, the prune moves the position up to the floor, so the projector
// skips forward instead of applying those records again. Within the window
// a seek back re-reads and every re-read event is refused by id.
//
// The prune runs in the projector (one member at a time: an advisory lock
// per projector), when Run starts and every W/16 after, deleting in
// batches of pruneBatch ids, each batch its own short transaction, so it
// never holds locks the projector's transactions wait for. Deletes walk
// the applied_at index from its oldest end.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultDedupeWindow is how long a projector remembers an applied event's
// id unless WithDedupeWindow says otherwise: the window of mailbox.state's
// processor (internal/mailboxstate), for the same producers.
const DefaultDedupeWindow = 7 * 24 * time.Hour

// pruneBatch is the most ids one delete removes.
const pruneBatch = 10_000

// WithDedupeWindow sets how long applied event ids are remembered (see
// the dedupe rule in dedupe.go). Zero or less keeps the default.
func WithDedupeWindow(d time.Duration) Option { return func(c *config) { c.dedupeWindow = d } }

// pruneEvery is how often Run prunes: a sixteenth of the window.
func (c *config) pruneEvery() time.Duration { return max(c.dedupeWindow/16, time.Millisecond) }

// pruneSlack is how long before a mark an id must have been applied to be
// pruned with it: a transaction stamped then has committed by the mark.
func (c *config) pruneSlack() time.Duration { return 2 * c.txTimeout }

const (
	pruneLockSQL = `SELECT pg_try_advisory_xact_lock(hashtextextended('mailplane.applied_events.' || $1, 0))`

	markSQL = `INSERT INTO applied_event_marks (projector, topic, partition, marked_at, next_offset)
SELECT projector, topic, partition, $2, next_offset FROM projector_offsets WHERE projector = $1
ON CONFLICT (projector, marked_at, topic, partition) DO UPDATE SET next_offset = GREATEST(applied_event_marks.next_offset, EXCLUDED.next_offset)`

	newestOldMarkSQL = `SELECT max(marked_at) FROM applied_event_marks WHERE projector = $1 AND marked_at <= $2`

	// The floor is the highest offset marked up to the mark; a position a
	// seek left below it moves up to it (the projector sees its fence
	// move and skips forward).
	raiseFloorSQL = `UPDATE projector_offsets AS o
SET forgotten_below = GREATEST(o.forgotten_below, m.high),
    next_offset = GREATEST(o.next_offset, m.high),
    updated_at = CASE WHEN o.next_offset < m.high THEN $3 ELSE o.updated_at END
FROM (SELECT topic, partition, max(next_offset) AS high FROM applied_event_marks
      WHERE projector = $1 AND marked_at <= $2 GROUP BY topic, partition) AS m
WHERE o.projector = $1 AND o.topic = m.topic AND o.partition = m.partition
  AND (o.forgotten_below < m.high OR o.next_offset < m.high)`

	dropMarksSQL = `DELETE FROM applied_event_marks WHERE projector = $1 AND marked_at <= $2`

	pruneIDsSQL = `DELETE FROM applied_events WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM applied_events WHERE projector = $1 AND applied_at < $2 ORDER BY applied_at LIMIT $3))`
)

// Pruned is what one prune did.
type Pruned struct {
	// Skipped: another member of the projector was pruning.
	Skipped bool
	// Before is the time before which ids were forgotten (zero: no mark
	// was old enough yet, nothing was forgotten).
	Before time.Time
	// IDs is how many ids were deleted.
	IDs int64
}

// Prune marks where the projector's partitions stand and forgets the event
// ids applied more than the dedupe window ago, raising the partitions'
// floors first (see the rule in dedupe.go). Run prunes by itself; Prune is
// for tools and tests. It is safe while the projector runs, from any
// member: one prunes at a time, the others skip.
func (p *Projector) Prune(ctx context.Context) (Pruned, error) {
	now := p.cfg.now().UTC()
	var res Pruned
	var mark time.Time
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, pruneLockSQL, p.name).Scan(&locked); err != nil {
			return err
		}
		if !locked {
			res.Skipped = true
			return nil
		}
		if _, err := tx.Exec(ctx, markSQL, p.name, now); err != nil {
			return fmt.Errorf("mark positions: %w", err)
		}
		var m *time.Time
		if err := tx.QueryRow(ctx, newestOldMarkSQL, p.name, now.Add(-p.cfg.dedupeWindow)).Scan(&m); err != nil {
			return fmt.Errorf("find a mark: %w", err)
		}
		if m == nil {
			return nil
		}
		mark = *m
		if _, err := tx.Exec(ctx, raiseFloorSQL, p.name, mark, now); err != nil {
			return fmt.Errorf("raise floors: %w", err)
		}
		if _, err := tx.Exec(ctx, dropMarksSQL, p.name, mark); err != nil {
			return fmt.Errorf("drop marks: %w", err)
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("projections: prune %s: %w", p.name, err)
	}
	if res.Skipped || mark.IsZero() {
		return res, nil
	}
	// The floors are committed: the ids below them may go. A mark taken
	// in an earlier prune whose deletes were cut short is older than this
	// one, so what it left is deleted now.
	res.Before = mark.Add(-p.cfg.pruneSlack())
	for {
		tag, err := p.pool.Exec(ctx, pruneIDsSQL, p.name, res.Before, pruneBatch)
		if err != nil {
			return res, fmt.Errorf("projections: prune %s: delete ids: %w", p.name, err)
		}
		n := tag.RowsAffected()
		res.IDs += n
		p.m.pruned.WithLabelValues(p.name).Add(float64(n))
		if n < pruneBatch {
			return res, nil
		}
	}
}

// pruneLoop prunes when Run starts and every pruneEvery until ctx is done.
func (p *Projector) pruneLoop(ctx context.Context) {
	t := time.NewTicker(p.cfg.pruneEvery())
	defer t.Stop()
	for {
		res, err := p.Prune(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			p.log.Warn("pruning applied event ids failed; trying again later", "err", err)
		case res.IDs > 0:
			p.log.Info("pruned applied event ids", "ids", res.IDs, "applied_before", res.Before)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ErrBelowFloor is returned by Seek for a position below the partition's
// forgotten_below: those records were applied, and their ids may be
// forgotten (older than the dedupe window), so reading them again could
// apply them twice.
var ErrBelowFloor = errors.New("projections: the records below this offset were applied longer ago than the dedupe window; their ids are forgotten, so reading them again could apply them twice (rebuild the projection instead)")
