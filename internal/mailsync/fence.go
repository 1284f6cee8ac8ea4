package mailsync

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/topics"
)

// ErrFenced is what a write at a stale epoch fails with (errors.Is): the
// partition has a newer owner, or none. A runner returns it from Run; the
// worker then stops the partition's runners.
var ErrFenced = errors.New("mailsync: fenced: the partition's epoch moved on")

// FencedError describes a refused write.
type FencedError struct {
	Partition int32
	Epoch     int64 // the epoch the write carried
	Current   int64 // the partition's epoch (0: none taken)
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("mailsync: write at epoch %d of partition %d refused: the current epoch is %d", e.Epoch, e.Partition, e.Current)
}

// Is makes errors.Is(err, ErrFenced) hold.
func (e *FencedError) Is(target error) bool { return target == ErrFenced }

// Writer runs a runner's writes. Every write is conditional on the runner's
// epoch still being its partition's current epoch: fn runs in a transaction
// that first takes a share lock on the partition's epoch row and checks it.
// A stale write is rolled back and refused with a *FencedError; it is
// counted and recorded in sync_fenced_writes.
//
// fn must only talk to the database and be quick: while it runs, the
// partition's next owner cannot take its epoch. Write calls fn at most
// once; retrying is the caller's choice.
type Writer interface {
	Write(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error
}

// Fence hands out partition epochs and fenced writers. It is safe for
// concurrent use.
type Fence struct {
	pool        *pgxpool.Pool
	fenced      prometheus.Counter
	idleTimeout string // milliseconds, for set_config
}

// NewFence returns a fence over the sync tables of pool's schema. fenced
// counts refused writes (nil: not counted); idleTimeout bounds how long a
// write's transaction may sit idle holding the share lock (0: 5s).
func NewFence(pool *pgxpool.Pool, fenced prometheus.Counter, idleTimeout time.Duration) *Fence {
	if idleTimeout <= 0 {
		idleTimeout = 5 * time.Second
	}
	if fenced == nil {
		fenced = prometheus.NewCounter(prometheus.CounterOpts{Name: "unused"})
	}
	return &Fence{pool: pool, fenced: fenced, idleTimeout: strconv.FormatInt(idleTimeout.Milliseconds(), 10)}
}

// acquireSQL takes the next epoch of each partition for owner, in one
// statement, partitions in order (so two acquirers lock rows in the same
// order), and records each in the history. The update waits for writes in
// flight at the old epoch (they hold the row FOR SHARE); acquired_at is read
// after the row lock is won.
const acquireSQL = `
WITH up AS (
    INSERT INTO sync_partitions AS s (partition, epoch, owner, acquired_at)
    SELECT p, 1, $2, clock_timestamp() FROM unnest($1::integer[]) AS p ORDER BY p
    ON CONFLICT (partition) DO UPDATE
        SET epoch = s.epoch + 1, owner = EXCLUDED.owner, acquired_at = clock_timestamp()
    RETURNING partition, epoch, owner, acquired_at
), hist AS (
    INSERT INTO sync_partition_epochs (partition, epoch, owner, acquired_at)
    SELECT partition, epoch, owner, acquired_at FROM up
)
SELECT partition, epoch, acquired_at FROM up ORDER BY partition`

// Acquire takes the next epoch of each partition for owner and returns
// them. Only a worker the group has just assigned the partitions to may call
// it: taking an epoch fences every other writer of the partition.
//
// The ownership_acquired events of sync.audit are queued in the outbox in
// the same transaction, so exactly the epochs taken are announced.
func (f *Fence) Acquire(ctx context.Context, owner string, partitions []int32) (map[int32]int64, error) {
	out := make(map[int32]int64, len(partitions))
	if len(partitions) == 0 {
		return out, nil
	}
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, acquireSQL, partitions, owner)
		if err != nil {
			return err
		}
		var (
			p    int32
			e    int64
			at   time.Time
			recs []*kgo.Record
		)
		if _, err := pgx.ForEachRow(rows, []any{&p, &e, &at}, func() error {
			out[p] = e
			r, err := encodeRecord(topics.SyncAudit, owner, at, &domain.SyncOwnershipAcquired{Partition: p, Epoch: e, Owner: owner, At: at.UTC()})
			recs = append(recs, r)
			return err
		}); err != nil {
			return err
		}
		return outbox.Add(ctx, tx, recs...)
	})
	if err != nil {
		return nil, fmt.Errorf("mailsync: take epochs: %w", err)
	}
	return out, nil
}

