package applyonce_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/applyonce"
)

// rec is a record of a fake projection: an offset, refused when bad.
type rec struct {
	off    int64
	bad    bool
	passed bool
}

// fakeLog commits records into a position, refusing the bad ones as a
// projection would (through applyonce.Refuse, as Run does), and passes a
// poison record as a caller's effect.
type fakeLog struct {
	next      int64 // the position: the offset after the last committed
	applied   []int64
	commits   int
	tries     applyonce.Tries
	aside     bool
	refusals  []applyonce.Refusal
	transient error // the next commit fails with it, once
	stop      bool  // Failed ends Isolate
}

func (f *fakeLog) Commit(_ context.Context, recs []*rec) error {
	f.commits++
	if f.transient != nil {
		err := f.transient
		f.transient = nil
		return err
	}
	if recs[0].off != f.next {
		return fmt.Errorf("committed out of order: %d at position %d", recs[0].off, f.next)
	}
	for _, r := range recs {
		if r.bad && !r.passed {
			return applyonce.Refuse(applyonce.Permanent(domain.CodeConflict, fmt.Errorf("refused %d", r.off)))
		}
	}
	for _, r := range recs {
		if !r.passed {
			f.applied = append(f.applied, r.off)
		}
	}
	f.next = recs[len(recs)-1].off + 1
	f.tries.Passed(f.next)
	return nil
}

func (f *fakeLog) Live(r *rec) bool                       { return !r.passed }
func (f *fakeLog) Aside(*rec) bool                        { return f.aside }
func (f *fakeLog) Tries(r *rec) (*applyonce.Tries, int64) { return &f.tries, r.off }
func (f *fakeLog) Interrupted() bool                      { return false }
func (f *fakeLog) Failed(_ context.Context, _ []*rec, err error) (bool, error) {
	if f.stop {
		return false, err
	}
	f.aside = true
	return false, nil
}

func (f *fakeLog) Refused(_ context.Context, r *rec, rf applyonce.Refusal) {
	f.refusals = append(f.refusals, rf)
	if rf.Poison {
		r.passed = true
		return
	}
	f.aside = true // retried by the next Isolate
}

func batch(n int, bad ...int64) []*rec {
	b := make([]*rec, n)
	for i := range b {
		b[i] = &rec{off: int64(i), bad: slices.Contains(bad, int64(i))}
	}
	return b
}

// TestIsolatePoison: a refused record is found by halving, refused alone
// attempts times in a row (each try a new Isolate, as the projector retries
// a partition set aside), then passed as poison; everything else is
// applied in offset order and the position moves past the poison record.
func TestIsolatePoison(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := &fakeLog{}
	b := batch(64, 37)
	for try := 1; try <= 3; try++ {
		f.aside = false
		rest := slices.DeleteFunc(slices.Clone(b), func(r *rec) bool { return r.off < f.next })
		if err := applyonce.Isolate(ctx, rest, f, 3); err != nil {
			t.Fatal(err)
		}
		if got := len(f.refusals); got != try {
			t.Fatalf("try %d: %d refusals alone, want %d", try, got, try)
		}
		rf := f.refusals[try-1]
		if rf.Attempts != try || rf.Poison != (try == 3) || rf.Code != domain.CodeConflict || rf.Err == nil {
			t.Fatalf("try %d: refusal %+v", try, rf)
		}
		if off, ok := f.tries.Suspect(); try < 3 && (!ok || off != 37) {
			t.Fatalf("try %d: suspect %d, %v; want 37", try, off, ok)
		}
	}
	if f.next != 64 || len(f.applied) != 63 || slices.Contains(f.applied, 37) || !slices.IsSorted(f.applied) {
		t.Fatalf("position %d, applied %v: want 64, every offset but 37, in order", f.next, f.applied)
	}
	if _, ok := f.tries.Suspect(); ok {
		t.Fatal("the suspect outlives the position moving past it")
	}
}

// TestIsolateHappyPath: a batch nothing refuses is one commit.
func TestIsolateHappyPath(t *testing.T) {
	t.Parallel()
	f := &fakeLog{}
	if err := applyonce.Isolate(context.Background(), batch(1000), f, 1); err != nil || f.commits != 1 || f.next != 1000 {
		t.Fatalf("%v: %d commits, position %d; want one commit to 1000", err, f.commits, f.next)
	}
}

// TestIsolateFailures: a failure other than a refusal goes to Failed,
// which sets the records aside (nothing more is committed) or stops
// Isolate with its error; an ended context stops it too.
func TestIsolateFailures(t *testing.T) {
	t.Parallel()
	down := errors.New("connection refused")
	f := &fakeLog{transient: down}
	if err := applyonce.Isolate(context.Background(), batch(10), f, 1); err != nil || f.commits != 1 || f.next != 0 {
		t.Fatalf("set aside: %v, %d commits, position %d", err, f.commits, f.next)
	}
	f = &fakeLog{transient: down, stop: true}
	if err := applyonce.Isolate(context.Background(), batch(10), f, 1); !errors.Is(err, down) {
		t.Fatalf("stopped with %v, want %v", err, down)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f = &fakeLog{}
	if err := applyonce.Isolate(ctx, batch(10), f, 1); !errors.Is(err, context.Canceled) || f.commits != 0 {
		t.Fatalf("canceled: %v after %d commits", err, f.commits)
	}
}

// TestRefuse: only an error that says the records are at fault is a
// refusal.
func TestRefuse(t *testing.T) {
	t.Parallel()
	var re *applyonce.RefusedError
	for _, tc := range []struct {
		err     error
		refused bool
		code    domain.Code
	}{
		{applyonce.Permanent("", errors.New("x")), true, domain.CodeInvalid},
		{fmt.Errorf("wrapped: %w", domain.Errorf(domain.CodeConflict, "y")), true, domain.CodeConflict},
		{domain.Errorf(domain.CodeUnavailable, "down"), false, ""},
		{errors.New("deadlock"), false, ""},
		{fmt.Errorf("insert: %w", &pgconn.PgError{Code: "23514"}), true, domain.CodeInvalid},
		{&pgconn.PgError{Code: "40P01"}, false, ""},
	} {
		err := applyonce.Refuse(tc.err)
		if errors.As(err, &re) != tc.refused || tc.refused && re.Code != tc.code || !errors.Is(err, tc.err) {
			t.Errorf("Refuse(%v) = %v", tc.err, err)
		}
	}
}
