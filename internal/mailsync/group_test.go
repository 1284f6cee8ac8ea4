package mailsync_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailsync"
)

// TestGracefulLeave runs three workers in this process, then has one leave
// gracefully and another join, five times over. After each change every
// live mailbox runs exactly once, at its partition's current epoch; no write
// lands at a stale epoch. It measures the time from a member's leaving to
// every moved mailbox running on its new owner.
func TestGracefulLeave(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 12)
	f := newFixture(50)
	n := 600
	if testing.Short() {
		n = 120
	}
	var mbs []domain.MailboxStateRecord
	for range n {
		mbs = append(mbs, f.mailbox("", time.Hour))
	}
	e.produce(stateRecords(t, mbs...)...)
	live := ids(mbs)

	members := []*member{}
	next := 0
	add := func() {
		next++
		members = append(members, e.start(testConfig(t, fmt.Sprintf("g%d", next)), nil))
	}
	for range 3 {
		add()
	}
	waitFor(t, 30*time.Second, "three members running everything", func() (bool, string) {
		return exactlyOnce(t, e.db.Pool, live, members...)
	})

	var leaves []time.Duration
	for round := range 5 {
		leaving := members[0]
		moved := len(leaving.rec.Running())
		start := time.Now()
		leaving.stop()
		members = members[1:]
		waitFor(t, 30*time.Second, "the remaining members running everything", func() (bool, string) {
			return exactlyOnce(t, e.db.Pool, live, members...)
		})
		d := time.Since(start)
		leaves = append(leaves, d)
		t.Logf("round %d: graceful leave moved %d mailboxes; all running on new owners after %s", round, moved, d)
		add()
		waitFor(t, 30*time.Second, "a new member sharing the work", func() (bool, string) {
			if ok, why := exactlyOnce(t, e.db.Pool, live, members...); !ok {
				return false, why
			}
			for _, m := range members {
				if len(m.rec.Running()) == 0 {
					return false, m.w.ID() + " runs nothing"
				}
			}
			return true, ""
		})
	}
	t.Logf("graceful leave to all moved mailboxes running (%d mailboxes, 3 members, 12 partitions): median %s, max %s",
		n, percentile(leaves, 0.5), percentile(leaves, 1))
	if s := staleWrites(t, e.db.Pool); s != 0 {
		t.Errorf("%d writes landed at a stale epoch", s)
	}
	for _, m := range members {
		if s := m.rec.Stats(); s.Overlaps != 0 {
			t.Errorf("%s: %+v", m.w.ID(), s)
		}
	}
}

