package mailsync

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

// TestActivitySkipsRecordsRedrivenForOthers: a user.active redriven from
// the DLQ for the registry carries the redrive's append time; taken as
// activity it would make the user's mailboxes hot now. The skip is the
// consumer runtime's (consume.SkipRedriven), so the reader of user events
// is run for real: the redriven record of one user, then the activity of
// another, on one partition; the second is promoted, the first never.
func TestActivitySkipsRecordsRedrivenForOthers(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 1)
	reg := prometheus.NewRegistry()
	tr := newTiering(Config{Now: time.Now, Registerer: reg, TierSessionGrace: time.Hour}, kcfg, slog.New(slog.DiscardHandler), newMetrics(reg), nil)
	const redrivenUser, activeUser = "0190a5b2-4c5e-7b1a-9c3d-00000000a001", "0190a5b2-4c5e-7b1a-9c3d-00000000a002"
	active := func(user string) *kgo.Record {
		ev := domain.Event{ID: domain.NewEventID(), Type: domain.TypeUserActive, Source: "test", Time: time.Now(), Subject: user,
			Data: &domain.UserActive{UserID: user, Source: domain.ActivityLogin}}
		r, err := topics.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if a, ok := tr.decodeActivity(active(activeUser)); !ok || a.user != activeUser {
		t.Fatalf("a user.active is activity: %+v %v", a, ok)
	}
	dead := dlq.Parse(dlq.NewRecord("", active(redrivenUser), dlq.Failure{Consumer: string(sla.Registry), Code: domain.CodeInvalid, Err: "x", Attempts: 3}))
	redriven := dlq.RedriveRecord(dead, domain.NewEventID())
	prod, err := kafka.NewProducer(kcfg, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range []*kgo.Record{redriven, active(activeUser)} {
		r.Topic, r.Partition, r.Timestamp = kcfg.Topic(topics.UserEvents), 0, time.Now()
		if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	promoted := map[string]bool{}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tr.followUsers(runCtx, func(as []activity) {
			mu.Lock()
			defer mu.Unlock()
			for _, a := range as {
				promoted[a.user] = true
			}
		})
	}()
	for {
		mu.Lock()
		got := promoted[activeUser]
		mu.Unlock()
		if got {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the user's activity was never promoted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	<-done
	if promoted[redrivenUser] {
		t.Fatal("a user.active redriven for the registry taken as activity")
	}
}
