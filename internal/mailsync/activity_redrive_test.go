package mailsync

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

// TestActivitySkipsRecordsRedrivenForOthers: a user.active redriven from
// the DLQ for the registry carries the redrive's append time; taken as
// activity it would make the user's mailboxes hot now.
func TestActivitySkipsRecordsRedrivenForOthers(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	reg := prometheus.NewRegistry()
	tr := newTiering(Config{Now: func() time.Time { return now }, Registerer: reg}, kafka.Config{}, nil, newMetrics(reg), nil)
	const user = "0190a5b2-4c5e-7b1a-9c3d-00000000a001"
	ev := domain.Event{ID: domain.NewEventID(), Type: domain.TypeUserActive, Source: "test", Time: now, Subject: user,
		Data: &domain.UserActive{UserID: user, Source: domain.ActivityLogin}}
	r, err := topics.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	r.Timestamp = now
	if a, ok := tr.decodeActivity(r); !ok || a.user != user {
		t.Fatalf("a user.active is activity: %+v %v", a, ok)
	}
	dead := dlq.Parse(dlq.NewRecord("", r, dlq.Failure{Consumer: string(sla.Registry), Code: domain.CodeInvalid, Err: "x", Attempts: 3}))
	redriven := dlq.RedriveRecord(dead, domain.NewEventID())
	redriven.Timestamp = now
	if a, ok := tr.decodeActivity(redriven); ok {
		t.Fatalf("a user.active redriven for the registry taken as activity: %+v", a)
	}
}
