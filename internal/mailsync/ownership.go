package mailsync

import (
	"context"
	"slices"
	"sync"
	"time"
)

// ownership is what this worker owns of mailbox.state and under which
// fencing epochs: the safety-critical core of the worker, apart from
// runners and tiers so that it can be reviewed alone. Every other part of
// the worker asks it, never keeps its own copy.
//
// Each partition the group assigned has a claim, which moves
//
//	acquiring --epoch taken--> loading --read to its end--> live
//	                            ^   |                        |
//	                            |   +--------suspend------+  | suspend
//	                     resume |                         v  v
//	               (new epoch) +---------------------- suspended
//
// and is released when the group revokes or loses the partition, or the
// worker leaves.
//
// Invariants:
//   - A claim exists only between the group assigning the partition to
//     this member and taking it back (or the worker leaving).
//   - An epoch is taken only for a claim that is acquiring (just assigned)
//     or suspended (and the group confirmed since that the member still
//     holds the partition), never while the watchdog is tripped: taking an
//     epoch fences every other writer of the partition, its rightful owner
//     included, so only a member the group currently trusts may do it.
//   - Runners run only in a live claim, at the claim's epoch, and every
//     write of theirs and of the partition's tier records is fenced on that
//     epoch in Postgres (Fence): a claim that outlived its ownership in
//     memory cannot write, whatever the rest of the worker believes.
//   - Suspending or releasing a claim is followed by stopping its runners
//     and waiting for them (the worker does this), so the next epoch of the
//     partition, ours or another member's, finds no write of ours in flight.
//
// The lock guards the claims only. It is taken after the worker's and
// never held while calling out, so ownership can be read from any
// goroutine.
type ownership struct {
	fence *Fence
	owner string
	m     *metrics

	mu     sync.Mutex
	claims map[int32]*claim
}

type partState int

const (
	partAcquiring partState = iota // assigned; no epoch yet
	partLoading                    // epoch taken; reading to the end
	partLive                       // runners running
	partSuspended                  // runners stopped (watchdog, fenced); waiting for the group's confirmation
)

func (s partState) String() string {
	return [...]string{"acquiring", "loading", "live", "suspended"}[s]
}

// claim is the ownership of one assigned partition.
type claim struct {
	epoch       int64
	state       partState
	assignedAt  time.Time // monotonic: measures the assignment
	lastAttempt time.Time // of taking an epoch (monotonic)
	suspendedAt time.Time // on the watchdog's (monotonic) clock
	counted     bool      // in the partitions_owned gauge
	measured    bool      // assignment duration observed
}

func newOwnership(fence *Fence, owner string, m *metrics) *ownership {
	return &ownership{fence: fence, owner: owner, m: m, claims: map[int32]*claim{}}
}

// assign claims newly assigned partitions (acquiring) and returns those
// that were not claimed already, in order.
func (o *ownership) assign(ids []int32, now time.Time) []int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var fresh []int32
	for _, id := range slices.Sorted(slices.Values(ids)) {
		if o.claims[id] != nil {
			continue
		}
		o.claims[id] = &claim{state: partAcquiring, assignedAt: now}
		fresh = append(fresh, id)
	}
	return fresh
}

// takeEpochs takes the next epoch of each partition in Postgres (fencing
// every earlier writer) and returns them; the claims move only when the
// caller hands each epoch to loaded or resumed.
func (o *ownership) takeEpochs(ctx context.Context, ids []int32, now time.Time) (map[int32]int64, error) {
	o.mu.Lock()
	for _, id := range ids {
		if c := o.claims[id]; c != nil {
			c.lastAttempt = now
		}
	}
	o.mu.Unlock()
	return o.fence.Acquire(ctx, o.owner, ids)
}

// loaded moves an acquiring claim to loading at epoch; false if the claim
// is gone or no longer acquiring.
func (o *ownership) loaded(id int32, epoch int64) bool {
	return o.move(id, partAcquiring, partLoading, epoch)
}

// resumed moves a suspended claim back to loading, at the new epoch.
func (o *ownership) resumed(id int32, epoch int64) bool {
	return o.move(id, partSuspended, partLoading, epoch)
}

func (o *ownership) move(id int32, from, to partState, epoch int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.claims[id]
	if c == nil || c.state != from {
		return false
	}
	c.epoch, c.state = epoch, to
	o.countLocked(c)
	return true
}

// goLive moves a loading claim to live; ok is false if it was not loading.
// first is true the first time the partition goes live since its
// assignment, with how long that took.
func (o *ownership) goLive(id int32, now time.Time) (took time.Duration, first, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.claims[id]
	if c == nil || c.state != partLoading {
		return 0, false, false
	}
	c.state = partLive
	o.countLocked(c)
	if c.measured {
		return 0, false, true
	}
	c.measured = true
	return now.Sub(c.assignedAt), true, true
}

// suspend moves a live or loading claim to suspended, at now on the
// watchdog's clock, and returns its epoch. With atEpoch > 0, only a live
// claim at that epoch is suspended (a write refused at atEpoch).
func (o *ownership) suspend(id int32, atEpoch int64, now time.Time) (epoch int64, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.claims[id]
	switch {
	case c == nil:
		return 0, false
	case atEpoch > 0 && (c.epoch != atEpoch || c.state != partLive):
		return 0, false
	case c.state != partLive && c.state != partLoading:
		return 0, false
	}
	c.state, c.suspendedAt = partSuspended, now
	o.uncountLocked(c)
	return c.epoch, true
}

// release forgets the claims of ids (the group took the partitions back)
// and returns the epochs they had.
func (o *ownership) release(ids []int32) map[int32]int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[int32]int64{}
	for _, id := range ids {
		c := o.claims[id]
		if c == nil {
			continue
		}
		delete(o.claims, id)
		o.uncountLocked(c)
		out[id] = c.epoch
	}
	return out
}

// get returns a copy of the claim of partition id.
func (o *ownership) get(id int32) (claim, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.claims[id]
	if c == nil {
		return claim{}, false
	}
	return *c, true
}

// live returns the epoch of partition id if its claim is live.
func (o *ownership) live(id int32) (epoch int64, ok bool) {
	c, ok := o.get(id)
	return c.epoch, ok && c.state == partLive
}

// active returns the partitions whose claims are live or loading (the
// partitions whose runners run or are about to), in order.
func (o *ownership) active() []int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ids []int32
	for id, c := range o.claims {
		if c.state == partLive || c.state == partLoading {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// claimed returns every claimed partition, in order.
func (o *ownership) claimed() []int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Sorted(func(yield func(int32) bool) {
		for id := range o.claims {
			if !yield(id) {
				return
			}
		}
	})
}

// writer returns the fenced writer of a runner of mailboxID in partition
// at epoch.
func (o *ownership) writer(partition int32, epoch int64, mailboxID string) Writer {
	return o.fence.Writer(partition, epoch, o.owner, mailboxID)
}

func (o *ownership) countLocked(c *claim) {
	if !c.counted {
		c.counted = true
		o.m.partitionsOwned.Inc()
	}
}

func (o *ownership) uncountLocked(c *claim) {
	if c.counted {
		c.counted = false
		o.m.partitionsOwned.Dec()
	}
}
