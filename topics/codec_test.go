package topics_test

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/examples"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/topics"
)

var exampleNow = time.Date(2024, 7, 12, 7, 0, 0, 0, time.UTC)

func testKeyring(tb testing.TB) *sealing.Keyring {
	tb.Helper()
	k, err := sealing.ParseKeys("test:"+base64.StdEncoding.EncodeToString(make([]byte, sealing.KeySize)), "")
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// exampleEvents parses every example (sealing mailbox credentials), in the
// order of domain.EventTypes.
func exampleEvents(tb testing.TB) []domain.Event {
	tb.Helper()
	k := testKeyring(tb)
	var out []domain.Event
	for _, typ := range domain.EventTypes() {
		raw, err := examples.Event(typ)
		if err != nil {
			tb.Fatal(err)
		}
		seal := k.Seal
		if domain.FromRolesOnly(typ) {
			seal = nil // its example is the log form, sealed credentials and all
		}
		ev, ps := domain.ParseStructured(raw, exampleNow, seal)
		if len(ps) > 0 {
			tb.Fatalf("%s: %s", typ, ps)
		}
		out = append(out, ev)
	}
	return out
}

func exampleRecords(tb testing.TB) []*kgo.Record {
	tb.Helper()
	var out []*kgo.Record
	for _, ev := range exampleEvents(tb) {
		r, err := topics.Encode(ev)
		if err != nil {
			tb.Fatalf("%s: %v", ev.Type, err)
		}
		out = append(out, r)
	}
	return out
}

func cloneRecord(r *kgo.Record) *kgo.Record {
	c := *r
	c.Key = slices.Clone(r.Key)
	c.Value = slices.Clone(r.Value)
	c.Headers = slices.Clone(r.Headers)
	return &c
}

func setHeader(r *kgo.Record, key, value string) *kgo.Record {
	r = cloneRecord(r)
	for i, h := range r.Headers {
		if h.Key == key {
			r.Headers[i].Value = []byte(value)
			return r
		}
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
	return r
}

func dropHeader(r *kgo.Record, key string) *kgo.Record {
	r = cloneRecord(r)
	r.Headers = slices.DeleteFunc(r.Headers, func(h kgo.RecordHeader) bool { return h.Key == key })
	return r
}

// sameEvent compares events through their wire forms, so time zones and
// pointers do not matter.
func sameEvent(a, b domain.Event) bool {
	ja, erra := json.Marshal(a.Data)
	jb, errb := json.Marshal(b.Data)
	return erra == nil && errb == nil && string(ja) == string(jb) &&
		a.ID == b.ID && a.Type == b.Type && a.Source == b.Source &&
		a.Subject == b.Subject && a.Time.Equal(b.Time)
}

func TestCodecRoundTripEveryType(t *testing.T) {
	t.Parallel()
	evs := exampleEvents(t)
	seen := map[string]bool{}
	for _, ev := range evs {
		r, err := topics.Encode(ev)
		if err != nil {
			t.Fatalf("%s: %v", ev.Type, err)
		}
		want, _ := topics.ForType(ev.Type)
		if r.Topic != want || string(r.Key) != ev.Data.AggregateID() {
			t.Errorf("%s: topic %s key %s", ev.Type, r.Topic, r.Key)
		}
		for _, h := range []string{topics.HeaderSpecVersion, topics.HeaderID, topics.HeaderType, topics.HeaderSource, topics.HeaderTime, topics.HeaderSubject, topics.HeaderContentType} {
			if _, ok := topics.Header(r, h); !ok {
				t.Errorf("%s: header %s missing", ev.Type, h)
			}
		}
		got, err := topics.Decode(r)
		if err != nil {
			t.Fatalf("%s: %v", ev.Type, err)
		}
		if !sameEvent(ev, got) {
			t.Errorf("%s: round trip changed the event:\n %+v\n %+v", ev.Type, ev, got)
		}
		seen[ev.Type] = true
	}
	if len(seen) != len(domain.EventTypes()) {
		t.Errorf("round-tripped %d types of %d", len(seen), len(domain.EventTypes()))
	}
}

func recordOf(t *testing.T, recs []*kgo.Record, typ string) *kgo.Record {
	t.Helper()
	for _, r := range recs {
		if h, _ := topics.Header(r, topics.HeaderType); h == typ {
			return r
		}
	}
	t.Fatalf("no %s record", typ)
	return nil
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	recs := exampleRecords(t)
	user, added := recordOf(t, recs, domain.TypeUserActive), recordOf(t, recs, domain.TypeMailboxAdded)

	type tc struct {
		name string
		rec  *kgo.Record
		code domain.Code
	}
	var cases []tc
	for _, h := range []string{topics.HeaderSpecVersion, topics.HeaderID, topics.HeaderType, topics.HeaderSource, topics.HeaderTime} {
		cases = append(cases, tc{"missing " + h, dropHeader(user, h), domain.CodeMissingHeader})
	}
	var plain map[string]any
	_ = json.Unmarshal(added.Value, &plain)
	plain["credentials"] = map[string]any{"password": "hunter2"}
	plainValue, _ := json.Marshal(plain)
	withPlain := cloneRecord(added)
	withPlain.Value = plainValue
	delete(plain, "sealed_credentials")
	onlyPlainValue, _ := json.Marshal(plain)
	onlyPlain := cloneRecord(added)
	onlyPlain.Value = onlyPlainValue

	otherKey := cloneRecord(user)
	otherKey.Key = []byte("0190a5b2-4c5e-7b1a-9c3d-0000000ff001")
	noKey := cloneRecord(user)
	noKey.Key = nil
	badValue := cloneRecord(user)
	badValue.Value = []byte(`{"user_id":`)
	invalid := cloneRecord(user)
	invalid.Value = []byte(`{"user_id":"0190a5b2-4c5e-7b1a-9c3d-00000000b001","source":"logout"}`)

	cases = append(cases,
		tc{"bad ce_time", setHeader(user, topics.HeaderTime, "yesterday"), domain.CodeMalformedHeader},
		tc{"ce_time without zone", setHeader(user, topics.HeaderTime, "2024-07-12T06:47:24"), domain.CodeMalformedHeader},
		tc{"bad specversion", setHeader(user, topics.HeaderSpecVersion, "0.3"), domain.CodeMalformedHeader},
		tc{"bad content-type", setHeader(user, topics.HeaderContentType, "text/plain"), domain.CodeMalformedHeader},
		tc{"unknown type", setHeader(user, topics.HeaderType, "mailplane.user.left.v1"), domain.CodeUnknownType},
		tc{"empty type", setHeader(user, topics.HeaderType, ""), domain.CodeUnknownType},
		tc{"key mismatch", otherKey, domain.CodeKeyMismatch},
		tc{"no key", noKey, domain.CodeKeyMismatch},
		tc{"subject mismatch", setHeader(user, topics.HeaderSubject, "0190a5b2-4c5e-7b1a-9c3d-0000000ff001"), domain.CodeKeyMismatch},
		tc{"plain credentials beside sealed", withPlain, domain.CodePlaintextSecret},
		tc{"plain credentials only", onlyPlain, domain.CodePlaintextSecret},
		tc{"malformed value", badValue, domain.CodeMalformedJSON},
		tc{"invalid data", invalid, domain.CodeInvalid},
		tc{"bad id", setHeader(user, topics.HeaderID, "not-a-uuid"), domain.CodeInvalid},
	)
	for _, c := range cases {
		_, err := topics.Decode(c.rec)
		if got := domain.ErrorCode(err); got != c.code {
			t.Errorf("%s: code %q (%v), want %q", c.name, got, err, c.code)
		}
	}
}

func TestDecodeOptionalHeaders(t *testing.T) {
	t.Parallel()
	for _, r := range exampleRecords(t) {
		for _, h := range []string{topics.HeaderSubject, topics.HeaderContentType} {
			ev, err := topics.Decode(dropHeader(r, h))
			if err != nil {
				t.Errorf("without %s: %v", h, err)
				continue
			}
			if ev.Subject != string(r.Key) {
				t.Errorf("without %s: subject %q, want the key %q", h, ev.Subject, r.Key)
			}
		}
	}
}

func TestDecodeToleratesNewerFields(t *testing.T) {
	t.Parallel()
	r := exampleRecords(t)[0]
	var m map[string]any
	if err := json.Unmarshal(r.Value, &m); err != nil {
		t.Fatal(err)
	}
	m["added_in_a_later_version"] = 1
	r = cloneRecord(r)
	r.Value, _ = json.Marshal(m)
	if _, err := topics.Decode(r); err != nil {
		t.Errorf("a consumer must read fields added by newer producers: %v", err)
	}
}

func TestEncodeRefusesPlainSecrets(t *testing.T) {
	t.Parallel()
	raw, err := examples.Event(domain.TypeMailboxAdded)
	if err != nil {
		t.Fatal(err)
	}
	ev, ps := domain.ParseStructured(raw, exampleNow, nil) // no sealer: credentials stay plain
	if len(ps) == 0 {
		_, err = topics.Encode(ev)
	} else {
		err = ps.Err()
	}
	if domain.ErrorCode(err) != domain.CodePlaintextSecret && !domain.ErrorProblems(err).Has(domain.CodePlaintextSecret) {
		t.Errorf("plain credentials: %v", err)
	}
}
