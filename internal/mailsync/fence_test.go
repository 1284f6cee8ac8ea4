package mailsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/pgtest"
)

func insertWrite(mailbox string, part int32, epoch int64, owner string) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO sync_recorder_writes (mailbox_id, partition, epoch, owner, kind, tier)
            VALUES ($1, $2, $3, $4, 'beat', 'warm')`, mailbox, part, epoch, owner)
		return err
	}
}

// TestFence takes epochs for two owners in turn and checks that only the
// current epoch's writes land, that a refused write is counted and
// recorded, and that taking an epoch waits for a write in flight.
func TestFence(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	migrate(t, db.Pool)
	ctx := context.Background()
	fencedCount := prometheus.NewCounter(prometheus.CounterOpts{Name: "fenced"})
	reg := prometheus.NewRegistry()
	reg.MustRegister(fencedCount)
	f := mailsync.NewFence(db.Pool, fencedCount, time.Second)
	mb := newFixture(1).uuid()

	a, err := f.Acquire(ctx, "a", []int32{3, 1, 2})
	if err != nil {
		t.Fatal(err)
	}
	if a[1] != 1 || a[2] != 1 || a[3] != 1 {
		t.Fatalf("first epochs %v, want 1 each", a)
	}
	wa := f.Writer(1, a[1], "a", mb)
	if err := wa.Write(ctx, insertWrite(mb, 1, a[1], "a")); err != nil {
		t.Fatalf("current write: %v", err)
	}

	b, err := f.Acquire(ctx, "b", []int32{1})
	if err != nil {
		t.Fatal(err)
	}
	if b[1] != 2 {
		t.Fatalf("second epoch %d, want 2", b[1])
	}
	err = wa.Write(ctx, insertWrite(mb, 1, a[1], "a"))
	var fe *mailsync.FencedError
	if !errors.Is(err, mailsync.ErrFenced) || !errors.As(err, &fe) || fe.Epoch != 1 || fe.Current != 2 {
		t.Fatalf("stale write: %v", err)
	}
	if got := count(t, db.Pool, `SELECT count(*) FROM sync_recorder_writes WHERE epoch = 1`); got != 1 {
		t.Errorf("%d writes at epoch 1 landed, want only the first", got)
	}
	if got := count(t, db.Pool, `SELECT count(*) FROM sync_fenced_writes WHERE owner = 'a' AND epoch = 1 AND current_epoch = 2 AND mailbox_id = $1`, mb); got != 1 {
		t.Errorf("fenced attempts recorded: %d, want 1", got)
	}
	fenced := counterValue(t, reg, "fenced")
	if fenced != 1 {
		t.Errorf("fenced counter %v, want 1", fenced)
	}
	if err := f.Writer(1, b[1], "b", mb).Write(ctx, insertWrite(mb, 1, b[1], "b")); err != nil {
		t.Fatalf("b's write: %v", err)
	}
	// A partition never acquired refuses everything.
	if err := f.Writer(9, 1, "a", mb).Write(ctx, insertWrite(mb, 9, 1, "a")); !errors.Is(err, mailsync.ErrFenced) {
		t.Fatalf("write to a partition without epoch: %v", err)
	}
	// An error from fn rolls back.
	boom := errors.New("boom")
	if err := f.Writer(1, b[1], "b", mb).Write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if err := insertWrite(mb, 1, b[1], "b")(ctx, tx); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("fn error: %v", err)
	}
	if got := count(t, db.Pool, `SELECT count(*) FROM sync_recorder_writes WHERE epoch = 2`); got != 1 {
		t.Errorf("%d writes at epoch 2, want 1 (the failed one rolled back)", got)
	}

	// Taking an epoch waits for a write in flight, and the write's time
	// is before the new epoch's.
	inFn := make(chan struct{})
	release := make(chan struct{})
	writeDone := make(chan error, 1)
	go func() {
		writeDone <- f.Writer(1, b[1], "b", mb).Write(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if err := insertWrite(mb, 1, b[1], "b")(ctx, tx); err != nil {
				return err
			}
			close(inFn)
			<-release
			return nil
		})
	}()
	<-inFn
	acquired := make(chan map[int32]int64, 1)
	go func() {
		e, err := f.Acquire(ctx, "c", []int32{1})
		if err != nil {
			t.Error(err)
		}
		acquired <- e
	}()
	select {
	case <-acquired:
		t.Fatal("an epoch was taken while a write of the previous epoch was in flight")
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := <-writeDone; err != nil {
		t.Fatalf("in-flight write: %v", err)
	}
	if e := <-acquired; e[1] != 3 {
		t.Fatalf("third epoch %v", e)
	}
	if n := staleWrites(t, db.Pool); n != 0 {
		t.Errorf("%d writes landed at a stale epoch", n)
	}
	if got := count(t, db.Pool, `SELECT count(*) FROM sync_partition_epochs WHERE partition = 1`); got != 3 {
		t.Errorf("epoch history of partition 1 has %d rows, want 3", got)
	}
}

// TestFenceIdleTimeout: a writer that stalls inside its transaction (a
// paused process) loses its connection after the idle timeout, so the next
// owner's epoch is not blocked for longer than that.
func TestFenceIdleTimeout(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	migrate(t, db.Pool)
	ctx := context.Background()
	f := mailsync.NewFence(db.Pool, nil, 500*time.Millisecond)
	mb := newFixture(2).uuid()
	e, err := f.Acquire(ctx, "a", []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	writeErr := make(chan error, 1)
	go func() {
		writeErr <- f.Writer(0, e[0], "a", mb).Write(ctx, func(ctx context.Context, tx pgx.Tx) error {
			time.Sleep(2 * time.Second) // idle in transaction, holding the share lock
			_, err := tx.Exec(ctx, `SELECT 1`)
			return err
		})
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if _, err := f.Acquire(ctx, "b", []int32{0}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("taking the epoch waited %s behind an idle writer", d)
	}
	if err := <-writeErr; err == nil {
		t.Error("the stalled write committed")
	}
}
