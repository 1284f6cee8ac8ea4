package topics_test

import (
	"fmt"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

// An analyst reading a record of the log. The record here is made by the
// producer's own encode path (topics.Encode); read from the broker, it is
// the same: the value is the event's data as JSON, the ce_* headers its
// attributes, the key its aggregate id, the timestamp when mailplane
// received it. Decode turns it back into the typed event; a record it
// cannot read is an error with a stable code, never a panic.
func ExampleDecode() {
	mailbox := "0190a5b2-4c5e-7b1a-9c3d-00000000a001"
	rec, err := topics.Encode(domain.Event{
		ID: "evt-1", Type: domain.TypeMailboxHealthScored, Source: "/deliverability",
		Time: time.Date(2026, 5, 1, 11, 59, 0, 0, time.UTC), Subject: mailbox,
		Data: &domain.MailboxHealthScored{MailboxID: mailbox, State: domain.HealthWatch, Score: 55.5, Reason: "bounce rate"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	rec.Timestamp = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC) // as the log stamps it
	ceType, _ := topics.Header(rec, topics.HeaderType)
	fmt.Printf("%s key=%s ce_type=%s\n%s\n", rec.Topic, rec.Key, ceType, rec.Value)

	ev, err := topics.Decode(rec)
	if err != nil {
		fmt.Println("unreadable:", domain.ErrorCode(err))
		return
	}
	switch d := ev.Data.(type) {
	case *domain.MailboxHealthScored:
		fmt.Println(domain.ShortType(ev.Type), d.MailboxID, d.State, d.Score, "logged", ev.Logged.Format(time.RFC3339))
	default:
		fmt.Println("another type:", ev.Type)
	}

	rec.Key = []byte("another-mailbox") // a key that is not the aggregate id
	_, err = topics.Decode(rec)
	fmt.Println("unreadable:", domain.ErrorCode(err))
	// Output:
	// mailplane.mailbox.events.v1 key=0190a5b2-4c5e-7b1a-9c3d-00000000a001 ce_type=mailplane.mailbox.health_scored.v1
	// {"mailbox_id":"0190a5b2-4c5e-7b1a-9c3d-00000000a001","state":"watch","score":55.5,"reason":"bounce rate"}
	// mailbox.health_scored 0190a5b2-4c5e-7b1a-9c3d-00000000a001 watch 55.5 logged 2026-05-01T12:00:00Z
	// unreadable: key_mismatch
}
