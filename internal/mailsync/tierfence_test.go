package mailsync_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/topics"
)

// startRelay runs an outbox relay on the test's schema until the test ends.
func (e *env) startRelay() {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = outbox.NewRelay(e.db.Pool, e.kcfg, outbox.WithPollInterval(50*time.Millisecond)).Run(ctx)
	}()
	e.t.Cleanup(func() { cancel(); <-done })
}

// tierRecords decodes the records of sync.tier, in log order (the tests
// using it have one partition).
func tierRecords(t testing.TB, recs []*kgo.Record) []domain.SyncTierRecord {
	t.Helper()
	var out []domain.SyncTierRecord
	for _, r := range recs {
		rec, live, err := mailsync.DecodeTierRecord(r)
		if err != nil {
			t.Fatalf("sync.tier offset %d: %v", r.Offset, err)
		}
		if live {
			out = append(out, rec)
		}
	}
	return out
}

// tierChanges decodes the tier_changed events of sync.audit.
func tierChanges(t testing.TB, recs []*kgo.Record) []domain.SyncTierChanged {
	t.Helper()
	var out []domain.SyncTierChanged
	for _, r := range recs {
		if typ, _ := topics.Header(r, topics.HeaderType); typ != domain.TypeSyncTierChanged {
			continue
		}
		var c domain.SyncTierChanged
		if err := json.Unmarshal(r.Value, &c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// TestStaleTierWriteFenced: tier records are written through the outbox in
// a transaction fenced on the partition's epoch. Once a second owner took
// an epoch, the first owner's tier write is refused (ErrFenced), counted
// and recorded, and its records never reach sync.tier or sync.audit, while
// the second owner's do, after the first owner's earlier ones. A write in
// flight when a third owner takes its epoch holds the epoch back until it
// commits, so it lands before anything of the third owner.
func TestStaleTierWriteFenced(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.startRelay()
	ctx := context.Background()
	fencedCount := prometheus.NewCounter(prometheus.CounterOpts{Name: "fenced"})
	reg := prometheus.NewRegistry()
	reg.MustRegister(fencedCount)
	f := mailsync.NewFence(e.db.Pool, fencedCount, time.Second)
	mb := newFixture(110).uuid()

	a, err := f.Acquire(ctx, "a", []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	if err := mailsync.WriteTierChange(ctx, f, 0, a[0], "a", mb, domain.SyncTierWarm, domain.SyncTierCold, domain.SyncReasonInactive); err != nil {
		t.Fatalf("a's write at its current epoch: %v", err)
	}
	b, err := f.Acquire(ctx, "b", []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	// a still believes it owns the partition (a zombie) and promotes.
	err = mailsync.WriteTierChange(ctx, f, 0, a[0], "a", mb, domain.SyncTierCold, domain.SyncTierHot, domain.SyncReasonSession)
	var fe *mailsync.FencedError
	if !errors.Is(err, mailsync.ErrFenced) || !errors.As(err, &fe) || fe.Epoch != a[0] || fe.Current != b[0] {
		t.Fatalf("stale tier write: %v, want refused at epoch %d (current %d)", err, a[0], b[0])
	}
	if got := counterValue(t, reg, "fenced"); got != 1 {
		t.Errorf("fenced counter %v, want 1", got)
	}
	if got := count(t, e.db.Pool, `SELECT count(*) FROM sync_fenced_writes
        WHERE owner = 'a' AND kind = 'tier' AND epoch = $1 AND current_epoch = $2 AND mailbox_id = $3`, a[0], b[0], mb); got != 1 {
		t.Errorf("refused tier writes recorded: %d, want 1", got)
	}
	if err := mailsync.WriteTierChange(ctx, f, 0, b[0], "b", mb, domain.SyncTierCold, domain.SyncTierWarm, domain.SyncReasonDefault); err != nil {
		t.Fatalf("b's write: %v", err)
	}

	// A tier write in flight when the next owner takes its epoch: the
	// epoch waits for the commit, so the write lands, and before anything
	// the next owner writes.
	inTx, release := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		held <- mailsync.WriteTierChangeHolding(ctx, f, 0, b[0], "b", mb, domain.SyncTierWarm, domain.SyncTierHot, domain.SyncReasonSession,
			func() { close(inTx); <-release })
	}()
	<-inTx
	acquired := make(chan map[int32]int64, 1)
	go func() {
		c, err := f.Acquire(ctx, "c", []int32{0})
		if err != nil {
			t.Error(err)
		}
		acquired <- c
	}()
	select {
	case <-acquired:
		t.Fatal("an epoch was taken while a tier write of the previous epoch was in flight")
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatalf("b's tier write in flight: %v", err)
	}
	c := <-acquired
	if err := mailsync.WriteTierChange(ctx, f, 0, c[0], "c", mb, domain.SyncTierHot, domain.SyncTierCold, domain.SyncReasonInactive); err != nil {
		t.Fatalf("c's write: %v", err)
	}

	var recs []domain.SyncTierRecord
	waitFor(t, 10*time.Second, "c's tier record on sync.tier", func() (bool, string) {
		recs = tierRecords(t, readTopic(t, e, topics.SyncTier))
		for _, r := range recs {
			if r.Epoch == c[0] {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d records", len(recs))
	})
	// In log order: no record of a stale epoch after a newer one, so
	// compaction keeps c's.
	want := []domain.SyncTierRecord{
		{MailboxID: mb, Tier: domain.SyncTierCold, Partition: 0, Epoch: a[0], Owner: "a"},
		{MailboxID: mb, Tier: domain.SyncTierWarm, Partition: 0, Epoch: b[0], Owner: "b"},
		{MailboxID: mb, Tier: domain.SyncTierHot, Partition: 0, Epoch: b[0], Owner: "b"},
		{MailboxID: mb, Tier: domain.SyncTierCold, Partition: 0, Epoch: c[0], Owner: "c"},
	}
	if len(recs) != len(want) {
		t.Fatalf("sync.tier holds %+v, want a's cold, b's warm and hot, c's cold", recs)
	}
	for i, r := range recs {
		w := want[i]
		if r.MailboxID != w.MailboxID || r.Tier != w.Tier || r.Epoch != w.Epoch || r.Owner != w.Owner {
			t.Errorf("sync.tier record %d is %+v, want %+v", i, r, w)
		}
	}
	changes := tierChanges(t, readTopic(t, e, topics.SyncAudit))
	if len(changes) != len(want) {
		t.Errorf("tier_changed events %+v, want one per committed change (none of a's refused one)", changes)
	}
	for _, ch := range changes {
		if ch.Owner == "a" && ch.To == domain.SyncTierHot {
			t.Errorf("the refused change reached sync.audit: %+v", ch)
		}
	}
	// Taking each epoch announced it, in the same transaction.
	announced := 0
	for _, r := range readTopic(t, e, topics.SyncAudit) {
		if typ, _ := topics.Header(r, topics.HeaderType); typ == domain.TypeSyncOwnershipAcquired {
			announced++
		}
	}
	if announced != 3 {
		t.Errorf("%d ownership_acquired events, want 3", announced)
	}
	if n := count(t, e.db.Pool, `SELECT count(*) FROM event_outbox`); n != 0 {
		t.Errorf("%d records left in the outbox", n)
	}
}

// TestStaleOwnerTierFenced goes through a worker: after an intruder takes
// the partition's epoch (as a new owner would while this worker is a
// zombie), a user.active still promotes the mailbox in the runner at once,
// but the tier record decided under the stale epoch is refused, counted and
// never published. The worker stops the partition's runners, resumes under
// a newer epoch (the group still says the partition is its), and records
// the tier there.
func TestStaleOwnerTierFenced(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	f := newFixture(111)
	user := f.uuid()
	box := f.mailbox(user, time.Hour)
	watch := &tierWatch{}
	// No beat rows: after the intrusion the tier write is the partition's
	// first write, so it is the one the fence refuses.
	rec := &mailsync.RecordingRunner{OnTier: watch.on}
	m := e.start(testConfig(t, "stale-owner"), rec)
	e.produce(stateRecord(t, box))
	live := map[string]bool{box.MailboxID: true}
	waitFor(t, 20*time.Second, "the mailbox running", func() (bool, string) { return exactlyOnce(t, e.db.Pool, live, m) })
	waitFor(t, 10*time.Second, "the start row", func() (bool, string) {
		n := count(t, e.db.Pool, `SELECT count(*) FROM sync_recorder_writes WHERE kind = 'start'`)
		return n == 1, fmt.Sprintf("%d start rows", n)
	})
	stale := epochs(t, e.db.Pool)[0]
	taken, err := mailsync.NewFence(e.db.Pool, nil, 0).Acquire(context.Background(), "intruder", []int32{0})
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	e.produce(userActive(t, user, start))
	waitFor(t, 5*time.Second, "the runner told hot", func() (bool, string) {
		_, ok := watch.firstAfter(box.MailboxID, domain.SyncTierHot, start)
		return ok, "not hot"
	})
	at, _ := watch.firstAfter(box.MailboxID, domain.SyncTierHot, start)
	t.Logf("user.active to the runner told hot, under a stale epoch: %s", at.Sub(start))
	waitFor(t, 10*time.Second, "the stale tier write refused", func() (bool, string) {
		n := count(t, e.db.Pool, `SELECT count(*) FROM sync_fenced_writes WHERE owner = 'stale-owner' AND kind = 'tier'
            AND epoch = $1 AND current_epoch = $2 AND mailbox_id = $3`, stale, taken[0], box.MailboxID)
		return n == 1, fmt.Sprintf("%d refused tier writes recorded", n)
	})
	if got := counterValue(t, m.reg, "mailplane_sync_fenced_writes_total"); got < 1 {
		t.Errorf("mailplane_sync_fenced_writes_total = %v", got)
	}

	var recs []domain.SyncTierRecord
	waitFor(t, 20*time.Second, "the hot tier recorded under a newer epoch", func() (bool, string) {
		recs = tierRecords(t, readTopic(t, e, topics.SyncTier))
		for _, r := range recs {
			if r.MailboxID == box.MailboxID && r.Tier == domain.SyncTierHot && r.Epoch > taken[0] && r.Owner == "stale-owner" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("sync.tier: %+v", recs)
	})
	for _, r := range recs {
		if r.Epoch <= taken[0] {
			t.Errorf("a tier record at epoch %d reached sync.tier (the intruder took %d): %+v", r.Epoch, taken[0], r)
		}
	}
	changes := tierChanges(t, readTopic(t, e, topics.SyncAudit))
	for _, c := range changes {
		if c.Epoch <= taken[0] {
			t.Errorf("a tier_changed event at stale epoch %d reached sync.audit: %+v", c.Epoch, c)
		}
	}
	if len(changes) == 0 || changes[0].From != domain.SyncTierWarm || changes[0].To != domain.SyncTierHot {
		t.Errorf("tier_changed events %+v, want warm to hot under the new epoch", changes)
	}
	if ok, why := exactlyOnce(t, e.db.Pool, live, m); !ok {
		t.Error(why)
	}
	if info := rec.Running()[box.MailboxID]; info.Tier != domain.SyncTierHot {
		t.Errorf("after resuming the mailbox runs %+v, want hot", info)
	}
	if n := staleWrites(t, e.db.Pool); n != 0 {
		t.Errorf("%d stale writes", n)
	}
	// The worker's own relay published them.
	if got := counterValue(t, m.reg, "mailplane_outbox_published_total"); got == 0 {
		t.Error("the worker's outbox relay published nothing")
	}
}

// TestNoOutboxRelay: a worker configured without a relay of its own leaves
// its records in the outbox until the process's relay runs.
func TestNoOutboxRelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	f := newFixture(112)
	user := f.uuid()
	box := f.mailbox(user, time.Hour)
	cfg := testConfig(t, "relayless")
	cfg.NoOutboxRelay = true
	m := e.start(cfg, nil)
	e.produce(stateRecord(t, box))
	waitFor(t, 20*time.Second, "the mailbox running", func() (bool, string) {
		return exactlyOnce(t, e.db.Pool, map[string]bool{box.MailboxID: true}, m)
	})
	e.produce(userActive(t, user, time.Now()))
	waitFor(t, 10*time.Second, "the tier record in the outbox", func() (bool, string) {
		n := count(t, e.db.Pool, `SELECT count(*) FROM event_outbox WHERE topic = $1`, topics.SyncTier)
		return n == 1, fmt.Sprintf("%d sync.tier records in the outbox", n)
	})
	if recs := readTopic(t, e, topics.SyncTier); len(recs) != 0 {
		t.Fatalf("%d sync.tier records published without a relay", len(recs))
	}
	e.startRelay()
	waitFor(t, 10*time.Second, "the tier record published", func() (bool, string) {
		recs := tierRecords(t, readTopic(t, e, topics.SyncTier))
		return len(recs) == 1 && recs[0].Tier == domain.SyncTierHot && recs[0].MailboxID == box.MailboxID, fmt.Sprintf("%+v", recs)
	})
}
