package domain_test

import (
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

func TestParseStructuredAttributeNamesAreExact(t *testing.T) {
	t.Parallel()
	raw := `{"specversion":"1.0","ID":"0190a5b2-4c5e-7b1a-9c3d-00000000e005","type":"mailplane.user.active.v1","source":"t",
		"data":{"user_id":"0190a5b2-4c5e-7b1a-9c3d-00000000b001","source":"login"}}`
	_, ps := domain.ParseStructured([]byte(raw), time.Now(), nil)
	if len(ps) != 1 || ps[0].Code != domain.CodeUnknownField || ps[0].Field != "ID" {
		t.Fatalf("problems = %v", ps)
	}
}

// TestEventTimeSkew: at ingest an event may be dated up to domain.MaxFutureSkew
// ahead of the server's clock, not more, whatever the path (domain.FromAttributes
// for HTTP, ValidateAt for the Go client).
func TestEventTimeSkew(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	data := []byte(`{"user_id":"0190a5b2-0000-7000-8000-0000000000b1","source":"login"}`)
	for _, c := range []struct {
		at   time.Time
		want bool // refused
	}{
		{now.Add(-48 * time.Hour), false},
		{now.Add(domain.MaxFutureSkew), false},
		{now.Add(domain.MaxFutureSkew + time.Nanosecond), true},
		{time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC), true},
	} {
		a := domain.Attributes{SpecVersion: domain.SpecVersion, ID: "0190a5b2-0000-7000-8000-000000000001", Type: domain.TypeUserActive,
			Source: "test", Time: c.at.Format(time.RFC3339Nano)}
		ev, ps := domain.FromAttributes(a, data, now, nil, nil)
		if got := ps.Has(domain.CodeTimeInFuture); got != c.want {
			t.Errorf("domain.FromAttributes at %s: time_in_future %v, want %v (%v)", c.at, got, c.want, ps)
		}
		if !c.want {
			if ps := ev.ValidateAt(now); len(ps) > 0 {
				t.Errorf("ValidateAt %s: %v", c.at, ps)
			}
			continue
		}
		ev = domain.Event{ID: a.ID, Type: a.Type, Source: a.Source, Time: c.at, Data: &domain.UserActive{UserID: "0190a5b2-0000-7000-8000-0000000000b1", Source: domain.ActivityLogin}}
		if ps := ev.ValidateAt(now); !ps.Has(domain.CodeTimeInFuture) || len(ev.Validate()) > 0 {
			t.Errorf("ValidateAt %s: %v; Validate (consumers) %v", c.at, ps, ev.Validate())
		}
	}
}

// TestTrustedTime: a record stamped ahead of the reader's clock counts as
// the clock's time; anything else as its stamp.
func TestTrustedTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct{ logged, want time.Time }{
		{now.Add(-time.Hour), now.Add(-time.Hour)},
		{now, now},
		{now.Add(time.Second), now},
		{time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC), now},
		{time.Time{}, now},
	} {
		if got := domain.TrustedTime(c.logged, now); !got.Equal(c.want) {
			t.Errorf("domain.TrustedTime(%s) = %s, want %s", c.logged, got, c.want)
		}
	}
}
