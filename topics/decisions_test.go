package topics_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

var decisionAt = time.Date(2026, 3, 1, 12, 0, 0, 5_000_000, time.UTC)

const (
	decMailbox = "00000002-0000-4000-8000-000000000001"
	decOrg     = "00000003-0000-4000-8000-000000000001"
	decWorker  = "00000001-0000-4000-8000-000000000001"
	decID      = "019c4a7e-4e48-7b1a-9c3d-0000000000d1"
)

func exampleDecision() topics.Decision {
	return topics.Decision{
		ID: decID, Source: "mailplane/placement-engine",
		Data: &domain.PlacementAssigned{
			PlacementMeta: domain.PlacementMeta{At: decisionAt, Reason: domain.ReasonMailboxAdded},
			MailboxID:     decMailbox, OrgID: decOrg, WorkerID: decWorker,
			Tier: domain.TierSharedPremium, Band: domain.RiskClean, Weight: domain.PlacementWeightOAuth,
		},
		Cause: topics.Cause{ID: "0190a5b2-4c5e-7b1a-9c3d-00000000e001", Type: domain.TypeMailboxAdded,
			Topic: topics.MailboxEvents, Partition: 7, Offset: 1234, Index: 0, Count: 2},
	}
}

func TestDecisionRoundTrip(t *testing.T) {
	t.Parallel()
	tick := exampleDecision()
	tick.Data = &domain.PlacementWorkerDied{PlacementMeta: domain.PlacementMeta{At: decisionAt, Reason: domain.ReasonHeartbeatExpired}, WorkerID: decWorker, LastSeen: decisionAt.Add(-time.Minute)}
	tick.Cause = topics.Cause{ID: topics.CauseTick, Type: topics.CauseTick, Index: 1, Count: 3}
	for _, d := range []topics.Decision{exampleDecision(), tick} {
		r, err := topics.EncodeDecision(d)
		if err != nil {
			t.Fatal(err)
		}
		if r.Topic != topics.PlacementDecisions || string(r.Key) != d.Data.AggregateID() || !r.Timestamp.Equal(decisionAt) {
			t.Fatalf("record topic %s key %s timestamp %s", r.Topic, r.Key, r.Timestamp)
		}
		if v, _ := topics.Header(r, topics.HeaderTime); v != "2026-03-01T12:00:00.005Z" {
			t.Fatalf("ce_time %q", v)
		}
		if v, _ := topics.Header(r, topics.HeaderType); v != d.Data.EventType() {
			t.Fatalf("ce_type %q", v)
		}
		got, err := topics.DecodeDecision(r)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, d) {
			t.Fatalf("round trip:\n%+v\n%+v", d, got)
		}
		// Deterministic: the same decision encodes to the same bytes.
		r2, _ := topics.EncodeDecision(d)
		if !sameRecord(r, r2) {
			t.Fatal("encoding is not deterministic")
		}
	}
	if p := exampleDecision().Cause.Position(); p != "mailplane.mailbox.events.v1/7/1234" {
		t.Fatalf("position %q", p)
	}
}

func sameRecord(a, b *kgo.Record) bool {
	if a.Topic != b.Topic || !bytes.Equal(a.Key, b.Key) || !bytes.Equal(a.Value, b.Value) || !a.Timestamp.Equal(b.Timestamp) || len(a.Headers) != len(b.Headers) {
		return false
	}
	for i := range a.Headers {
		if a.Headers[i].Key != b.Headers[i].Key || !bytes.Equal(a.Headers[i].Value, b.Headers[i].Value) {
			return false
		}
	}
	return true
}

func TestEncodeDecisionRefuses(t *testing.T) {
	t.Parallel()
	bad := []func(*topics.Decision){
		func(d *topics.Decision) { d.ID = "not-a-uuid" },
		func(d *topics.Decision) { d.Data.(*domain.PlacementAssigned).Weight = 7 },
		func(d *topics.Decision) { d.Cause.Count = 0 },
		func(d *topics.Decision) { d.Cause.Index = 2 },
		func(d *topics.Decision) { d.Cause.Topic = "" },
		func(d *topics.Decision) { d.Cause.Type = topics.CauseTick },
		func(d *topics.Decision) { d.Data = nil },
	}
	for i, f := range bad {
		d := exampleDecision()
		f(&d)
		if _, err := topics.EncodeDecision(d); err == nil {
			t.Errorf("case %d: encoded", i)
		}
	}
}

func TestDecodeDecisionErrors(t *testing.T) {
	t.Parallel()
	good, err := topics.EncodeDecision(exampleDecision())
	if err != nil {
		t.Fatal(err)
	}
	with := func(key, value string) *kgo.Record {
		r := cloneRecord(good)
		for i := range r.Headers {
			if r.Headers[i].Key == key {
				r.Headers[i].Value = []byte(value)
			}
		}
		return r
	}
	otherKey := cloneRecord(good)
	otherKey.Key = []byte(decOrg)
	var m map[string]any
	_ = json.Unmarshal(good.Value, &m)
	m["at"] = "2026-03-01T12:00:01Z"
	shifted := cloneRecord(good)
	shifted.Value, _ = json.Marshal(m)
	cases := []struct {
		name string
		r    *kgo.Record
		code domain.Code
	}{
		{"missing cause id", dropHeader(good, topics.HeaderCauseID), domain.CodeMissingHeader},
		{"missing cause position", dropHeader(good, topics.HeaderCausePosition), domain.CodeMissingHeader},
		{"missing ce_id", dropHeader(good, topics.HeaderID), domain.CodeMissingHeader},
		{"bad position", with(topics.HeaderCausePosition, "mailbox/x/1"), domain.CodeMalformedHeader},
		{"bad index", with(topics.HeaderCauseIndex, "one"), domain.CodeMalformedHeader},
		{"index past count", with(topics.HeaderCauseIndex, "2"), domain.CodeInvalid},
		{"bad id", with(topics.HeaderID, "nope"), domain.CodeMalformedHeader},
		{"unknown type", with(topics.HeaderType, "mailplane.placement.teleported.v1"), domain.CodeUnknownType},
		{"key mismatch", otherKey, domain.CodeKeyMismatch},
		{"time mismatch", shifted, domain.CodeMalformedHeader},
	}
	for _, c := range cases {
		_, err := topics.DecodeDecision(c.r)
		if got := domain.ErrorCode(err); got != c.code {
			t.Errorf("%s: code %q (%v), want %q", c.name, got, err, c.code)
		}
	}
}
