package applyonce

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Batch is one apply-once transaction: the records of some partitions,
// applied together with the move of those partitions' positions and the
// record of their event ids.
type Batch struct {
	// Projector names the positions and ids (its projection's name).
	Projector string
	// Moves are every partition of the batch: the offset its row must
	// hold (0 for the start of the log, where the row may not exist yet)
	// and the offset after its last record.
	Moves Moves
	// IDs are the ids of the records to apply, one per record, the first
	// copy of each event of the batch only (the caller drops the copies
	// within a batch; the ids find those applied by earlier batches).
	IDs [][16]byte
	// Async commits without waiting for the WAL flush: safe for a
	// projection, whose rows and positions commit or vanish together, so
	// a commit lost in a Postgres crash is read from the log again.
	Async bool
	// Now stamps the positions and ids.
	Now time.Time
}

// Apply writes the batch's records in tx. fresh is nil when every record
// of Batch.IDs is new (the common case), else the ids never applied
// before (maybe none): only those records are written.
type Apply func(ctx context.Context, tx pgx.Tx, fresh map[[16]byte]struct{}) error

// ErrFenced says a position row did not hold what the batch expected
// (another member or an operator moved it): nothing was written. Current
// reads what the rows hold.
var ErrFenced = errors.New("projector offsets moved under this member")

// LockTimeout bounds a transaction's wait for a lock. Transactions wait
// for each other only when two members briefly own one partition; a longer
// wait means someone else holds a row (an operator's open transaction, say),
// and the transaction had better fail, so that its partitions are retried
// alone and the others flow meanwhile, than hold the poll loop until the
// transaction timeout.
const LockTimeout = time.Second

var lockTimeoutSQL = fmt.Sprintf("SET LOCAL lock_timeout = %d", LockTimeout.Milliseconds())

const (
	// AsyncCommitSQL is the statement of Batch.Async (exported for the
	// benchmarks that replay the projector's statements).
	AsyncCommitSQL = `SET LOCAL synchronous_commit = off`

	// RecordAppliedSQL records the ids: it is the duplicate check. Nearly
	// every batch is all new events, so the first try is a plain insert,
	// which fails on the primary key if any id was applied before; the
	// transaction is then run again with recordAppliedCheckedSQL, which
	// skips those and returns the others. (ON CONFLICT costs a second
	// index probe per row, over twice the insert.) Exported for the
	// benchmarks that replay the projector's statements.
	RecordAppliedSQL = `INSERT INTO applied_events (projector, event_id, applied_at)
SELECT $1, unnest($2::uuid[]), $3`

	recordAppliedCheckedSQL = `INSERT INTO applied_events (projector, event_id, applied_at)
SELECT $1, unnest($2::uuid[]), $3
ON CONFLICT DO NOTHING
RETURNING event_id`
)

// errAppliedBefore says a batch holds an event applied before.
var errAppliedBefore = errors.New("an event of the batch was applied before")

// Run commits b in one transaction on pool: move every partition's
// position past its records (fenced: ErrFenced), record the event ids
// (which finds those applied before), apply the new ones, commit. An
// error of apply that says the records are at fault (IsPermanent) is
// returned as a *RefusedError, for Isolate to find the record; any other
// is wrapped ("apply: "). ctx bounds the whole.
func Run(ctx context.Context, pool *pgxpool.Pool, b Batch, apply Apply) error {
	err := run(ctx, pool, b, false, apply)
	if errors.Is(err, errAppliedBefore) {
		err = run(ctx, pool, b, true, apply)
	}
	return err
}

