package mailsync

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPollSlots: at most n polls hold a slot at once, slots go first come
// first served, a release counts once however often it is called, and a
// poll whose context ends while it waits takes no slot.
func TestPollSlots(t *testing.T) {
	t.Parallel()
	slots := newPollSlots(3)
	ctx := context.Background()

	var held, most atomic.Int32
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			release, err := (&Job{polls: slots}).PollSlot(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			n := held.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(time.Millisecond)
			held.Add(-1)
			release()
			release() // a second release gives nothing back
		})
	}
	wg.Wait()
	if got := most.Load(); got > 3 || got < 1 {
		t.Fatalf("%d polls held a slot at once, want at most 3", got)
	}

	// All three taken: a fourth waits, and gives up with its context.
	var releases []func()
	for range 3 {
		r, err := slots.acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, r)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := slots.acquire(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a fourth poll got %v, want to wait until its deadline", err)
	}
	// The one that gave up took nothing: one release makes room for one.
	releases[0]()
	releases[0]()
	r, err := slots.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tctx, tcancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer tcancel()
	if _, err := slots.acquire(tctx); err == nil {
		t.Fatal("a double release made room for two polls")
	}
	r()
	for _, r := range releases[1:] {
		r()
	}
}

// TestPollSlotsUnbounded: PollsInFlight below zero bounds nothing.
func TestPollSlotsUnbounded(t *testing.T) {
	t.Parallel()
	slots := newPollSlots(-1)
	for range 1000 {
		if _, err := slots.acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
