package mailsync

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPollSlots: at most n polls of a host hold a slot at once, a release
// counts once however often it is called, a poll whose context ends while
// it waits takes no slot, and hosts do not share slots.
func TestPollSlots(t *testing.T) {
	t.Parallel()
	slots := NewHostSlots(3)
	ctx := context.Background()

	var held, most atomic.Int32
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			job := &Job{polls: slots}
			job.Mailbox.IMAP.Host = "imap.example.com"
			release, err := job.PollSlot(ctx)
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
		r, err := slots.Acquire(ctx, "IMAP.example.com")
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, r)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := slots.Acquire(wctx, "imap.example.com"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a fourth poll got %v, want to wait until its deadline", err)
	}
	// The one that gave up took nothing: one release makes room for one.
	releases[0]()
	releases[0]()
	r, err := slots.Acquire(ctx, "IMAP.example.com")
	if err != nil {
		t.Fatal(err)
	}
	tctx, tcancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer tcancel()
	if _, err := slots.Acquire(tctx, "imap.example.com"); err == nil {
		t.Fatal("a double release made room for two polls")
	}
	// Another host has slots of its own.
	o, err := slots.Acquire(ctx, "imap.other.example")
	if err != nil {
		t.Fatal(err)
	}
	o()
	r()
	for _, r := range releases[1:] {
		r()
	}
	slots.mu.Lock()
	defer slots.mu.Unlock()
	if len(slots.hosts) != 0 {
		t.Fatalf("%d hosts still kept with no poll on them", len(slots.hosts))
	}
}

// TestPollSlotsUnbounded: PollsInFlight below zero bounds nothing.
func TestPollSlotsUnbounded(t *testing.T) {
	t.Parallel()
	slots := NewHostSlots(-1)
	for range 1000 {
		if _, err := slots.Acquire(context.Background(), "imap.example.com"); err != nil {
			t.Fatal(err)
		}
	}
}
