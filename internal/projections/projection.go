// Package projections runs projectors: consumers that turn the event log
// into Postgres tables. A Projector consumes its projection's topics in a
// consumer group. Its poll loop applies the records of each poll, across the
// partitions it owns, in transactions of at most a batch, up to
// WithConcurrency of them in flight at once on disjoint sets of partitions;
// each also records the event ids it applied and moves every touched
// partition's next offset. Postgres, not the group's committed offsets, says
// where a partition resumes, so a crash at any point neither loses nor
// double-applies an event. Records that cannot be decoded, or whose apply
// keeps failing, go to the DLQ and the partition keeps moving; a partition
// that cannot be applied for now is retried on its own and holds up no
// other.
//
// A projection is the part that knows tables: it implements Projection.
// Registry is the first one.
package projections

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/domain"
)

// Projection turns domain events into rows.
type Projection interface {
	// Name names the projection. It keys the projection's offsets and
	// applied event ids in Postgres and its consumer group
	// ("mailplane-projector-<name>"), so it never changes once deployed.
	Name() string
	// Topics are the topics the projection consumes (catalog names: the
	// projector reads them in its Kafka configuration's namespace). Rows
	// keyed by position (projector_offsets, a record's Topic) hold the
	// namespaced names the broker gave the records.
	Topics() []string
	// Apply applies the events of recs to tx. None has been applied
	// before. They may come from several partitions, grouped by partition,
	// each partition's in log order; a key lives in one partition, so each
	// key's events are in log order. Each carries its position in the log,
	// for a projection that keys rows by it. The projector has locked the offset rows of those
	// partitions in tx already, so no other projector transaction writes
	// the same keys until tx ends. Apply is called from up to
	// WithConcurrency goroutines at once, each with its own tx and its own
	// partitions. Apply must be a function of the events
	// and the rows alone (no wall clock, no randomness), so replaying the
	// log reproduces the rows; it must not commit or roll back tx. It may
	// be called again with the same events in a new transaction when an
	// attempt fails.
	//
	// An error marked applyonce.Permanent, a *domain.Error (other than unavailable or
	// internal), or a Postgres data or constraint error says the events
	// themselves cannot be applied: the projector isolates the record at
	// fault and sends it to the DLQ. Any other error is taken to be
	// transient (a database restart, a deadlock): the events' partitions
	// are retried, each alone, until they succeed.
	Apply(ctx context.Context, tx pgx.Tx, recs []Record) error
}

// Record is an event and where it stands in the log.
type Record struct {
	Event     domain.Event
	Topic     string
	Partition int32
	Offset    int64
	// Appended is the record's append time on the broker.
	Appended time.Time
}

// Events returns the events of recs, in order.
func Events(recs []Record) []domain.Event {
	evs := make([]domain.Event, len(recs))
	for i, r := range recs {
		evs[i] = r.Event
	}
	return evs
}

// GroupName returns the consumer group of a projection's projector, outside
// any namespace (the projector puts it in its Kafka configuration's).
func GroupName(projection string) string { return "mailplane-projector-" + projection }
