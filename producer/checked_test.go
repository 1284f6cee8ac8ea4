package producer_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/producer"
)

type schemaFunc func(string, []byte) domain.Problems

func (f schemaFunc) Validate(typ string, data []byte) domain.Problems { return f(typ, data) }

// TestPrepareChecked: an event the domain checked is encoded as Prepare
// encodes it; nothing unchecked gets through PrepareChecked (the zero
// Checked, the only one a caller can make, is refused); events a Go
// caller builds are still validated by Prepare; and a schema validator,
// when given, still sees every checked event.
func TestPrepareChecked(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	var schemaCalls int
	c := producer.New(nil, producer.WithSealer(testKeyring(t)), producer.WithClock(func() time.Time { return now }),
		producer.WithSchema(schemaFunc(func(typ string, data []byte) domain.Problems {
			schemaCalls++
			return nil
		})))

	ev := c.NewEvent(&domain.UserActive{UserID: userID, Source: domain.ActivityLogin})
	viaPrepare, err := c.Prepare([]domain.Event{ev})
	if err != nil {
		t.Fatal(err)
	}
	chk, ps := ev.Check(now)
	if len(ps) > 0 {
		t.Fatal(ps)
	}
	viaChecked, err := c.PrepareChecked([]domain.Checked{chk})
	if err != nil {
		t.Fatal(err)
	}
	if string(viaChecked[0].Value) != string(viaPrepare[0].Value) || string(viaChecked[0].Key) != string(viaPrepare[0].Key) ||
		viaChecked[0].Topic != viaPrepare[0].Topic || !reflect.DeepEqual(viaChecked[0].Headers, viaPrepare[0].Headers) {
		t.Errorf("PrepareChecked %+v, Prepare %+v", viaChecked[0], viaPrepare[0])
	}
	if schemaCalls != 2 {
		t.Errorf("schema validator called %d times, want once per prepared event (2)", schemaCalls)
	}

	var be *producer.BatchError
	if recs, err := c.PrepareChecked([]domain.Checked{chk, {}}); !errors.As(err, &be) || recs != nil ||
		len(be.Events) != 1 || be.Events[0].Index != 1 {
		t.Errorf("the zero Checked: records %v, err %v; want it refused and nothing prepared", recs, err)
	}

	bad := mailboxAdded()
	bad.IMAP.Port = 0
	if _, err := c.Prepare([]domain.Event{c.NewEvent(&bad)}); !errors.As(err, &be) ||
		len(be.Events) != 1 || be.Events[0].Problems[0].Code != domain.CodeOutOfRange || be.Events[0].Problems[0].Field != "data.imap.port" {
		t.Errorf("a Go caller's invalid event: %v; want out_of_range at data.imap.port", err)
	}
	if _, ps := c.NewEvent(&bad).Check(now); len(ps) == 0 {
		t.Errorf("Check passed an invalid event")
	}
}
