package applyonce

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
// The ids are kept for a window W (default projections.DefaultDedupeWindow, as
// mailbox.state's processor; projections.WithDedupeWindow), counted on the projector's
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
// committed by M; the members' clocks must agree to within that slack,
// as NTP keeps them). A record below forgotten_below has been applied and may
// have lost its id; the position may not go below it (a check on
// projector_offsets; Seek says so), and if a seek back already took it
// there, the prune moves the position up to the floor, so the projector
// skips forward instead of applying those records again. Within the window
// a seek back re-reads and every re-read event is refused by id.
//
// The prune runs in the projector (one member at a time: an advisory lock
// per projector), when its Run starts and every W/16 after, deleting in
// batches of PruneBatch ids, each batch its own short transaction. It
// never waits for a lock a projector transaction holds: it raises the
// floors of the offset rows no transaction holds (SKIP LOCKED) and comes
// back for the others, and deletes ids only once every floor is raised.
// Deletes walk the applied_at index from its oldest end.

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PruneBatch is the most ids one delete removes.
const PruneBatch = 10_000

const (
	// One lock per projector and schema: a rebuild's schema in the same
	// database prunes on its own.
	pruneLockSQL   = `SELECT pg_try_advisory_lock(hashtextextended('mailplane.applied_events.' || current_schema() || '.' || $1, 0))`
	pruneUnlockSQL = `SELECT pg_advisory_unlock(hashtextextended('mailplane.applied_events.' || current_schema() || '.' || $1, 0))`

	markSQL = `INSERT INTO applied_event_marks (projector, topic, partition, marked_at, next_offset)
SELECT projector, topic, partition, $2, next_offset FROM projector_offsets WHERE projector = $1
ON CONFLICT (projector, marked_at, topic, partition) DO UPDATE SET next_offset = GREATEST(applied_event_marks.next_offset, EXCLUDED.next_offset)`

	newestOldMarkSQL = `SELECT max(marked_at) FROM applied_event_marks WHERE projector = $1 AND marked_at <= $2`

	// highs is each partition's highest offset marked up to the mark ($2);
	// stale are the offset rows below it.
	highsSQL = `WITH highs AS (SELECT topic, partition, max(next_offset) AS high FROM applied_event_marks
    WHERE projector = $1 AND marked_at <= $2 GROUP BY topic, partition)`
	staleSQL = `SELECT o.topic, o.partition, h.high FROM projector_offsets AS o JOIN highs AS h USING (topic, partition)
    WHERE o.projector = $1 AND (o.forgotten_below < h.high OR o.next_offset < h.high)`

	// The floor rises to the high; a position a seek left below it moves
	// up to it (the projector sees its fence move and skips forward).
	// Rows a projector transaction holds are skipped, never waited for:
	// the prune tries them again shortly.
	raiseFloorSQL = highsSQL + `, stale AS (` + staleSQL + ` FOR UPDATE OF o SKIP LOCKED)
UPDATE projector_offsets AS o
SET forgotten_below = GREATEST(o.forgotten_below, s.high),
    next_offset = GREATEST(o.next_offset, s.high),
    updated_at = CASE WHEN o.next_offset < s.high THEN $3 ELSE o.updated_at END
FROM stale AS s
WHERE o.projector = $1 AND o.topic = s.topic AND o.partition = s.partition`

	countStaleSQL = highsSQL + ` SELECT count(*) FROM (` + staleSQL + `) AS s`

	dropMarksSQL = `DELETE FROM applied_event_marks WHERE projector = $1 AND marked_at <= $2`

	pruneIDsSQL = `DELETE FROM applied_events WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM applied_events WHERE projector = $1 AND applied_at < $2 ORDER BY applied_at LIMIT $3))`
)

// raiseTries bounds how often one prune tries the offset rows that
// projector transactions held, raiseWait apart, before it leaves the ids
// for the next prune.
const (
	raiseTries = 100
	raiseWait  = 20 * time.Millisecond
)