// TestBlackholedMember cuts one member off from the group coordinator: its
// heartbeats, joins and syncs are swallowed by the broker, while its
// fetches and database writes still work (the network partition that
// docs/architecture.md §14 measured). Its watchdog must stop its runners before
// the other member takes its partitions, so nothing it writes is even
// refused; then the other member runs everything. When the partition
// heals, the member rejoins and gets work again.
func TestBlackholedMember(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 6)
	f := newFixture(60)
	var mbs []domain.MailboxStateRecord
	for range 120 {
		mbs = append(mbs, f.mailbox("", time.Hour))
	}
	e.produce(stateRecords(t, mbs...)...)
	live := ids(mbs)
	beat := &mailsync.RecordingRunner{Beat: 100 * time.Millisecond}
	// The test's 2 s session is a third of production's 6 s, but stopping
	// 60 runners takes the same few hundred milliseconds: the default margin
	// (a quarter of the session, 0.5 s here, 1.5 s in production) would leave
	// the test a third of production's slack. 0.8 s keeps the question
	// (does the watchdog stop everything before the coordinator gives the
	// partitions away?) without measuring the machine's speed.
	vcfg := testConfig(t, "victim")
	vcfg.WatchdogMargin = 800 * time.Millisecond
	e.withRunnerPool(16)
	victim := e.start(vcfg, beat)
	other := e.start(testConfig(t, "other"), nil)
	waitFor(t, 30*time.Second, "both members running", func() (bool, string) {
		if ok, why := exactlyOnce(t, e.db.Pool, live, victim, other); !ok {
			return false, why
		}
		return len(victim.rec.Running()) > 0 && len(other.rec.Running()) > 0, "one member runs nothing"
	})
	victimParts := map[int32]bool{}
	for _, info := range victim.rec.Running() {
		victimParts[info.Partition] = true
	}

	info := e.cluster.GroupInfo(mailsync.DefaultGroup)
	var victimID string
	for _, m := range info.Members {
		if m.ClientID == "sync-victim" {
			victimID = m.MemberID
		}
	}
	if victimID == "" {
		t.Fatalf("victim not in group %+v", info)
	}
	var healed atomic.Bool
	var dropped atomic.Int64
	blackhole := func(req kmsg.Request) (kmsg.Response, error, bool) {
		if healed.Load() {
			return nil, nil, false
		}
		var id string
		switch r := req.(type) {
		case *kmsg.HeartbeatRequest:
			id = r.MemberID
		case *kmsg.JoinGroupRequest:
			id = r.MemberID
		case *kmsg.SyncGroupRequest:
			id = r.MemberID
		}
		if id != victimID {
			return nil, nil, false
		}
		dropped.Add(1)
		e.cluster.KeepControl()
		return nil, nil, true // no answer, ever
	}
	cut := time.Now()
	for _, k := range []kmsg.Key{kmsg.Heartbeat, kmsg.JoinGroup, kmsg.SyncGroup} {
		e.cluster.ControlKey(int16(k), blackhole)
	}

	// The victim's watchdog stops its runners.
	waitFor(t, 10*time.Second, "the victim's watchdog to stop its runners", func() (bool, string) {
		return len(victim.rec.Running()) == 0, fmt.Sprintf("%d running", len(victim.rec.Running()))
	})
	// When the last runner actually ended (the test notices later,
	// polling, the later the busier the machine).
	stopped := victim.rec.Stats().LastStop
	if got := counterValue(t, victim.reg, "mailplane_sync_watchdog_stops_total"); got != 1 {
		t.Errorf("victim watchdog stops = %v, want 1", got)
	}
	// The other member takes over everything.
	waitFor(t, 20*time.Second, "the other member running everything", func() (bool, string) {
		return exactlyOnce(t, e.db.Pool, live, victim, other)
	})
	// When did the other member take the victim's partitions?
	var firstTakeover time.Time
	if err := e.db.Pool.QueryRow(context.Background(), `SELECT min(acquired_at) FROM sync_partition_epochs
        WHERE owner = 'other' AND partition = ANY($1) AND acquired_at > $2`, keys(victimParts), cut).Scan(&firstTakeover); err != nil {
		t.Fatal(err)
	}
	t.Logf("black-holed at 0; victim's runners all stopped by %s; other member took the first of them at %s (%d requests dropped)",
		stopped.Sub(cut), firstTakeover.Sub(cut), dropped.Load())
	if !firstTakeover.After(stopped) {
		t.Errorf("the other member took a partition %s before the victim had stopped", stopped.Sub(firstTakeover))
	}
	if s := victim.rec.Stats(); s.Fenced != 0 || s.Overlaps != 0 {
		t.Errorf("victim %+v: it wrote after losing the partitions", s)
	}
	if got := count(t, e.db.Pool, `SELECT count(*) FROM sync_fenced_writes WHERE owner = 'victim'`); got != 0 {
		t.Errorf("%d fenced writes by the victim; the watchdog should have stopped it first", got)
	}

	// Heal: the victim finds it was expelled, rejoins and gets work.
	healed.Store(true)
	waitFor(t, 60*time.Second, "the victim back at work", func() (bool, string) {
		if ok, why := exactlyOnce(t, e.db.Pool, live, victim, other); !ok {
			return false, why
		}
		return len(victim.rec.Running()) > 0, "victim runs nothing"
	})
	if s := staleWrites(t, e.db.Pool); s != 0 {
		t.Errorf("%d writes landed at a stale epoch", s)
	}
}

func keys(m map[int32]bool) []int32 {
	out := make([]int32, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestFencedPartitionResumes: a worker whose writes find a newer epoch
// (someone else took one: here an intruder, as a zombie's late assignment
// would) stops that partition's runners at once. The group still says the
// partition is the worker's, so once two heartbeats confirm it, the worker
// takes a newer epoch and runs the partition again.
func TestFencedPartitionResumes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	f := newFixture(90)
	var mbs []domain.MailboxStateRecord
	for range 20 {
		mbs = append(mbs, f.mailbox("", time.Hour))
	}
	e.produce(stateRecords(t, mbs...)...)
	live := ids(mbs)
	rec := &mailsync.RecordingRunner{Beat: 50 * time.Millisecond}
	m := e.start(testConfig(t, "owner"), rec)
	waitFor(t, 20*time.Second, "everything running", func() (bool, string) { return exactlyOnce(t, e.db.Pool, live, m) })
	before := epochs(t, e.db.Pool)

	intruder := mailsync.NewFence(e.db.Pool, nil, 0)
	taken, err := intruder.Acquire(context.Background(), "intruder", []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the owner to resume partition 0 under a newer epoch", func() (bool, string) {
		ep := epochs(t, e.db.Pool)
		if ep[0] <= taken[0] {
			return false, fmt.Sprintf("epoch of partition 0 still %d", ep[0])
		}
		return exactlyOnce(t, e.db.Pool, live, m)
	})
	if got := count(t, e.db.Pool, `SELECT count(*) FROM sync_fenced_writes WHERE owner = 'owner' AND partition = 0 AND epoch = $1`, before[0]); got == 0 {
		t.Error("no fenced write recorded for the owner's old epoch")
	}
	if ep := epochs(t, e.db.Pool); ep[1] != before[1] {
		t.Errorf("partition 1 changed epoch %d -> %d; only partition 0 was intruded on", before[1], ep[1])
	}
	if s := staleWrites(t, e.db.Pool); s != 0 {
		t.Errorf("%d stale writes", s)
	}
	if got := counterValue(t, m.reg, "mailplane_sync_fenced_writes_total"); got == 0 {
		t.Error("mailplane_sync_fenced_writes_total is 0")
	}
}