// Current returns the current epoch of each partition that has one.
func (f *Fence) Current(ctx context.Context, partitions []int32) (map[int32]int64, error) {
	rows, err := f.pool.Query(ctx, `SELECT partition, epoch FROM sync_partitions WHERE partition = ANY($1)`, partitions)
	if err != nil {
		return nil, fmt.Errorf("mailsync: read epochs: %w", err)
	}
	out := map[int32]int64{}
	var (
		p int32
		e int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&p, &e}, func() error { out[p] = e; return nil }); err != nil {
		return nil, fmt.Errorf("mailsync: read epochs: %w", err)
	}
	return out, nil
}

// Writer returns the fenced writer of a runner of mailboxID (may be empty)
// on partition at epoch.
func (f *Fence) Writer(partition int32, epoch int64, owner, mailboxID string) Writer {
	return &fencedWriter{f: f, partition: partition, epoch: epoch, owner: owner, mailboxID: mailboxID}
}

// refused counts a refused write and records it. It is an audit: it is
// written whatever the caller's context says, within a bound.
func (f *Fence) refused(ctx context.Context, e *FencedError, owner, mailboxID, kind string) {
	f.fenced.Inc()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var cur, mb any
	if e.Current > 0 {
		cur = e.Current
	}
	if mailboxID != "" {
		mb = mailboxID
	}
	_, _ = f.pool.Exec(ctx, `INSERT INTO sync_fenced_writes (partition, epoch, current_epoch, owner, mailbox_id, kind)
        VALUES ($1, $2, $3, $4, $5, $6)`, e.Partition, e.Epoch, cur, owner, mb, kind)
}

type fencedWriter struct {
	f         *Fence
	partition int32
	epoch     int64
	owner     string
	mailboxID string
}

func (w *fencedWriter) Write(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return w.f.write(ctx, w.partition, w.epoch, w.owner, w.mailboxID, "runner", fn)
}

// checkSQL locks the partition's epoch row for the transaction and bounds
// how long the transaction may idle while holding it.
const checkSQL = `SELECT set_config('idle_in_transaction_session_timeout', $2, true), epoch
FROM sync_partitions WHERE partition = $1 FOR SHARE`

// write runs fn in a transaction that holds partition's epoch row FOR
// SHARE and goes ahead only if the epoch is still epoch; kind names the
// writer in sync_fenced_writes when it is refused ("runner", "tier").
func (f *Fence) write(ctx context.Context, partition int32, epoch int64, owner, mailboxID, kind string, fn func(ctx context.Context, tx pgx.Tx) error) error {
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("mailsync: begin write: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var (
		ignored string
		cur     int64
	)
	err = tx.QueryRow(ctx, checkSQL, partition, f.idleTimeout).Scan(&ignored, &cur)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("mailsync: check epoch: %w", err)
	}
	if cur != epoch {
		_ = tx.Rollback(ctx)
		fe := &FencedError{Partition: partition, Epoch: epoch, Current: cur}
		f.refused(ctx, fe, owner, mailboxID, kind)
		return fe
	}
	if err := fn(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("mailsync: commit write: %w", err)
	}
	return nil
}

// writeRecords queues recs in the outbox in a fenced transaction of
// partition at epoch: they reach Kafka (through the outbox relay, in this
// order) only if the epoch was still current, and a refusal is counted and
// recorded as a fenced write of kind "tier".
//
// Per-key order across owners: the transaction holds the epoch row FOR
// SHARE from its check to its commit, and the next owner's Acquire updates
// that row, so it waits for this commit; the next owner writes only after
// Acquire returned. Every outbox row of a stale epoch therefore has a lower
// seq, and is committed before, any row the next owner writes for the same
// key, and the relay, publishing committed rows in seq order, keeps the
// order.
func (f *Fence) writeRecords(ctx context.Context, partition int32, epoch int64, owner, mailboxID string, recs []*kgo.Record) error {
	return f.write(ctx, partition, epoch, owner, mailboxID, "tier", func(ctx context.Context, tx pgx.Tx) error {
		return outbox.Add(ctx, tx, recs...)
	})
}
