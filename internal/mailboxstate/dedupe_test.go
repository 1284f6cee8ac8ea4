package mailboxstate_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

// waitConsumed waits until the processor group has committed every record
// of mailbox.events (as of the call), so whatever it folded from them is
// committed in mailbox.state.
func waitConsumed(t testing.TB, kcfg kafka.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	kc, err := kafka.NewClient(kafka.Config{Brokers: kcfg.Brokers}, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	adm := kadm.NewClient(kc)
	ends, err := adm.ListEndOffsets(ctx, topics.MailboxEvents)
	if err != nil {
		t.Fatal(err)
	}
	for {
		committed, err := adm.FetchOffsets(ctx, mailboxstate.DefaultGroup)
		if err == nil {
			behind := 0
			ends.Each(func(o kadm.ListedOffset) {
				if c, ok := committed.Lookup(o.Topic, o.Partition); o.Offset > 0 && (!ok || c.At < o.Offset) {
					behind++
				}
			})
			if behind == 0 {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the processor did not consume mailbox.events in time (last error %v)", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitMembers waits until the processor group is stable with n members (or
// empty, for n = 0).
func waitMembers(t testing.TB, kcfg kafka.Config, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	kc, err := kafka.NewClient(kafka.Config{Brokers: kcfg.Brokers}, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	adm := kadm.NewClient(kc)
	for {
		gs, err := adm.DescribeGroups(ctx, mailboxstate.DefaultGroup)
		if g, ok := gs[mailboxstate.DefaultGroup]; err == nil && ok && len(g.Members) == n &&
			(g.State == "Stable" || n == 0 && g.State == "Empty") {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("group did not settle with %d members", n)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// produceDated produces records carrying their own (past) timestamps: the
// delivery timeout, which franz-go counts from a record's timestamp, is off.
func produceDated(t testing.TB, kcfg kafka.Config, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kafka.NewProducer(kcfg, kgo.RecordDeliveryTimeout(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// history returns, per mailbox, the ce_ids of its mailbox.state records in
// log order, and the last record of each.
func history(t testing.TB, kcfg kafka.Config) (ids map[string][]string, last map[string]*kgo.Record) {
	t.Helper()
	ids, last = map[string][]string{}, map[string]*kgo.Record{}
	for _, r := range readCommitted(t, kcfg, topics.MailboxState) {
		id, _ := topics.Header(r, topics.HeaderID)
		ids[string(r.Key)] = append(ids[string(r.Key)], id)
		last[string(r.Key)] = r
	}
	return ids, last
}

func eventIDs(evs ...domain.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

// checkLive fails unless r is the live state folded from e.
func checkLive(t testing.TB, r *kgo.Record, e domain.Event) {
	t.Helper()
	m, live, err := mailboxstate.Decode(r)
	if err != nil || !live {
		t.Fatalf("%s: live=%v err=%v, want the state of %s", r.Key, live, err, e.ID)
	}
	if want := mailboxstate.FromAdded(e, e.Data.(*domain.MailboxAdded)); !m.SameSync(want) || m.SourceEventID != e.ID {
		t.Fatalf("%s: state from %s (%s), want from %s (%s)", r.Key, m.SourceEventID, m.Address, e.ID, want.Address)
	}
}

func checkRemoved(t testing.TB, r *kgo.Record) {
	t.Helper()
	if _, live, err := mailboxstate.Decode(r); err != nil || live {
		t.Fatalf("%s: live=%v err=%v, want a tombstone", r.Key, live, err)
	}
}

func duplicates(t testing.TB, reg *prometheus.Registry) float64 {
	t.Helper()
	return counter(t, reg, "mailplane_mailbox_state_records_total", "duplicate")
}

// counter returns the value of the series of name whose outcome label is
// outcome.
func counter(t testing.TB, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestDuplicateAddedAfterRemovalDoesNotResurrect produces a mailbox.added
// again (same ce_id) after the mailbox's removal: late, in a later
// transaction, and in the same batch as the original.
func TestDuplicateAddedAfterRemovalDoesNotResurrect(t *testing.T) {
	t.Parallel()
	kcfg := broker(t)
	reg := prometheus.NewRegistry()
	start(t, kcfg, mailboxstate.WithRegisterer(reg))
	g := newGen(11)
	late, batched := g.uuid(), g.uuid()
	addLate := g.added(late)
	rmLate := g.event(&domain.MailboxRemoved{MailboxID: late, Reason: "closed"})
	addB := g.added(batched)
	rmB := g.event(&domain.MailboxRemoved{MailboxID: batched, Reason: "closed"})

	produce(t, kcfg, encode(t, addLate, rmLate, addB, addB, rmB, addB)...)
	waitConsumed(t, kcfg)
	// The late copy: the retry of a request whose answer was lost.
	produce(t, kcfg, encode(t, addLate)...)
	waitConsumed(t, kcfg)

	ids, last := history(t, kcfg)
	if want := eventIDs(addLate, rmLate); !slices.Equal(ids[late], want) {
		t.Errorf("%s: records from %v, want %v", late, ids[late], want)
	}
	if want := eventIDs(addB, rmB); !slices.Equal(ids[batched], want) {
		t.Errorf("%s: records from %v, want %v", batched, ids[batched], want)
	}
	checkRemoved(t, last[late])
	checkRemoved(t, last[batched])
	if got := duplicates(t, reg); got != 3 {
		t.Errorf("duplicates counted %v, want 3", got)
	}
	// As the interactive consumer: each of the 7 records folded is one
	// latency sample, and no partition it owns is behind.
	sts, err := sla.Statuses(reg)
	if err != nil || len(sts) != 1 || sts[0].Consumer.Name != sla.MailboxState || sts[0].Applied != 7 || len(sts[0].Partitions) == 0 {
		t.Fatalf("consumer statuses %+v (%v), want mailbox-state with 7 records applied", sts, err)
	}
	for _, pl := range sts[0].Partitions {
		if pl.Records != 0 || pl.Seconds != 0 {
			t.Errorf("partition %d behind after everything was folded: %+v", pl.Partition, pl)
		}
	}
}

// TestDuplicateRemovalAfterReAddDoesNotRemove produces a mailbox.removed
// again after the mailbox was added back, and the first mailbox.added again
// after that (which would bring back its old details).
func TestDuplicateRemovalAfterReAddDoesNotRemove(t *testing.T) {
	t.Parallel()
	kcfg := broker(t)
	start(t, kcfg)
	g := newGen(12)
	id := g.uuid()
	add1 := g.added(id)
	rm := g.event(&domain.MailboxRemoved{MailboxID: id, Reason: "moved"})
	add2 := g.added(id)
	produce(t, kcfg, encode(t, add1, rm, add2)...)
	waitConsumed(t, kcfg)
	produce(t, kcfg, encode(t, rm)...)
	waitConsumed(t, kcfg)
	produce(t, kcfg, encode(t, add1)...)
	waitConsumed(t, kcfg)

	ids, last := history(t, kcfg)
	if want := eventIDs(add1, rm, add2); !slices.Equal(ids[id], want) {
		t.Errorf("records from %v, want %v", ids[id], want)
	}
	checkLive(t, last[id], add2)
}

// TestDuplicatesRecognisedAcrossAssignments moves the input partitions
// between processors (a second member joins, then leaves; then a restart)
// and produces copies of earlier events after each move: the new owner of a
// partition knows what its predecessors applied, and a member that gets a
// partition back does not trust what it knew before.
func TestDuplicatesRecognisedAcrossAssignments(t *testing.T) {
	t.Parallel()
	kcfg := broker(t)
	g := newGen(13)
	ids := make([]string, 32)
	adds := map[string]domain.Event{}
	rms := map[string]domain.Event{}
	readds := map[string]domain.Event{}
	var phase1, phase2 []domain.Event
	for i := range ids {
		ids[i] = g.uuid()
		adds[ids[i]] = g.added(ids[i])
		phase1 = append(phase1, adds[ids[i]])
	}
	for _, id := range ids {
		rms[id] = g.event(&domain.MailboxRemoved{MailboxID: id, Reason: "r"})
		phase2 = append(phase2, rms[id])
	}

	// Phase 1: one member applies the adds.
	stop1 := start(t, kcfg)
	produce(t, kcfg, encode(t, phase1...)...)
	waitConsumed(t, kcfg)

	// Phase 2: a second member takes some partitions and applies the
	// removals there.
	stop2 := start(t, kcfg, mailboxstate.WithTransactionalID("mailplane-mailbox-state-2"))
	waitMembers(t, kcfg, 2)
	produce(t, kcfg, encode(t, phase2...)...)
	waitConsumed(t, kcfg)

	// Phase 3: the second member leaves; the first gets its partitions
	// back. Copies of the adds would bring the mailboxes back, copies of
	// the removals would be applied twice.
	stop2()
	waitMembers(t, kcfg, 1)
	produce(t, kcfg, encode(t, phase1...)...)
	produce(t, kcfg, encode(t, phase2...)...)
	waitConsumed(t, kcfg)

	// Phase 4: a restart. Some mailboxes are added again (new events),
	// then every old event is produced once more.
	stop1()
	start(t, kcfg)
	var phase4 []domain.Event
	for _, id := range ids[:8] {
		readds[id] = g.added(id)
		phase4 = append(phase4, readds[id])
	}
	produce(t, kcfg, encode(t, phase4...)...)
	produce(t, kcfg, encode(t, append(append(phase1, phase2...), phase4...)...)...)
	waitConsumed(t, kcfg)

	got, last := history(t, kcfg)
	for _, id := range ids {
		want := eventIDs(adds[id], rms[id])
		if e, ok := readds[id]; ok {
			want = append(want, e.ID)
			checkLive(t, last[id], e)
		} else {
			checkRemoved(t, last[id])
		}
		if !slices.Equal(got[id], want) {
			t.Errorf("%s: records from %v, want %v", id, got[id], want)
		}
	}
}

// TestDedupeWindowIsTheBound shows the documented bound with a one-hour
// window and fixed record timestamps: a copy within the window of its
// original is skipped, a later one is applied again; a restart keeps both
// decisions (the changelog restores the re-applied id with its new time).
func TestDedupeWindowIsTheBound(t *testing.T) {
	t.Parallel()
	kcfg := broker(t)
	window := mailboxstate.WithDedupeWindow(time.Hour)
	stop := start(t, kcfg, window)
	g := newGen(14)
	id := g.uuid()
	add := g.added(id)
	rm := g.event(&domain.MailboxRemoved{MailboxID: id, Reason: "r"})
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	at := func(d time.Duration, e domain.Event) *kgo.Record {
		r := encode(t, e)[0]
		r.Timestamp = t0.Add(d)
		return r
	}
	produceDated(t, kcfg, at(0, add), at(time.Minute, rm))
	waitConsumed(t, kcfg)
	produceDated(t, kcfg, at(30*time.Minute, add)) // inside the window: skipped
	waitConsumed(t, kcfg)
	produceDated(t, kcfg, at(2*time.Hour, add)) // beyond it: applied again
	waitConsumed(t, kcfg)

	ids, last := history(t, kcfg)
	if want := eventIDs(add, rm, add); !slices.Equal(ids[id], want) {
		t.Fatalf("records from %v, want %v", ids[id], want)
	}
	checkLive(t, last[id], add)
	// Sweeping at 2h forgot the removal's id: a tombstone in the
	// changelog.
	tombstoned := false
	for _, r := range readCommitted(t, kcfg, topics.MailboxStateDedupe) {
		if r.Value == nil && string(r.Key) == mailboxstate.DefaultGroup+"/"+rm.ID {
			tombstoned = true
		}
	}
	if !tombstoned {
		t.Error("the removal's id left the window but has no changelog tombstone")
	}

	stop()
	start(t, kcfg, window)
	produceDated(t, kcfg, at(2*time.Hour+time.Minute, rm))    // its id was forgotten: applied
	produceDated(t, kcfg, at(2*time.Hour+2*time.Minute, add)) // within the window of the re-application: skipped
	waitConsumed(t, kcfg)
	ids, last = history(t, kcfg)
	if want := eventIDs(add, rm, add, rm); !slices.Equal(ids[id], want) {
		t.Fatalf("after restart: records from %v, want %v", ids[id], want)
	}
	checkRemoved(t, last[id])
}

// TestRewindRefolds rewinds the processor's offsets to zero, the way
// mailbox.state is rebuilt: the events are folded again, not taken for
// copies of themselves, and the copies in the log are skipped as before.
func TestRewindRefolds(t *testing.T) {
	t.Parallel()
	kcfg := broker(t)
	g := newGen(15)
	var evs []domain.Event
	var ids []string
	for range 12 {
		id := g.uuid()
		ids = append(ids, id)
		add := g.added(id)
		evs = append(evs, add, g.event(&domain.MailboxRemoved{MailboxID: id, Reason: "r"}), add, g.added(id))
	}
	stop := start(t, kcfg)
	produce(t, kcfg, encode(t, evs...)...)
	waitConsumed(t, kcfg)
	stop()
	first, _ := history(t, kcfg)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kc, err := kafka.NewClient(kafka.Config{Brokers: kcfg.Brokers}, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	adm := kadm.NewClient(kc)
	waitMembers(t, kcfg, 0)
	var zero kadm.Offsets
	for p := range int32(topics.MailboxEventsPartitions) {
		zero.Add(kadm.Offset{Topic: topics.MailboxEvents, Partition: p, At: 0, LeaderEpoch: -1})
	}
	if err := adm.CommitAllOffsets(ctx, mailboxstate.DefaultGroup, zero); err != nil {
		t.Fatal(err)
	}

	start(t, kcfg)
	waitConsumed(t, kcfg)
	second, _ := history(t, kcfg)
	for _, id := range ids {
		f := first[id]
		if len(f) != 3 {
			t.Fatalf("%s: first pass records from %v, want add, remove, re-add", id, f)
		}
		if want := append(slices.Clone(f), f...); !slices.Equal(second[id], want) {
			t.Errorf("%s: records from %v after the rewind, want the first pass twice %v", id, second[id], want)
		}
	}
}

// TestExactlyOnceByIDAcrossRestarts is TestExactlyOnceAcrossRestarts with
// copies: a fifth of the records are earlier events produced again. Every
// distinct add or removal has exactly one output, copies none, and each
// mailbox ends in the state of its last distinct event.
func TestExactlyOnceByIDAcrossRestarts(t *testing.T) {
	t.Parallel()
	kcfg := broker(t)
	g := newGen(16)
	mbs := make([]string, 100)
	for i := range mbs {
		mbs[i] = g.uuid()
	}
	n := 2000
	if testing.Short() {
		n = 500
	}
	var log, distinct []domain.Event
	lastOf := map[string]domain.Event{}
	for range n {
		if len(distinct) > 0 && g.rng.IntN(5) == 0 {
			log = append(log, distinct[g.rng.IntN(len(distinct))])
			continue
		}
		id := mbs[g.rng.IntN(len(mbs))]
		var e domain.Event
		if g.rng.IntN(3) == 0 {
			e = g.event(&domain.MailboxRemoved{MailboxID: id, Reason: "r"})
		} else {
			e = g.added(id)
		}
		log = append(log, e)
		distinct = append(distinct, e)
		lastOf[id] = e
	}
	recs := encode(t, log...)
	var wg sync.WaitGroup
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(17, 18))
		for i := 0; i < len(recs); i += 100 {
			produce(t, kcfg, recs[i:min(i+100, len(recs))]...)
			time.Sleep(time.Duration(20+rng.IntN(30)) * time.Millisecond)
		}
	})
	rng := rand.New(rand.NewPCG(19, 20))
	for range 6 {
		stop := start(t, kcfg, mailboxstate.WithMaxBatch(50))
		time.Sleep(time.Duration(150+rng.IntN(400)) * time.Millisecond)
		stop()
	}
	wg.Wait()
	start(t, kcfg)
	waitConsumed(t, kcfg)

	out := readCommitted(t, kcfg, topics.MailboxState)
	seen := map[string]int{}
	last := map[string]*kgo.Record{}
	for _, r := range out {
		id, _ := topics.Header(r, topics.HeaderID)
		seen[id]++
		last[string(r.Key)] = r
	}
	for _, e := range distinct {
		if seen[e.ID] != 1 {
			t.Errorf("event %s (%s) has %d outputs, want 1", e.ID, e.Type, seen[e.ID])
		}
	}
	if len(out) != len(distinct) {
		t.Errorf("%d outputs for %d distinct events (%d records)", len(out), len(distinct), len(log))
	}
	for id, e := range lastOf {
		if _, ok := e.Data.(*domain.MailboxAdded); ok {
			checkLive(t, last[id], e)
		} else {
			checkRemoved(t, last[id])
		}
	}
}

// TestAbortedTransactionRefolds fails the processor's transactional offset
// commit once, so its transaction aborts and the same session folds the
// batch again: the ids the aborted fold remembered must not make the
// refold take the batch for copies of itself.
func TestAbortedTransactionRefolds(t *testing.T) {
	t.Parallel()
	fake := kafkatest.Fake(t)
	kcfg := kafka.Config{Brokers: fake.ListenAddrs(), ClientID: "mailboxstate-test"}
	func() {
		kc, err := kafka.NewClient(kafka.Config{Brokers: kcfg.Brokers}, kafka.KindAdmin)
		if err != nil {
			t.Fatal(err)
		}
		defer kc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := topics.Apply(ctx, kc, topics.Catalog(topics.Config{StatePartitions: statePartitions})); err != nil {
			t.Fatal(err)
		}
	}()
	g := newGen(21)
	var evs []domain.Event
	for range 20 {
		id := g.uuid()
		add := g.added(id)
		evs = append(evs, add, g.event(&domain.MailboxRemoved{MailboxID: id, Reason: "r"}), add)
	}
	reg := prometheus.NewRegistry()
	fault := fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.TxnOffsetCommit}, Group: mailboxstate.DefaultGroup, Err: kerr.RebalanceInProgress})
	produce(t, kcfg, encode(t, evs...)...)
	start(t, kcfg, mailboxstate.WithRegisterer(reg))
	waitConsumed(t, kcfg)
	if fault.Hits() != 1 || counter(t, reg, "mailplane_mailbox_state_transactions_total", "aborted") < 1 {
		t.Fatalf("fault hits %d, aborted transactions %v: the test did not abort a transaction",
			fault.Hits(), counter(t, reg, "mailplane_mailbox_state_transactions_total", "aborted"))
	}
	ids, last := history(t, kcfg)
	for i := 0; i < len(evs); i += 3 {
		id := evs[i].Subject
		if want := eventIDs(evs[i], evs[i+1]); !slices.Equal(ids[id], want) {
			t.Errorf("%s: records from %v, want %v", id, ids[id], want)
		}
		checkRemoved(t, last[id])
	}
}
