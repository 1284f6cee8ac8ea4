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
		tc{"empty id", setHeader(user, topics.HeaderID, ""), domain.CodeRequired},
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

// TestDecodeWhatOtherKafkaProducersWrite: records as other clients write
// them are read: a UUIDv4 id, a charset on the content type, extension
// and dataschema headers (kept on the event), and structured-mode records
// (the whole CloudEvent in the value). What they must not carry is still
// refused the same way.
func TestDecodeWhatOtherKafkaProducersWrite(t *testing.T) {
	t.Parallel()
	recs := exampleRecords(t)
	user, added := recordOf(t, recs, domain.TypeUserActive), recordOf(t, recs, domain.TypeMailboxAdded)
	const v4 = "2c5ea4c0-4067-4f5a-9a31-1c9b6f4e8d21"

	binary := setHeader(setHeader(user, topics.HeaderID, v4), topics.HeaderContentType, "application/json; charset=utf-8")
	binary = setHeader(binary, topics.HeaderDataSchema, "https://schemas.example.org/user.active")
	binary.Headers = append(binary.Headers,
		kgo.RecordHeader{Key: "ce_traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")})
	ev, err := topics.Decode(binary)
	if err != nil {
		t.Fatalf("binary record from another producer: %v", err)
	}
	if ev.ID != v4 || ev.Extensions["traceparent"] == "" || ev.DataSchema != "https://schemas.example.org/user.active" {
		t.Errorf("decoded %+v", ev)
	}
	// Encoding it again keeps what it carried.
	again, err := topics.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := topics.Header(again, "ce_traceparent"); v != ev.Extensions["traceparent"] {
		t.Errorf("re-encoded ce_traceparent %q", v)
	}
	if v, _ := topics.Header(again, topics.HeaderDataSchema); v != ev.DataSchema {
		t.Errorf("re-encoded ce_dataschema %q, the producer sent %q", v, ev.DataSchema)
	}

	structuredOf := func(r *kgo.Record, extra map[string]any) *kgo.Record {
		t.Helper()
		e, err := topics.Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := domain.MarshalStructured(e)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		for k, v := range extra {
			m[k] = v
		}
		out := cloneRecord(r)
		out.Value, _ = json.Marshal(m)
		out.Headers = []kgo.RecordHeader{{Key: topics.HeaderContentType, Value: []byte("application/cloudevents+json; charset=UTF-8")}}
		return out
	}
	s, err := topics.Decode(structuredOf(user, map[string]any{"id": v4, "partitionkey": "user-7", "sampled": true}))
	if err != nil {
		t.Fatalf("structured record: %v", err)
	}
	if s.ID != v4 || s.Type != domain.TypeUserActive || s.Extensions["partitionkey"] != "user-7" || s.Extensions["sampled"] != "true" {
		t.Errorf("structured decoded %+v", s)
	}
	if _, err := topics.Decode(structuredOf(added, nil)); err != nil {
		t.Errorf("structured mailbox.added with sealed credentials: %v", err)
	}

	var plain map[string]any
	_ = json.Unmarshal(added.Value, &plain)
	plain["credentials"] = map[string]any{"password": "hunter2"}
	otherKey := structuredOf(user, nil)
	otherKey.Key = []byte("0190a5b2-4c5e-7b1a-9c3d-0000000ff001")
	for _, c := range []struct {
		name string
		rec  *kgo.Record
		code domain.Code
	}{
		{"structured, plain credentials", structuredOf(added, map[string]any{"data": plain}), domain.CodePlaintextSecret},
		{"structured, key mismatch", otherKey, domain.CodeKeyMismatch},
		{"structured, no time", structuredOf(user, map[string]any{"time": nil}), domain.CodeInvalid},
		{"structured, bad extension name", structuredOf(user, map[string]any{"Trace-Parent": "x"}), domain.CodeUnknownField},
		{"binary, extension with a newline", setHeader(user, "ce_traceparent", "00\nbad"), domain.CodeForbiddenCharacter},
		{"binary, charset not utf-8", setHeader(user, topics.HeaderContentType, "application/json; charset=latin1"), domain.CodeMalformedHeader},
		{"binary, id with a control character", setHeader(user, topics.HeaderID, "order\u00074711"), domain.CodeForbiddenCharacter},
	} {
		if _, err := topics.Decode(c.rec); domain.ErrorCode(err) != c.code {
			t.Errorf("%s: %v, want code %q", c.name, err, c.code)
		}
	}
}
