package domain_test

import (
	"fmt"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// A producer's structured CloudEvent, checked as the ingest API checks it.
// A valid one becomes a domain.Checked, proof of the check that
// producer.Client.PrepareChecked encodes without validating again (the
// subject, left out, is the aggregate id from the data). A bad one yields
// every problem at once, each with its field and stable code, and the code
// of the whole refusal (Problems.Code: the one code they share, else
// invalid), which is what the API answers with in its 400.
func ExampleParseChecked() {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	good := []byte(`{
		"specversion": "1.0",
		"id": "evt-1",
		"type": "mailplane.user.active.v1",
		"source": "/product/login",
		"time": "2026-05-01T11:59:30Z",
		"datacontenttype": "application/json",
		"data": {"user_id": "0190a5b2-4c5e-7b1a-9c3d-00000000b001", "source": "login"}
	}`)
	chk, ps := domain.ParseChecked(good, now, nil) // nil: no credentials to seal
	if len(ps) > 0 {
		fmt.Println("refused:", ps)
		return
	}
	ev := chk.Event()
	active := ev.Data.(*domain.UserActive)
	fmt.Println(ev.Type, ev.Subject, active.Source)

	bad := []byte(`{
		"specversion": "1.0",
		"id": "evt-2",
		"type": "mailplane.user.active.v1",
		"source": "/product/login",
		"time": "2026-05-01T13:00:00Z",
		"data": {"user_id": "ada", "source": "telepathy"}
	}`)
	_, ps = domain.ParseChecked(bad, now, nil)
	fmt.Println("refused:", ps.Code())
	for _, p := range ps {
		fmt.Printf("  %s: %s (%s)\n", p.Field, p.Code, p.Message)
	}
	// Output:
	// mailplane.user.active.v1 0190a5b2-4c5e-7b1a-9c3d-00000000b001 login
	// refused: invalid
	//   data.user_id: invalid (must be a lower-case UUID)
	//   data.source: invalid (must be one of [login ws_connect ws_ping])
	//   time: time_in_future (is more than 5m0s ahead of the server's clock (2026-05-01T12:00:00Z))
}
