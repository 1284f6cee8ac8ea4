package applyonce

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/internal/kafka"
)

// Moves are the position moves of one transaction: partitions, the offsets
// their rows must hold (the fence), and the offsets they move to.
type Moves struct {
	Topics     []string
	Partitions []int32
	Expected   []int64
	Next       []int64
}

// Add adds a partition's move from expected to next.
func (m *Moves) Add(topic string, partition int32, expected, next int64) {
	m.Topics, m.Partitions = append(m.Topics, topic), append(m.Partitions, partition)
	m.Expected, m.Next = append(m.Expected, expected), append(m.Next, next)
}

// Len is the number of partitions moved.
func (m *Moves) Len() int { return len(m.Topics) }

// fromStart are the moves of the partitions expected at the start of the
// log, which may have no row yet.
func (m *Moves) fromStart() Moves {
	var out Moves
	for i, e := range m.Expected {
		if e == 0 {
			out.Add(m.Topics[i], m.Partitions[i], 0, m.Next[i])
		}
	}
	return out
}

const (
	// Moving every partition's offset locks its row, and with it the keys
	// the partition's events touch: a key lives in one partition, so no
	// other projector transaction writes it until this one ends. The WHERE
	// is the fence: a row must still hold the offset this member started
	// from, or it is left alone (and the transaction rolled back), so a
	// member that lost a partition without knowing writes nothing.
	advanceOffsetsSQL = `UPDATE projector_offsets AS o
SET next_offset = u.next_offset, updated_at = $6
FROM unnest($2::text[], $3::int4[], $4::int8[], $5::int8[]) AS u(topic, partition, expected, next_offset)
WHERE o.projector = $1 AND o.topic = u.topic AND o.partition = u.partition AND o.next_offset = u.expected`

	// A partition expected at the start of the log may have no row yet. A
	// row that does exist is the one just advanced, or else another
	// member's: a fence.
	insertOffsetsSQL = `INSERT INTO projector_offsets (projector, topic, partition, next_offset, updated_at)
SELECT $1, u.topic, u.partition, u.next_offset, $5
FROM unnest($2::text[], $3::int4[], $4::int8[]) AS u(topic, partition, next_offset)
ON CONFLICT (projector, topic, partition) DO NOTHING`

	// setOffsetsSQL moves positions without a fence: for a writer that
	// fences on something else (the placement checkpoint) or that moves a
	// position on purpose (Seek).
	setOffsetsSQL = `INSERT INTO projector_offsets (projector, topic, partition, next_offset, updated_at)
SELECT $1, u.topic, u.partition, u.next_offset, $5
FROM unnest($2::text[], $3::int4[], $4::int8[]) AS u(topic, partition, next_offset)
ON CONFLICT (projector, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = EXCLUDED.updated_at`

	currentOffsetsSQL = `SELECT topic, partition, next_offset FROM projector_offsets
WHERE projector = $1 AND (topic, partition) IN (SELECT * FROM unnest($2::text[], $3::int4[]))`
)

// QueueSet queues, in b, the move of projector's positions to m.Next (its
// Expected is not checked: the caller fences on something else, as the
// placement projection on its checkpoint, or moves a position on purpose).
func QueueSet(b *pgx.Batch, projector string, m Moves, now time.Time) {
	b.Queue(setOffsetsSQL, projector, m.Topics, m.Partitions, m.Next, now)
}

// Execer is a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Set moves projector's positions to m.Next without a fence (see
// QueueSet).
func Set(ctx context.Context, q Execer, projector string, m Moves, now time.Time) error {
	if _, err := q.Exec(ctx, setOffsetsSQL, projector, m.Topics, m.Partitions, m.Next, now); err != nil {
		return fmt.Errorf("applyonce: set positions of %s: %w", projector, err)
	}
	return nil
}

// Querier is a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Current reads projector's positions on the partitions of m (0 for a
// partition with no row): what a fenced Run found instead of m.Expected.
func Current(ctx context.Context, q Querier, projector string, m Moves) (map[kafka.Partition]int64, error) {
	rows, err := q.Query(ctx, currentOffsetsSQL, projector, m.Topics, m.Partitions)
	if err != nil {
		return nil, fmt.Errorf("read fenced offsets: %w", err)
	}
	out := make(map[kafka.Partition]int64, m.Len())
	var (
		p    kafka.Partition
		next int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&p.Topic, &p.Partition, &next}, func() error {
		out[p] = next
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read fenced offsets: %w", err)
	}
	return out, nil
}

// ErrBelowFloor is returned by Seek for a position below the partition's
// forgotten_below: those records were applied, and their ids may be
// forgotten (older than the dedupe window), so reading them again could
// apply them twice.
var ErrBelowFloor = errors.New("projections: the records below this offset were applied longer ago than the dedupe window; their ids are forgotten, so reading them again could apply them twice (rebuild the projection instead)")