// Pruned is what one prune did.
type Pruned struct {
	// Skipped: another member of the projector was pruning.
	Skipped bool
	// Before is the time before which ids were forgotten (zero: no mark
	// was old enough yet, or the floors could not all be raised: nothing
	// was forgotten).
	Before time.Time
	// IDs is how many ids were deleted.
	IDs int64
}

// Window is what a prune needs to know: whose ids, how long they are
// remembered, and the clock.
type Window struct {
	// Projector names the ids and positions.
	Projector string
	// Window is how long an id is remembered.
	Window time.Duration
	// Slack is how long before a mark an id must have been applied to be
	// pruned with it: a transaction stamped then has committed by the
	// mark (the projector's: twice its transaction timeout).
	Slack time.Duration
	// Now is the projector's clock.
	Now time.Time
	// Logger logs a prune left for later. Default: discard.
	Logger *slog.Logger
	// Deleted, when set, is told how many ids each delete removed.
	Deleted func(n int64)
}

// Prune marks where w.Projector's partitions stand and forgets the event
// ids applied more than the window ago, raising the partitions' floors
// first (see the rule above). It is safe while the projector runs, from
// any member: one prunes at a time (an advisory lock), the others skip.
func Prune(ctx context.Context, pool *pgxpool.Pool, w Window) (Pruned, error) {
	if w.Logger == nil {
		w.Logger = slog.New(slog.DiscardHandler)
	}
	return prune(ctx, pool, w)
}

func prune(ctx context.Context, pool *pgxpool.Pool, w Window) (res Pruned, err error) {
	now := w.Now.UTC()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return res, err
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, pruneLockSQL, w.Projector).Scan(&locked); err != nil {
		return res, err
	}
	if !locked {
		res.Skipped = true
		return res, nil
	}
	defer func() {
		// A session lock outlives an error; a connection that cannot
		// unlock is closed, which unlocks.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, uerr := conn.Exec(uctx, pruneUnlockSQL, w.Projector); uerr != nil {
			_ = conn.Conn().Close(uctx)
		}
	}()
	if _, err := conn.Exec(ctx, markSQL, w.Projector, now); err != nil {
		return res, fmt.Errorf("mark positions: %w", err)
	}
	var m *time.Time
	if err := conn.QueryRow(ctx, newestOldMarkSQL, w.Projector, now.Add(-w.Window)).Scan(&m); err != nil {
		return res, fmt.Errorf("find a mark: %w", err)
	}
	if m == nil {
		return res, nil
	}
	mark := *m
	for try := 0; ; try++ {
		if _, err := conn.Exec(ctx, raiseFloorSQL, w.Projector, mark, now); err != nil {
			return res, fmt.Errorf("raise floors: %w", err)
		}
		var stale int
		if err := conn.QueryRow(ctx, countStaleSQL, w.Projector, mark).Scan(&stale); err != nil {
			return res, fmt.Errorf("raise floors: %w", err)
		}
		if stale == 0 {
			break
		}
		if try+1 == raiseTries {
			w.Logger.Info("offset rows stayed locked; pruning applied event ids later", "rows", stale)
			return res, nil
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(raiseWait):
		}
	}
	if _, err := conn.Exec(ctx, dropMarksSQL, w.Projector, mark); err != nil {
		return res, fmt.Errorf("drop marks: %w", err)
	}
	// The floors are committed: the ids below them may go. A mark taken
	// in an earlier prune whose deletes were cut short is older than this
	// one, so what it left is deleted now.
	res.Before = mark.Add(-w.Slack)
	for {
		tag, err := conn.Exec(ctx, pruneIDsSQL, w.Projector, res.Before, PruneBatch)
		if err != nil {
			return res, fmt.Errorf("delete ids: %w", err)
		}
		n := tag.RowsAffected()
		res.IDs += n
		if w.Deleted != nil {
			w.Deleted(n)
		}
		if n < PruneBatch {
			return res, nil
		}
	}
}
