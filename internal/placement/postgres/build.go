package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/mailplane/mailplane/topics"
)

// Builder builds the placement projection from offset 0 into
// empty tables, as a rebuild does: the same fold as ApplyDecisions, but the
// rows stay in memory from the first decision on, so nothing is read back
// from Postgres and every row is written once — the append-only ones
// (history, assignment changes) as they come (TakeAppendOnly, then
// WriteAppendOnly), the others (workers, orgs, mailboxes) and the
// checkpoint at the end (Finish). The result is the rows ApplyDecisions
// writes for the same log in any batches. Memory grows with the fleet
// (about 200 bytes per mailbox).
type Builder struct {
	log   string // the decision log's name, in the namespace
	f     *fold
	last  int64
	added int64
}

// NewBuilder returns a builder at offset 0 of the decision log in
// namespace ns.
func NewBuilder(ns topics.Namespace) *Builder {
	return &Builder{log: ns.Topic(topics.PlacementDecisions), f: newFold(), last: -1}
}

// Add folds recs, which follow every record added before, in log order.
func (b *Builder) Add(recs []Record) error {
	for _, r := range recs {
		if r.Offset <= b.last {
			return fmt.Errorf("placement: offsets out of order: %d after %d", r.Offset, b.last)
		}
		b.last = r.Offset
		if err := b.f.apply(r.Offset, r.Decision.ID, r.Decision.Data); err != nil {
			return err
		}
		b.added++
	}
	return nil
}

// Decisions is how many decisions were added.
func (b *Builder) Decisions() int64 { return b.added }

// AppendOnly holds history and assignment-change rows taken from
// a builder, ready to write.
type AppendOnly struct {
	history []history
	changes []change
}

// Len is the number of rows.
func (a AppendOnly) Len() int { return len(a.history) + len(a.changes) }

// TakeAppendOnly hands over the history and assignment-change rows made
// since the last call.
func (b *Builder) TakeAppendOnly() AppendOnly {
	a := AppendOnly{history: b.f.history, changes: b.f.changes}
	b.f.history, b.f.changes = nil, nil
	return a
}

// WriteAppendOnly COPYs the rows into placement_history and
// placement_assignment_changes.
func (a AppendOnly) WriteAppendOnly(ctx context.Context, tx pgx.Tx) error {
	if len(a.history) > 0 {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"placement_history"}, historyColumns, &historySource{rows: a.history, i: -1}); err != nil {
			return fmt.Errorf("placement: copy into placement_history: %w", err)
		}
	}
	if len(a.changes) > 0 {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"placement_assignment_changes"}, changeColumns, &changeSource{rows: a.changes, i: -1}); err != nil {
			return fmt.Errorf("placement: copy into placement_assignment_changes: %w", err)
		}
	}
	return nil
}

// Finish writes the workers, orgs and mailboxes, and the checkpoint at
// next, into tx. The append-only rows must have been taken and written
// before (they are not written here).
func (b *Builder) Finish(ctx context.Context, tx pgx.Tx, next int64) error {
	if next <= b.last {
		return fmt.Errorf("placement: next offset %d is not past the last decision's %d", next, b.last)
	}
	if len(b.f.history)+len(b.f.changes) > 0 {
		return fmt.Errorf("placement: %d append-only rows not taken before Finish", len(b.f.history)+len(b.f.changes))
	}
	var workers [][]any
	for _, w := range b.f.workers {
		if w.seen { // forgotten workers have no row
			workers = append(workers, w.row())
		}
	}
	if len(workers) > 0 {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"placement_workers"}, workerColumns, pgx.CopyFromRows(workers)); err != nil {
			return fmt.Errorf("placement: copy into placement_workers: %w", err)
		}
	}
	var orgs [][]any
	for _, o := range b.f.orgs {
		orgs = append(orgs, []any{pgtype.UUID{Bytes: o.id, Valid: true}, o.plan, o.dedicated, o.paid, o.source, o.since, o.offset})
	}
	if len(orgs) > 0 {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"placement_orgs"}, orgColumns, pgx.CopyFromRows(orgs)); err != nil {
			return fmt.Errorf("placement: copy into placement_orgs: %w", err)
		}
	}
	ms := make([]*mailbox, 0, len(b.f.mailboxes))
	for _, m := range b.f.mailboxes {
		if m.present {
			ms = append(ms, m)
		}
	}
	if len(ms) > 0 {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"placement_mailboxes"}, mailboxColumns, &mailboxSource{rows: ms, i: -1}); err != nil {
			return fmt.Errorf("placement: copy into placement_mailboxes: %w", err)
		}
	}
	if l := b.f.liveness; l != nil {
		if _, err := tx.Exec(ctx, upsertLivenessSQL, l.row()...); err != nil {
			return fmt.Errorf("placement: write placement_liveness: %w", err)
		}
	}
	return setPlacementCheckpoint(ctx, tx, b.log, next, b.f.lastID)
}

var orgColumns = []string{"org_id", "plan", "dedicated_workers", "paid", "source", "plan_since_ns", "decision_offset"}

// mailboxSource streams mailbox rows to COPY.
type mailboxSource struct {
	rows []*mailbox
	i    int
}

func (s *mailboxSource) Next() bool             { s.i++; return s.i < len(s.rows) }
func (s *mailboxSource) Err() error             { return nil }
func (s *mailboxSource) Values() ([]any, error) { return s.rows[s.i].row(), nil }
