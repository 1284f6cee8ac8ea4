package projections

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/internal/applyonce"
	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

// Position is a projector's position on one partition, as Postgres holds
// it: the offset of the first record not applied yet. It is the truth;
// the offsets the projector commits to its Kafka group mirror it for lag
// tools and are never read back.
type Position struct {
	Projector string
	Topic     string
	Partition int32
	Next      int64
	UpdatedAt time.Time
}

// Positions returns the positions of projector (every projector when
// empty), by projector, topic and partition.
func Positions(ctx context.Context, pool *pgxpool.Pool, projector string) ([]Position, error) {
	rows, err := pool.Query(ctx, `SELECT projector, topic, partition, next_offset, updated_at FROM projector_offsets
WHERE $1 = '' OR projector = $1 ORDER BY projector, topic, partition`, projector)
	if err != nil {
		return nil, fmt.Errorf("projections: positions: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Position, error) {
		var p Position
		err := r.Scan(&p.Projector, &p.Topic, &p.Partition, &p.Next, &p.UpdatedAt)
		return p, err
	})
}

// ErrNotSeekable refuses to move the placement projection: it must fold
// every decision of its log, so it is rebuilt (mailplane rebuild
// placement), never skipped forward.
var ErrNotSeekable = errors.New("projections: the placement projection is rebuilt with `mailplane rebuild placement`, never moved")

// CheckSeekable refuses what Seek would: the placement projection
// (ErrNotSeekable), and anything but a consumer of the table (internal/sla)
// on one of its topics in namespace ns: a typo must not plant a position
// nobody reads.
func CheckSeekable(ns topics.Namespace, projector, topic string) error {
	if projector == "placement" {
		return ErrNotSeekable
	}
	c, err := sla.Lookup(sla.Name(projector))
	if err != nil || !slices.Contains(ns.Topics(c.Topics...), topic) {
		return fmt.Errorf("projections: %q is not a projector reading %q", projector, topic)
	}
	return nil
}

// Seek moves projector's position on one partition to next and returns
// where it was. A running member notices at its next transaction (the
// offset row is its fence) and reads on from next. Moving forward skips
// records for good; moving back reads them again, but an event already
// applied stays applied once (applied_events): to apply history again,
// rebuild instead. It refuses with ErrBelowFloor to move below the
// records whose ids the dedupe window has forgotten (internal/applyonce).
func Seek(ctx context.Context, pool *pgxpool.Pool, ns topics.Namespace, projector, topic string, partition int32, next int64, now time.Time) (prev int64, err error) {
	if err := CheckSeekable(ns, projector, topic); err != nil {
		return 0, err
	}
	return applyonce.Seek(ctx, pool, projector, topic, partition, next, now)
}

// PositionTopics returns the topics of pos, each once, in their order.
func PositionTopics(pos []Position) []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range pos {
		if !seen[p.Topic] {
			seen[p.Topic] = true
			out = append(out, p.Topic)
		}
	}
	return out
}
