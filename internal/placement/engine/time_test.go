package engine

import (
	"slices"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/topics"
)

// timeFleet starts an engine on a fake clock at t0 recording the inputs it
// commits, and registers the fleet.
func timeFleet(t *testing.T) (testBroker, *fakeClock, *Transcript, *publisher) {
	t.Helper()
	b := newTestBroker(t)
	clock := newFakeClock(t0)
	startEngine(t, b, WithClock(clock.Now), WithTickInterval(20*time.Millisecond))
	p := newPublisher(t, b)
	fleet(t, b, p, t0)
	return b, clock, b.tr, p
}

// TestClaimedTimesDoNotSkipBandDwell: a batch of two health_scored whose
// claimed times are two hours apart (more than the dwell) arrives together:
// the engine decides both at the time mailplane stamped on their records,
// so the recovery starts and the band stays where it was.
func TestClaimedTimesDoNotSkipBandDwell(t *testing.T) {
	t.Parallel()
	b, clock, seen, p := timeFleet(t)
	boxes := addMailboxes(p, t0.Add(2*time.Second), 0, 3) // mailbox 1 is org 2's (premium)
	waitLog(t, b, 30*time.Second, "mailboxes", func(l []logEntry) bool { return hasAll(l, boxes) })
	clock.Set(t0.Add(time.Minute))
	worse := p.publish(t0.Add(time.Minute), &domain.MailboxHealthScored{MailboxID: mailboxID(1), State: domain.HealthQuarantined, Score: 40, Reason: "sweep"})
	waitLog(t, b, 30*time.Second, "band worsened", func(l []logEntry) bool { return hasAll(l, worse) })

	// The attack: one batch, claimed 2 h apart, both in the past of the
	// producer's clock (so ingest accepts them).
	now := t0.Add(3 * time.Hour)
	clock.Set(now)
	good := func(at time.Time) domain.Event {
		return p.event(at, &domain.MailboxHealthScored{MailboxID: mailboxID(1), State: domain.HealthHealthy, Score: 99, Reason: "forged"})
	}
	evs := []domain.Event{good(now.Add(-2 * time.Hour)), good(now)}
	if err := p.publishAt(t.Context(), now, evs...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "both scores decided", func() bool { return seen.Decided(evs) })

	l := readLog(t, b)
	var held *domain.PlacementBandHeld
	for _, en := range l {
		switch d := en.d.Data.(type) {
		case *domain.PlacementBandChanged:
			if d.Reason == domain.ReasonBandImproved {
				t.Fatalf("the band improved at once from two scores claimed 2 h apart: %s", mailplanetest.MustJSON(t, d))
			}
		case *domain.PlacementBandHeld:
			if en.d.Cause.ID == evs[0].ID {
				held = d
			}
		}
	}
	if held == nil || held.Reason != domain.ReasonBandRecoveryStarted || !held.Since.Equal(now) {
		t.Fatalf("the first score should start the recovery at the record time %s; got %+v", now, held)
	}
	p.mu.Lock()
	for _, ev := range evs {
		p.all[ev.ID] = ev
	}
	p.mu.Unlock()
	st := verifyLog(t, b, l, p.events(), placement.Config{})
	if m, _ := st.Mailbox(mailboxID(1)); m.Band != domain.RiskQuarantine || !m.CandidateSince.Equal(now) {
		t.Fatalf("mailbox 1: band %s, candidate since %s; want quarantine since %s", m.Band, m.CandidateSince, now)
	}
}

// TestFarFutureRecordDoesNotPinWorker: a heartbeat saying "stopping", dated
// 2099 in its event time and its record timestamp, written straight to the
// worker topic (ingest would refuse it), is decided at the engine's clock;
// the real worker's next heartbeat resumes it, and it stays live and not
// stopping while it keeps heartbeating.
func TestFarFutureRecordDoesNotPinWorker(t *testing.T) {
	t.Parallel()
	b, clock, seen, p := timeFleet(t)

	at2099 := time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)
	forged := heartbeat(3, domain.TierSharedPremium, domain.EgressOAuthAPI)
	forged.Stopping = true
	ev := domain.Event{ID: domain.NewEventID(), Type: domain.TypeWorkerHeartbeat, Source: "attacker", Time: at2099, Subject: forged.WorkerID, Data: forged}
	rec, err := topics.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	rec.Timestamp = at2099
	kafkatest.InNamespace(b.kcfg(""), rec)
	kc, err := kafka.NewProducer(b.kcfg("attacker"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	if err := kc.ProduceSync(t.Context(), rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.all[ev.ID] = ev
	p.mu.Unlock()
	waitFor(t, 30*time.Second, "the forged heartbeat decided", func() bool { return seen.Decided([]domain.Event{ev}) })

	// The real worker keeps heartbeating, 10 s apart, with every other
	// worker, for longer than the liveness window.
	var real []domain.Event
	for i := 1; i <= 5; i++ {
		at := t0.Add(time.Duration(i) * 10 * time.Second)
		clock.Set(at)
		real = p.publish(at,
			heartbeat(1, domain.TierSharedFree, domain.EgressColdSMTP), heartbeat(2, domain.TierSharedFree, domain.EgressColdSMTP),
			heartbeat(3, domain.TierSharedPremium, domain.EgressOAuthAPI), heartbeat(4, domain.TierSharedPremium, domain.EgressOAuthAPI),
			heartbeat(5, domain.TierSharedPremium, domain.EgressOAuthAPI))
		waitFor(t, 30*time.Second, "heartbeats decided", func() bool { return seen.Decided(real) })
	}
	l := readLog(t, b)
	for _, en := range l {
		if en.d.Cause.ID == ev.ID && !en.d.Time().Equal(t0) {
			t.Errorf("the 2099 record was decided at %s, want the engine's clock %s", en.d.Time(), t0)
		}
		if d, ok := en.d.Data.(*domain.PlacementWorkerDied); ok {
			t.Errorf("worker %s died while heartbeating", d.WorkerID)
		}
	}
	st := verifyLog(t, b, l, p.events(), placement.Config{})
	w, _ := st.Worker(workerID(3))
	// Last seen is the last transition recorded (resumed, at 10 s): the
	// heartbeats after it changed nothing and are heard, not recorded.
	if w.Stopping || !w.Live || !w.LastSeen.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("worker 3 after the forged heartbeat and its own: stopping %v, live %v, last seen %s", w.Stopping, w.Live, w.LastSeen)
	}
	if !slices.ContainsFunc(l, func(en logEntry) bool {
		d, ok := en.d.Data.(*domain.PlacementWorkerChanged)
		return ok && d.WorkerID == workerID(3) && d.Reason == domain.ReasonWorkerResumed
	}) {
		t.Fatal("worker 3 never resumed after the forged stopping heartbeat")
	}
}
