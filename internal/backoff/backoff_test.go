package backoff_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/mailplane/mailplane/internal/backoff"
)

// Every wait lies between the ceiling less its jitter and the ceiling, and
// the ceilings double from the floor to the cap: for any policy.
func TestWaitsStayWithinTheirCeiling(t *testing.T) {
	t.Parallel()
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		p := backoff.Policy{
			Floor:  time.Duration(1 + rnd.Int64N(int64(time.Second))),
			Cap:    time.Duration(1 + rnd.Int64N(int64(time.Minute))),
			Jitter: rnd.Float64(),
		}
		b := backoff.New(p, rand.New(rand.NewPCG(3, 4)))
		prev := time.Duration(0)
		for n := 1; n <= 40; n++ {
			c := p.Ceiling(n)
			if c < prev {
				t.Fatalf("%+v: ceiling %d is %v, below the one before (%v)", p, n, c, prev)
			}
			if c > max(p.Cap, p.Floor) {
				t.Fatalf("%+v: ceiling %d is %v, above the cap", p, n, c)
			}
			if n == 1 && c != min(p.Floor, max(p.Cap, p.Floor)) {
				t.Fatalf("%+v: the first ceiling is %v, want the floor", p, c)
			}
			w := b.Next()
			lo := c - time.Duration(float64(c)*p.Jitter)
			if w < lo || w > c {
				t.Fatalf("%+v: wait %d is %v, outside [%v, %v]", p, n, w, lo, c)
			}
			prev = c
		}
	}
}

func TestResetStartsFromTheFloor(t *testing.T) {
	t.Parallel()
	b := backoff.New(backoff.Policy{Floor: time.Second, Cap: time.Minute}, nil)
	for range 5 {
		b.Next()
	}
	if got := b.Failures(); got != 5 {
		t.Fatalf("failures = %d, want 5", got)
	}
	b.Reset()
	if got := b.Next(); got != time.Second {
		t.Fatalf("after a reset the wait is %v, want the floor (no jitter)", got)
	}
}

func TestNextWithinLowersTheCeilingNotBelowTheFloor(t *testing.T) {
	t.Parallel()
	b := backoff.New(backoff.Policy{Floor: time.Second, Cap: time.Hour}, nil)
	for range 10 {
		b.Next()
	}
	if got := b.NextWithin(5 * time.Second); got != 5*time.Second {
		t.Fatalf("NextWithin(5s) = %v", got)
	}
	if got := b.NextWithin(time.Millisecond); got != time.Second {
		t.Fatalf("NextWithin(1ms) = %v, want the floor", got)
	}
}

func TestRetryStopsOnSuccessPermanentOrContext(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{Floor: time.Microsecond, Cap: time.Millisecond}
	calls := 0
	var told []int
	err := backoff.Retry(context.Background(), p, func(n int, _ time.Duration, _ error) { told = append(told, n) },
		func(context.Context) error {
			calls++
			if calls < 4 {
				return errors.New("not yet")
			}
			return nil
		})
	if err != nil || calls != 4 || len(told) != 3 || told[2] != 3 {
		t.Fatalf("err %v after %d calls, told %v", err, calls, told)
	}

	refused := errors.New("refused")
	calls = 0
	err = backoff.Retry(context.Background(), p, nil, func(context.Context) error {
		calls++
		return backoff.Permanent(refused)
	})
	if err != refused || calls != 1 {
		t.Fatalf("a permanent error: %v after %d calls", err, calls)
	}

	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	err = backoff.Retry(ctx, backoff.Policy{Floor: time.Hour}, nil, func(context.Context) error {
		calls++
		cancel()
		return errors.New("down")
	})
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Fatalf("a canceled retry: %v after %d calls", err, calls)
	}
}

func TestSleepReturnsWhenTheContextIsDone(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := backoff.Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep = %v", err)
	}
	if err := backoff.Sleep(context.Background(), time.Microsecond); err != nil {
		t.Fatalf("Sleep = %v", err)
	}
}

// A loop retrying a peer: waits double from the floor to the cap, each
// drawn with half of it random.
func ExampleBackoff() {
	b := backoff.New(backoff.Policy{Floor: time.Second, Cap: 8 * time.Second, Jitter: backoff.Half},
		rand.New(rand.NewPCG(7, 7)))
	for range 5 {
		w := b.Next()
		c := backoff.Policy{Floor: time.Second, Cap: 8 * time.Second}.Ceiling(b.Failures())
		fmt.Printf("failure %d: wait between %v and %v: %v\n", b.Failures(), c/2, c, w >= c/2 && w <= c)
	}
	b.Reset()
	// Output:
	// failure 1: wait between 500ms and 1s: true
	// failure 2: wait between 1s and 2s: true
	// failure 3: wait between 2s and 4s: true
	// failure 4: wait between 4s and 8s: true
	// failure 5: wait between 4s and 8s: true
}