// Seek moves projector's position on one partition to next and returns
// where it was (-1: no row). A running member notices at its next
// transaction (the offset row is its fence). Moving back marks where the
// partition stood, so the prune keeps the ids that refuse what is read
// again (prune.go); it refuses with ErrBelowFloor to move below the
// records whose ids the window has forgotten.
func Seek(ctx context.Context, pool *pgxpool.Pool, projector, topic string, partition int32, next int64, now time.Time) (prev int64, err error) {
	if next < 0 {
		return 0, fmt.Errorf("projections: seek to %d: offsets are not negative", next)
	}
	prev = -1
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var known bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM projector_offsets WHERE projector = $1)`, projector).Scan(&known); err != nil {
			return err
		}
		if !known {
			return fmt.Errorf("projector %q has no position anywhere: not a projector, or it never ran", projector)
		}
		var floor int64
		err := tx.QueryRow(ctx, `SELECT next_offset, forgotten_below FROM projector_offsets WHERE projector = $1 AND topic = $2 AND partition = $3 FOR UPDATE`,
			projector, topic, partition).Scan(&prev, &floor)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if next < floor {
			return fmt.Errorf("%w (%s partition %d: offsets below %d)", ErrBelowFloor, topic, partition, floor)
		}
		if next < prev {
			// The ids of what lies between are what refuses it when read
			// again: the prune must not forget them without raising the
			// floor past prev (prune.go).
			if _, err := tx.Exec(ctx, `INSERT INTO applied_event_marks (projector, topic, partition, marked_at, next_offset) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (projector, marked_at, topic, partition) DO UPDATE SET next_offset = GREATEST(applied_event_marks.next_offset, EXCLUDED.next_offset)`,
				projector, topic, partition, now, prev); err != nil {
				return err
			}
		}
		var m Moves
		m.Add(topic, partition, prev, next)
		_, err = tx.Exec(ctx, setOffsetsSQL, projector, m.Topics, m.Partitions, m.Next, now)
		return err
	})
	if errors.Is(err, ErrBelowFloor) {
		return 0, err
	}
	if err != nil {
		return 0, fmt.Errorf("projections: seek: %w", err)
	}
	return prev, nil
}

// ExchangeRows exchanges projector's bookkeeping rows (projector_offsets
// and applied_events) between the live schema and a rebuilt one, in tx:
// a rebuild swapped in brings its positions and ids with its tables, so
// the live projector resumes from the rebuild's positions and skips the
// events the rebuild applied.
func ExchangeRows(ctx context.Context, tx pgx.Tx, live, rebuilt, projector string) error {
	for _, book := range []string{"projector_offsets", "applied_events"} {
		l, b := pgx.Identifier{live, book}.Sanitize(), pgx.Identifier{rebuilt, book}.Sanitize()
		if _, err := tx.Exec(ctx, `CREATE TEMP TABLE mailplane_swap_rows ON COMMIT DROP AS SELECT * FROM `+l+` WHERE projector = $1`, projector); err != nil {
			return fmt.Errorf("applyonce: swap %s: %w", book, err)
		}
		for _, st := range []struct {
			sql  string
			args []any
		}{
			{`DELETE FROM ` + l + ` WHERE projector = $1`, []any{projector}},
			{`INSERT INTO ` + l + ` SELECT * FROM ` + b + ` WHERE projector = $1`, []any{projector}},
			{`DELETE FROM ` + b + ` WHERE projector = $1`, []any{projector}},
			{`INSERT INTO ` + b + ` SELECT * FROM mailplane_swap_rows`, nil},
			{`DROP TABLE mailplane_swap_rows`, nil},
		} {
			if _, err := tx.Exec(ctx, st.sql, st.args...); err != nil {
				return fmt.Errorf("applyonce: swap %s: %w", book, err)
			}
		}
	}
	return nil
}

// InSchema reads projector's positions in schema (whatever tx's
// search_path), by partition; lock also locks the rows, as a swap does to
// hold the projector's next transaction back (a projector locks its rows
// first too, so the two never deadlock).
func InSchema(ctx context.Context, tx pgx.Tx, schema, projector string, lock bool) (map[kafka.Partition]int64, error) {
	sql := `SELECT topic, partition, next_offset FROM ` + pgx.Identifier{schema, "projector_offsets"}.Sanitize() + ` WHERE projector = $1`
	if lock {
		sql += ` FOR UPDATE`
	}
	rows, _ := tx.Query(ctx, sql, projector)
	out := map[kafka.Partition]int64{}
	var (
		p kafka.Partition
		n int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&p.Topic, &p.Partition, &n}, func() error { out[p] = n; return nil }); err != nil {
		return nil, fmt.Errorf("applyonce: positions of %s in %s: %w", projector, schema, err)
	}
	return out, nil
}
