package mailboxstate_test

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/topics"
)

func (g *gen) disabled(id string) domain.Event {
	since := g.t0.Add(-48 * time.Hour)
	return g.event(&domain.MailboxDisabled{MailboxID: id, Cause: domain.DisableAuthFailing,
		Reason: "AUTHENTICATIONFAILED Invalid credentials", FailingSince: &since})
}

// checkDisabled fails unless r is the state folded from add, disabled by
// dis: every field of add's state but Enabled, and dis's id.
func checkDisabled(t testing.TB, r *kgo.Record, add, dis domain.Event) {
	t.Helper()
	m, live, err := mailboxstate.Decode(r)
	if err != nil || !live {
		t.Fatalf("%s: live=%v err=%v, want the state of %s disabled by %s", r.Key, live, err, add.ID, dis.ID)
	}
	want := mailboxstate.FromAdded(add, add.Data.(*domain.MailboxAdded))
	want.Enabled = false
	if !m.SameSync(want) || m.Enabled || !m.AddedAt.Equal(add.Time) || m.SourceEventID != dis.ID {
		t.Fatalf("%s: state %+v\nwant %+v disabled by %s", r.Key, m, want, dis.ID)
	}
	if id, _ := topics.Header(r, topics.HeaderID); id != dis.ID {
		t.Errorf("%s: ce_id %s, want the disabling event's %s", r.Key, id, dis.ID)
	}
	if at, _ := topics.Header(r, topics.HeaderTime); at != dis.Time.UTC().Format(time.RFC3339Nano) {
		t.Errorf("%s: ce_time %s, want the disabling event's %s", r.Key, at, dis.Time)
	}
}

// TestFoldDisabledInOneBatch folds mailbox.disabled events whose mailbox's
// other events are in the same batch: the batch's own outputs are the
// mailbox's current state.
func TestFoldDisabledInOneBatch(t *testing.T) {
	t.Parallel()
	kcfg := broker(t)
	g := newGen(21)
	a, b, c, d, e, f := g.uuid(), g.uuid(), g.uuid(), g.uuid(), g.uuid(), g.uuid()
	addA, disA := g.added(a), g.disabled(a)
	addB, disB, readdB := g.added(b), g.disabled(b), g.added(b)
	disC := g.disabled(c) // never added
	addD, rmD, disD := g.added(d), g.event(&domain.MailboxRemoved{MailboxID: d, Reason: "r"}), g.disabled(d)
	addE, disE1, disE2 := g.added(e), g.disabled(e), g.event(&domain.MailboxDisabled{MailboxID: e, Cause: domain.DisableOperator, Reason: "operator"})
	addF, disF, rmF := g.added(f), g.disabled(f), g.event(&domain.MailboxRemoved{MailboxID: f, Reason: "r"})
	produce(t, kcfg, encode(t, addA, disA, addB, disB, readdB, disC, addD, rmD, disD, addE, disE1, disE2, addF, disF, rmF)...)

	reg := prometheus.NewRegistry()
	start(t, kcfg, mailboxstate.WithRegisterer(reg))
	waitConsumed(t, kcfg)
	ids, last := history(t, kcfg)
	for _, c := range []struct {
		name string
		id   string
		want []domain.Event
	}{
		{"added, disabled", a, []domain.Event{addA, disA}},
		{"disabled, added again", b, []domain.Event{addB, disB, readdB}},
		{"never added", c, nil},
		{"removed, then disabled", d, []domain.Event{addD, rmD}},
		{"disabled twice", e, []domain.Event{addE, disE1, disE2}},
		{"disabled, then removed", f, []domain.Event{addF, disF, rmF}},
	} {
		if got := ids[c.id]; !slices.Equal(got, eventIDs(c.want...)) {
			t.Errorf("%s: records from %v, want %v", c.name, got, eventIDs(c.want...))
		}
	}
	checkDisabled(t, last[a], addA, disA)
	checkLive(t, last[b], readdB)
	if m, _, _ := mailboxstate.Decode(last[b]); !m.Enabled {
		t.Errorf("re-added mailbox not enabled: %+v", m)
	}
	checkRemoved(t, last[d])
	checkDisabled(t, last[e], addE, disE2)
	checkRemoved(t, last[f])
	if got := counter(t, reg, "mailplane_mailbox_state_records_total", "ignored"); got != 2 {
		t.Errorf("ignored %v, want 2 (the disables of an unknown and of a removed mailbox)", got)
	}
}

