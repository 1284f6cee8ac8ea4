package producer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// TestPublishRefusesFutureTime: the Go client refuses, like the HTTP API, an
// event dated more than domain.MaxFutureSkew ahead of its clock (a heartbeat
// dated 2099 would otherwise claim to be the worker's latest for ever), and
// nothing reaches the log.
func TestPublishRefusesFutureTime(t *testing.T) {
	t.Parallel()
	kc, kcfg := newBroker(t)
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	c := producer.New(kc, producer.WithNamespace(kcfg.Namespace), producer.WithClock(func() time.Time { return now }))
	hb := &domain.WorkerHeartbeat{WorkerID: workerID, Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Address: "10.0.0.1:25", Stopping: true}
	for _, at := range []time.Time{time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC), now.Add(domain.MaxFutureSkew + time.Millisecond)} {
		ev := c.NewEvent(hb)
		ev.Time = at
		_, err := c.Publish(context.Background(), ev)
		var be *producer.BatchError
		if !errors.As(err, &be) || len(be.Events) != 1 || !be.Events[0].Problems.Has(domain.CodeTimeInFuture) {
			t.Fatalf("time %s: err = %v, want time_in_future", at, err)
		}
	}
	assertNothingProduced(t, kc, kcfg.Namespace, "refused future-dated events")
}

// TestRecordTimestampIsTheClients: the record timestamp, which rules run on,
// is the client's clock at ingest; the event's own (claimed) time stays in
// ce_time for audit.
func TestRecordTimestampIsTheClients(t *testing.T) {
	t.Parallel()
	kc, kcfg := newBroker(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	c := producer.New(kc, producer.WithNamespace(kcfg.Namespace), producer.WithClock(func() time.Time { return now }))
	claimed := now.Add(-2 * time.Hour).Truncate(time.Second)
	ev := c.NewEvent(&domain.WorkerHeartbeat{WorkerID: workerID, Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Address: "10.0.0.1:25"})
	ev.Time = claimed
	if _, err := c.Publish(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	rec := consumeAll(t, kcfg, topics.WorkerEvents, 1)[0]
	if !rec.Timestamp.Equal(now) {
		t.Errorf("record timestamp %s, want the client's clock %s", rec.Timestamp, now)
	}
	got, err := topics.Decode(rec)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Time.Equal(claimed) {
		t.Errorf("ce_time %s, want the claimed %s", got.Time, claimed)
	}
}