// run is one try of Run; checked says whether to expect events applied
// before. Two round trips besides apply's: the statements before it go in
// one.
func run(ctx context.Context, pool *pgxpool.Pool, b Batch, checked bool, apply Apply) (err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	rb := &rollbackOnce{tx: tx}
	defer func() {
		if err != nil {
			rb.rollback(ctx)
		}
	}()
	fromStart := b.Moves.fromStart()
	moved, fresh, err := sendPrologue(ctx, tx, prologue(b, fromStart, checked), b.Async, fromStart.Len() > 0, len(b.IDs) > 0, checked)
	if moved >= 0 && moved != int64(b.Moves.Len()) {
		// The fence, whatever else failed after it.
		rb.rollback(ctx)
		return ErrFenced
	}
	if err != nil {
		return err
	}
	if len(b.IDs) > 0 {
		if err := apply(ctx, tx, fresh); err != nil {
			if err = Refuse(err); errors.As(err, new(*RefusedError)) {
				return err
			}
			return fmt.Errorf("apply: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// rollbackOnce rolls a transaction back at most once.
type rollbackOnce struct {
	tx   pgx.Tx
	done bool
}

func (r *rollbackOnce) rollback(ctx context.Context) {
	if r.done {
		return
	}
	r.done = true
	// The transaction may be broken; bound the rollback so a dead
	// connection cannot hold the loop.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_ = r.tx.Rollback(rctx)
	cancel()
}

// prologue queues the statements before apply: the lock timeout, the
// commit mode, the position moves and the applied event ids.
func prologue(b Batch, fromStart Moves, checked bool) *pgx.Batch {
	batch := &pgx.Batch{}
	batch.Queue(lockTimeoutSQL)
	if b.Async {
		// It saves a WAL flush per transaction, which bounds small
		// transactions at a steady rate.
		batch.Queue(AsyncCommitSQL)
	}
	now := b.Now.UTC()
	m := b.Moves
	batch.Queue(advanceOffsetsSQL, b.Projector, m.Topics, m.Partitions, m.Expected, m.Next, now)
	if fromStart.Len() > 0 {
		batch.Queue(insertOffsetsSQL, b.Projector, fromStart.Topics, fromStart.Partitions, fromStart.Next, now)
	}
	if len(b.IDs) > 0 {
		// In key order: each insert then lands next to the one before it
		// in the primary key, a fifth cheaper than in log order (the
		// batch's partitions each span the same stretch of UUIDv7 time).
		sorted := b.IDs
		if !slices.IsSortedFunc(sorted, compareIDs) {
			sorted = slices.Clone(sorted)
			SortIDs(sorted)
		}
		if checked {
			batch.Queue(recordAppliedCheckedSQL, b.Projector, sorted, now)
		} else {
			batch.Queue(RecordAppliedSQL, b.Projector, sorted, now)
		}
	}
	return batch
}

func compareIDs(a, b [16]byte) int { return bytes.Compare(a[:], b[:]) }

// SortIDs sorts ids in key order, the order Run inserts them in.
func SortIDs(ids [][16]byte) { slices.SortFunc(ids, compareIDs) }

// sendPrologue sends the statements before apply in one round trip. It
// returns how many offset rows moved (-1 if that is unknown) and, when
// checked, the ids never applied before.
func sendPrologue(ctx context.Context, tx pgx.Tx, batch *pgx.Batch, async, insert, record, checked bool) (moved int64, fresh map[[16]byte]struct{}, err error) {
	moved = -1
	br := tx.SendBatch(ctx, batch)
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("prologue: %w", cerr)
		}
	}()
	if _, err := br.Exec(); err != nil {
		return -1, nil, fmt.Errorf("set lock_timeout: %w", err)
	}
	if async {
		if _, err := br.Exec(); err != nil {
			return -1, nil, fmt.Errorf("set synchronous_commit: %w", err)
		}
	}
	tag, err := br.Exec()
	if err != nil {
		return -1, nil, fmt.Errorf("advance offsets: %w", err)
	}
	n := tag.RowsAffected()
	if insert {
		tag, err := br.Exec()
		if err != nil {
			return -1, nil, fmt.Errorf("insert offsets: %w", err)
		}
		n += tag.RowsAffected()
	}
	moved = n
	switch {
	case !record:
	case !checked:
		if _, err := br.Exec(); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && IsUniqueViolation(err) && pe.TableName == "applied_events" {
				return moved, nil, errAppliedBefore
			}
			return moved, nil, fmt.Errorf("record applied events: %w", err)
		}
	default:
		rows, err := br.Query()
		if err != nil {
			return moved, nil, fmt.Errorf("record applied events: %w", err)
		}
		fresh = map[[16]byte]struct{}{}
		var id [16]byte
		if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { fresh[id] = struct{}{}; return nil }); err != nil {
			return moved, nil, fmt.Errorf("record applied events: %w", err)
		}
	}
	return moved, fresh, nil
}
