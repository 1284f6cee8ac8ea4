package applyonce_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/internal/applyonce"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
)

// TestRun: a batch moves its positions and records its ids with what it
// applies; a copy of an applied event is handed to apply as not fresh; a
// batch expecting a position its row no longer holds writes nothing
// (ErrFenced), and Current says where the row stands.
func TestRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.New(t)
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	ids := [][16]byte{{1}, {2}, {3}}
	var got []map[[16]byte]struct{}
	apply := func(_ context.Context, _ pgx.Tx, fresh map[[16]byte]struct{}) error {
		got = append(got, fresh)
		return nil
	}
	batch := func(expected, next int64, ids ...[16]byte) applyonce.Batch {
		var m applyonce.Moves
		m.Add("t", 0, expected, next)
		return applyonce.Batch{Projector: "p", Moves: m, IDs: ids, Async: true, Now: time.Unix(1700000000, 0)}
	}

	if err := applyonce.Run(ctx, db.Pool, batch(0, 3, ids...), apply); err != nil {
		t.Fatal(err)
	}
	// Offsets 3 and 4: a copy of id 2 and a new event.
	if err := applyonce.Run(ctx, db.Pool, batch(3, 5, ids[1], [16]byte{4}), apply); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != nil || len(got[1]) != 1 {
		t.Fatalf("apply saw %v, want every id fresh, then only the new one", got)
	}
	if _, ok := got[1][[16]byte{4}]; !ok {
		t.Fatalf("the new event is not fresh: %v", got[1])
	}

	// A member that still believes the partition stands at 3.
	err := applyonce.Run(ctx, db.Pool, batch(3, 6, [16]byte{5}), apply)
	if !errors.Is(err, applyonce.ErrFenced) || len(got) != 2 {
		t.Fatalf("a batch behind the row: %v (apply called %d times)", err, len(got))
	}
	var m applyonce.Moves
	m.Add("t", 0, 3, 6)
	cur, err := applyonce.Current(ctx, db.Pool, "p", m)
	if err != nil || cur[kafka.Partition{Topic: "t", Partition: 0}] != 5 {
		t.Fatalf("current positions %v, %v; want t/0 at 5", cur, err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM applied_events WHERE projector = 'p'`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("%d ids recorded (%v), want 4", n, err)
	}
}