// TestRebalanceWaitingOnDeadMember: a member goes silent and, before its
// session runs out, another joins: the coordinator's rebalance waits for
// the silent one until its session expires, and the survivors wait in
// JoinGroup all that time, their heartbeats stopped. Their watchdogs must
// not take that for being cut off (the probe's REBALANCE_IN_PROGRESS
// answers are contact): they stop nothing, while the silent member's
// watchdog stops its runners.
func TestRebalanceWaitingOnDeadMember(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 6)
	f := newFixture(60)
	var mbs []domain.MailboxStateRecord
	for range 60 {
		mbs = append(mbs, f.mailbox("", time.Hour))
	}
	e.produce(stateRecords(t, mbs...)...)
	live := ids(mbs)
	cfg := func(id string) mailsync.Config {
		c := testConfig(t, id)
		// Margin 1 s: a survivor silent for 2 s trips.
		c.SessionTimeout, c.HeartbeatInterval, c.WatchdogMargin = 3*time.Second, 200*time.Millisecond, time.Second
		return c
	}
	victim := e.start(cfg("victim"), nil)
	b := e.start(cfg("b"), nil)
	c := e.start(cfg("c"), nil)
	waitFor(t, 30*time.Second, "three members running", func() (bool, string) {
		if ok, why := exactlyOnce(t, e.db.Pool, live, victim, b, c); !ok {
			return false, why
		}
		return len(victim.rec.Running()) > 0 && len(b.rec.Running()) > 0 && len(c.rec.Running()) > 0, "a member runs nothing"
	})
	var victimID string
	for _, m := range e.cluster.GroupInfo(mailsync.DefaultGroup).Members {
		if m.ClientID == "sync-victim" {
			victimID = m.MemberID
		}
	}
	if victimID == "" {
		t.Fatal("victim not in the group")
	}
	silence := func(req kmsg.Request) (kmsg.Response, error, bool) {
		var id string
		switch r := req.(type) {
		case *kmsg.HeartbeatRequest:
			id = r.MemberID
		case *kmsg.JoinGroupRequest:
			id = r.MemberID
		case *kmsg.SyncGroupRequest:
			id = r.MemberID
		}
		if id != victimID {
			return nil, nil, false
		}
		e.cluster.KeepControl()
		return nil, nil, true
	}
	for _, k := range []kmsg.Key{kmsg.Heartbeat, kmsg.JoinGroup, kmsg.SyncGroup} {
		e.cluster.ControlKey(int16(k), silence)
	}
	cut := time.Now()
	d := e.start(cfg("d"), nil) // joins while the victim's session still runs
	waitFor(t, 30*time.Second, "the rebalance done without the victim", func() (bool, string) {
		return len(d.rec.Running()) > 0, "d runs nothing"
	})
	t.Logf("d running %s after the victim went silent; probes answered: b %v, c %v", time.Since(cut),
		counterValue(t, b.reg, "mailplane_sync_watchdog_probes_total"), counterValue(t, c.reg, "mailplane_sync_watchdog_probes_total"))
	for name, m := range map[string]*member{"b": b, "c": c, "d": d} {
		if got := counterValue(t, m.reg, "mailplane_sync_watchdog_stops_total"); got != 0 {
			t.Errorf("%s's watchdog stopped its runners %v times during the rebalance", name, got)
		}
	}
	if got := counterValue(t, victim.reg, "mailplane_sync_watchdog_stops_total"); got < 1 {
		t.Errorf("the silent victim's watchdog stopped nothing")
	}
	if s := staleWrites(t, e.db.Pool); s != 0 {
		t.Errorf("%d writes landed at a stale epoch", s)
	}
}
