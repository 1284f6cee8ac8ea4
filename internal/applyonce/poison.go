package applyonce

// Poison: a record the projection refuses (Run returns a *RefusedError)
// must not hold up the records after it for good. Isolate is the one way
// such a record is found, for the live projector and a rebuild alike: the
// batch is halved, each half committed in order, until the record at
// fault stands alone; it is then refused Attempts times in a row (Tries)
// before it is poison, and the caller passes it (the projector after
// writing it to the DLQ, a rebuild by counting it), so that the next
// commit moves the position past it with nothing applied. Halves are
// committed in order, so each partition's records still commit in offset
// order.

import (
	"context"
	"errors"

	"github.com/mailplane/mailplane/domain"
)

// Tries counts how often the projection refused one partition's suspect,
// the record it refused alone. The zero value has no suspect.
type Tries struct {
	offset int64
	n      int
}

// Suspect is the offset of the record refused alone, if any: what a
// partition retried alone applies up to, and never past.
func (t *Tries) Suspect() (offset int64, ok bool) { return t.offset, t.n > 0 }

// Passed forgets the suspect once the partition's position is next, past
// it (applied at last, or passed as poison).
func (t *Tries) Passed(next int64) {
	if t.n > 0 && t.offset < next {
		*t = Tries{}
	}
}

// Reset forgets the suspect (the partition reads from elsewhere).
func (t *Tries) Reset() { *t = Tries{} }

// refused counts a refusal of the record at offset and returns how many
// there were in a row.
func (t *Tries) refused(offset int64) int {
	if t.n == 0 || t.offset != offset {
		t.offset, t.n = offset, 0
	}
	t.n++
	return t.n
}

// Refusal is a record the projection refused alone.
type Refusal struct {
	// Code and Err are the refusal (RefusedError).
	Code domain.Code
	Err  error
	// Attempts is how often the record was refused alone in a row.
	Attempts int
	// Poison: Attempts reached the policy's; the record is to be passed.
	Poison bool
}

// Isolating is what Isolate needs of its caller, for records of type T:
// how to commit them, and the caller's effect for a poison record and for
// other failures.
type Isolating[T any] interface {
	// Commit commits recs in one transaction (through Run).
	Commit(ctx context.Context, recs []T) error
	// Live says rec is still to be applied: not passed (undecodable,
	// another consumer's, poison already).
	Live(rec T) bool
	// Aside says rec's partition was set aside by Refused or Failed: its
	// records are left out of every later commit of this Isolate.
	Aside(rec T) bool
	// Tries is the count of refusals of rec's partition, and rec's offset.
	Tries(rec T) (*Tries, int64)
	// Refused is told of rec, refused alone. When r.Poison the caller
	// passes it (Live false from then on) or, if it cannot yet, sets its
	// partition aside; else it sets the partition aside for a later try.
	// What is left of the batch is committed next.
	Refused(ctx context.Context, rec T, r Refusal)
	// Failed is told of any other failure of recs (transient, a fence, a
	// refusal with no live record); again commits them again, less what
	// Aside now leaves out; a non-nil stop ends Isolate with it.
	Failed(ctx context.Context, recs []T, err error) (again bool, stop error)
	// Interrupted ends Isolate before its next commit, what is left
	// uncommitted.
	Interrupted() bool
}

// Isolate commits b through h, taking out the records the projection
// refuses (see the rule above): a record refused alone attempts times in a
// row is poison. It returns nil once every record is committed, passed or
// set aside, or when h is interrupted; ctx's error when ctx ends; or what
// h.Failed stopped it with. On the happy path it is one h.Commit.
func Isolate[T any](ctx context.Context, b []T, h Isolating[T], attempts int) error {
	work := [][]T{b} // a stack: the next records to commit are last
	failed := false  // nothing is aside before the first failure
	for len(work) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		if h.Interrupted() {
			return nil
		}
		cur := work[len(work)-1]
		work = work[:len(work)-1]
		if failed {
			cur = without(cur, h.Aside)
		}
		if len(cur) == 0 {
			continue
		}
		err := h.Commit(ctx, cur)
		if err == nil {
			continue
		}
		failed = true
		if cerr := ctx.Err(); cerr != nil {
			return cerr // stopping: not the records' fault
		}
		var re *RefusedError
		var live []int
		if errors.As(err, &re) {
			live = liveAt(cur, h.Live)
		}
		switch {
		case len(live) > 1:
			mid := live[len(live)/2]
			work = append(work, cur[mid:], cur[:mid])
		case len(live) == 1:
			rec := cur[live[0]]
			tries, offset := h.Tries(rec)
			n := tries.refused(offset)
			h.Refused(ctx, rec, Refusal{Code: re.Code, Err: re.Err, Attempts: n, Poison: n >= attempts})
			// rec is passed now, or its partition aside; the rest goes on.
			work = append(work, cur)
		default:
			again, stop := h.Failed(ctx, cur, err)
			if stop != nil {
				return stop
			}
			if again {
				work = append(work, cur)
			}
		}
	}
	return nil
}

// liveAt returns the indexes of the live records of b.
func liveAt[T any](b []T, live func(T) bool) []int {
	var out []int
	for i, rec := range b {
		if live(rec) {
			out = append(out, i)
		}
	}
	return out
}

// without returns b less the records aside, in a new slice (b's halves
// share its array).
func without[T any](b []T, aside func(T) bool) []T {
	out := make([]T, 0, len(b))
	for _, rec := range b {
		if !aside(rec) {
			out = append(out, rec)
		}
	}
	return out
}