// TestFoldDisabledAcrossTransactions disables mailboxes whose current state
// was committed earlier, by a processor since restarted: it is read back
// from mailbox.state, and overridden by the batch's own earlier outputs.
// Copies of a mailbox.disabled after the re-add that enabled the mailbox
// again are skipped.
func TestFoldDisabledAcrossTransactions(t *testing.T) {
	t.Parallel()
	kcfg := broker(t)
	g := newGen(22)
	a, b, c, d, u := g.uuid(), g.uuid(), g.uuid(), g.uuid(), g.uuid()
	addA, addB, addC, addD := g.added(a), g.added(b), g.added(c), g.added(d)
	rmB := g.event(&domain.MailboxRemoved{MailboxID: b, Reason: "r"})
	stop := start(t, kcfg)
	produce(t, kcfg, encode(t, addA, addB, rmB, addC, addD)...)
	waitConsumed(t, kcfg)
	stop()

	// A new processor: it knows the mailboxes from mailbox.state only.
	start(t, kcfg)
	disA, disB, disU := g.disabled(a), g.disabled(b), g.disabled(u)
	// In one batch: c is added again with new details and then disabled
	// (the batch's add, not the committed one, is disabled); d is removed
	// and then disabled (nothing).
	readdC, disC := g.added(c), g.disabled(c)
	rmD, disD := g.event(&domain.MailboxRemoved{MailboxID: d, Reason: "r"}), g.disabled(d)
	produce(t, kcfg, encode(t, disA, disB, disU, readdC, disC, rmD, disD)...)
	waitConsumed(t, kcfg)
	ids, last := history(t, kcfg)
	checkDisabled(t, last[a], addA, disA)
	checkRemoved(t, last[b])
	if got := ids[b]; !slices.Equal(got, eventIDs(addB, rmB)) {
		t.Errorf("removed mailbox: records from %v, want %v", got, eventIDs(addB, rmB))
	}
	if got := ids[u]; got != nil {
		t.Errorf("unknown mailbox: records from %v, want none", got)
	}
	checkDisabled(t, last[c], readdC, disC)
	if got := ids[d]; !slices.Equal(got, eventIDs(addD, rmD)) {
		t.Errorf("removed in the batch: records from %v, want %v", got, eventIDs(addD, rmD))
	}

	// Enabled again by a new add; then the copies of the disables come
	// (retries): a stays enabled, and u, added since, is not disabled.
	readdA, addU := g.added(a), g.added(u)
	produce(t, kcfg, encode(t, readdA, addU)...)
	waitConsumed(t, kcfg)
	produce(t, kcfg, encode(t, disA, disU)...)
	waitConsumed(t, kcfg)
	ids, last = history(t, kcfg)
	checkLive(t, last[a], readdA)
	checkLive(t, last[u], addU)
	if got := ids[a]; !slices.Equal(got, eventIDs(addA, disA, readdA)) {
		t.Errorf("re-enabled mailbox: records from %v, want %v", got, eventIDs(addA, disA, readdA))
	}
	if got := ids[u]; !slices.Equal(got, eventIDs(addU)) {
		t.Errorf("added after its disable: records from %v, want %v", got, eventIDs(addU))
	}
}

// TestDisabledExactlyOnceAcrossRestarts folds random adds, removals and
// disables of a few mailboxes, with copies, while the processor is stopped
// and restarted inside small transactions. Every distinct event has the
// output a model says (a disable of a mailbox that is not live: none),
// exactly once, and each mailbox ends in the model's state.
func TestDisabledExactlyOnceAcrossRestarts(t *testing.T) {
	t.Parallel()
	kcfg := broker(t)
	g := newGen(23)
	ids := make([]string, 30)
	for i := range ids {
		ids[i] = g.uuid()
	}
	n := 1500
	if testing.Short() {
		n = 400
	}
	type model struct {
		add      domain.Event // the mailbox.added of its live state
		dis      *domain.Event
		live     bool
		everSeen bool
	}
	models := map[string]*model{}
	outputs := map[string]bool{} // event ids that must have exactly one output
	var evs []domain.Event
	for range n {
		id := ids[g.rng.IntN(len(ids))]
		m := models[id]
		if m == nil {
			m = &model{}
			models[id] = m
		}
		var e domain.Event
		switch k := g.rng.IntN(10); {
		case k < 2 && len(evs) > 0:
			// A copy of an earlier event: no output of its own.
			evs = append(evs, evs[g.rng.IntN(len(evs))])
			continue
		case k < 5:
			e = g.added(id)
			m.add, m.dis, m.live, m.everSeen = e, nil, true, true
			outputs[e.ID] = true
		case k < 7:
			e = g.event(&domain.MailboxRemoved{MailboxID: id, Reason: "r"})
			m.dis, m.live = nil, false
			m.everSeen = true
			outputs[e.ID] = true
		default:
			e = g.disabled(id)
			if m.live {
				m.dis = &e
				outputs[e.ID] = true
			}
		}
		evs = append(evs, e)
	}
	// Copies are only skipped within the dedupe window, and the generator's
	// times span milliseconds: every copy here is a duplicate.
	recs := encode(t, evs...)
	var wg sync.WaitGroup
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(7, 8))
		for i := 0; i < len(recs); i += 50 {
			produce(t, kcfg, recs[i:min(i+50, len(recs))]...)
			time.Sleep(time.Duration(10+rng.IntN(30)) * time.Millisecond)
		}
	})
	rng := rand.New(rand.NewPCG(9, 10))
	for range 6 {
		stop := start(t, kcfg, mailboxstate.WithMaxBatch(20))
		time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
		stop()
	}
	wg.Wait()
	start(t, kcfg)
	waitConsumed(t, kcfg)

	seen := map[string]int{}
	last := map[string]*kgo.Record{}
	for _, r := range readCommitted(t, kcfg, topics.MailboxState) {
		id, _ := topics.Header(r, topics.HeaderID)
		seen[id]++
		last[string(r.Key)] = r
	}
	for id, n := range seen {
		if !outputs[id] {
			t.Errorf("event %s has %d outputs, want none", id, n)
		}
	}
	for id := range outputs {
		if seen[id] != 1 {
			t.Errorf("event %s has %d outputs, want 1", id, seen[id])
		}
	}
	for id, m := range models {
		r := last[id]
		switch {
		case !m.everSeen:
			if r != nil {
				t.Errorf("%s: never added, has a record", id)
			}
		case !m.live:
			checkRemoved(t, r)
		case m.dis != nil:
			checkDisabled(t, r, m.add, *m.dis)
		default:
			checkLive(t, r, m.add)
			if mb, _, _ := mailboxstate.Decode(r); !mb.Enabled {
				t.Errorf("%s: live and never disabled since its add, but not enabled", id)
			}
		}
	}
}
