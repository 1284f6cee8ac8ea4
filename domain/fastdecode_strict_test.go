package domain

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// strictSamples are data the strict (ingest) fast path must decode, or give
// up on, exactly as the strict path proper would: what strictShape refuses
// or rewrites, and plain credentials, which only producers send.
var strictSamples = map[string][]string{
	TypeMailboxAdded: {
		`{"mailbox_id":"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","org_id":"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c","user_id":"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5d","address":"box1@example.com","provider":"smtp_imap","warmup_enabled":true,"imap":{"host":"imap.example.com","port":993,"tls":"implicit","username":"user1"},"credentials":{"password":"hunter2"}}`,
		`{"credentials":{"oauth_refresh_token":"r","password":"p"}}`,
		`{"credentials":{"password":"p","password":"q"}}`,
		`{"credentials":{"password":"p"},"credentials":{"password":"q"}}`,
		`{"credentials":{"Password":"p"}}`,
		`{"credentials":{"password":null}}`,
		`{"credentials":{"password":1}}`,
		`{"credentials":{"password":"p\u0000"}}`,
		"{\"credentials\":{\"password\":\"p\x01\"}}",
		`{"credentials":{"password":"p","pin":"1"}}`,
		`{"credentials":null}`,
		`{"credentials":[]}`,
		`{"imap":{"port":993.0}}`,
		`{"imap":{"port":9.93e2}}`,
		`{"imap":null}`,
		`{"imap":{"host":null}}`,
		`{"address":"A@B.C","ADDRESS":"x"}`,
	},
	TypeMailboxHealthScored: {
		`{"score":100.0000000000000000001}`, `{"score":-1e-400}`, `{"score":99.5}`, `{"score":1e2}`,
		`{"until":"2024-07-12T7:00:00Z"}`, `{"until":"2024-07-12t07:00:00z"}`, `{"until":"2024-07-12T07:00:00,5Z"}`,
		`{"until":"2024-07-12T07:00:00+0200"}`, `{"until":"2024-07-12T24:00:00Z"}`, `{"until":1}`,
	},
	TypeWarmupObserved: {`{"landed_at":"2024-07-12T06:40:11.5Z"}`, `{"landed_at":"2024-07-12T06:40:11.Z"}`},
}

// checkStrictFastAgrees fails if the strict fast path accepts raw but the
// strict path proper refuses it or decodes it differently.
func checkStrictFastAgrees(t *testing.T, typ string, raw []byte) (fast bool) {
	t.Helper()
	d, _ := NewData(typ)
	if !decodeFastStrict(d, raw) {
		return false
	}
	want, _ := NewData(typ)
	got, ps := decodeDataSlow(want, raw, true)
	if len(ps) > 0 {
		t.Fatalf("%s %q: the strict fast path decoded what the strict path refuses: %v", typ, raw, ps)
	}
	if !reflect.DeepEqual(d, got) {
		t.Fatalf("%s %q: the strict fast path decoded\n%#v\nthe strict path\n%#v", typ, raw, d, got)
	}
	return true
}

func TestStrictFastAgrees(t *testing.T) {
	t.Parallel()
	fast := 0
	for _, samples := range []map[string][]string{fastSamples, strictSamples} {
		for typ, ss := range samples {
			for _, s := range ss {
				if checkStrictFastAgrees(t, typ, []byte(s)) {
					fast++
				}
			}
		}
	}
	if fast < len(fastSamples) {
		t.Errorf("only %d samples took the strict fast path", fast)
	}
	// What producers send takes it: the plain form of every type, and a
	// mailbox.added with plain credentials.
	for _, typ := range EventTypes() {
		d, _ := NewData(typ)
		if !decodeFastStrict(d, []byte(fastSamples[typ][0])) {
			t.Errorf("%s: the plain form missed the strict fast path", typ)
		}
	}
	if !decodeFastStrict(new(MailboxAdded), []byte(strictSamples[TypeMailboxAdded][0])) {
		t.Errorf("a mailbox.added with plain credentials missed the strict fast path")
	}
}

// TestStrictRefusalsKept: what the strict walk refuses, DecodeData still
// refuses, with the same code and field, now that plain forms take a fast
// path first.
func TestStrictRefusalsKept(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		typ, raw, field string
		code            Code
	}{
		{TypeMailboxAdded, `{"mailbox_id":"a","mailbox_id":"b"}`, "data.mailbox_id", CodeMalformedJSON},
		{TypeMailboxAdded, `{"credentials":{"password":"p","password":"q"}}`, "data.credentials.password", CodeMalformedJSON},
		{TypeMailboxAdded, `{"Mailbox_ID":"a"}`, "data.Mailbox_ID", CodeUnknownField},
		{TypeMailboxAdded, `{"credentials":{"password":"p","pin":"1"}}`, "data.credentials.pin", CodeUnknownField},
		{TypeMailboxAdded, `{"imap":null}`, "data.imap", CodeInvalidType},
		{TypeMailboxAdded, `{"credentials":{"password":null}}`, "data.credentials.password", CodeInvalidType},
		{TypeMailboxAdded, `{"credentials":{"password":1}}`, "data.credentials.password", CodeInvalidType},
		{TypeMailboxAdded, `{"imap":{"port":"993"}}`, "data.imap.port", CodeInvalidType},
		{TypeMailboxAdded, `{"mailbox_id":"a"} x`, "data", CodeMalformedJSON},
		{TypeMailboxHealthScored, `{"until":"2024-07-12T7:00:00Z"}`, "data.until", CodeInvalid},
		{TypeMailboxHealthScored, `{"until":1}`, "data.until", CodeInvalidType},
	} {
		_, ps := DecodeData(tc.typ, []byte(tc.raw), true)
		found := false
		for _, p := range ps {
			if p.Field == tc.field && p.Code == tc.code {
				found = true
			}
		}
		if !found {
			t.Errorf("%s %s: want %s at %s, got %v", tc.typ, tc.raw, tc.code, tc.field, ps)
		}
	}
	// Rewritten, not refused: an integral number with a fraction, and a
	// float just off an integer bound.
	d, ps := DecodeData(TypeMailboxAdded, []byte(`{"imap":{"port":993.0}}`), true)
	if len(ps) > 0 || d.(*MailboxAdded).IMAP.Port != 993 {
		t.Errorf("port 993.0: %v %v", d, ps)
	}
	d, ps = DecodeData(TypeMailboxHealthScored, []byte(`{"score":100.0000000000000000001}`), true)
	if len(ps) > 0 || d.(*MailboxHealthScored).Score <= 100 {
		t.Errorf("score just above 100: %v %v", d, ps)
	}
}

func FuzzStrictFastDecode(f *testing.F) {
	types := EventTypes()
	for i, typ := range types {
		for _, s := range append(fastSamples[typ], strictSamples[typ]...) {
			f.Add(uint8(i), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, i uint8, raw []byte) {
		checkStrictFastAgrees(t, types[int(i)%len(types)], raw)
	})
}

// structuredSamples wraps data in an envelope, plus envelopes the fast
// path must leave to parseEnvelope.
func structuredSamples() []string {
	env := func(typ, data string) string {
		return `{"specversion":"1.0","id":"ev-1","type":"` + typ + `","source":"/crm","time":"2026-05-01T12:00:00Z","subject":"s","datacontenttype":"application/json","data":` + data + `}`
	}
	var out []string
	for _, samples := range []map[string][]string{fastSamples, strictSamples} {
		for typ, ss := range samples {
			for _, s := range ss {
				out = append(out, env(typ, s))
			}
		}
	}
	user := `{"user_id":"a","source":"login"}`
	return append(out,
		`{"data":`+user+`,"type":"mailplane.user.active.v1","specversion":"1.0","id":"x","source":"/s"}`,
		`{"type":"mailplane.user.active.v1","specversion":"1.0","id":"x","source":"/s","data":`+user+`}`,
		`{"type":"mailplane.user.active.v1","type":"mailplane.user.active.v1","id":"x","data":`+user+`}`,
		`{"type":"mailplane.user.active.v1","id":"x","id":"y","data":`+user+`}`,
		`{"type":"mailplane.user.active.v1","ID":"x","data":`+user+`}`,
		`{"type":"mailplane.user.active.v1","id":"x\u0041","data":`+user+`}`,
		`{"type":"mailplane.user.active.v1","id":"x","traceparent":"00-abc","data":`+user+`}`,
		`{"type":"mailplane.user.active.v1","id":1,"data":`+user+`}`,
		`{"type":"mailplane.user.active.v1","id":null,"data":`+user+`}`,
		`{"type":"mailplane.user.active.v1","data":null}`,
		`{"type":"mailplane.user.active.v1"}`,
		`{"type":"mailplane.user.active.v1","data":`+user+`,"data":`+user+`}`,
		`{"type":"mailplane.nope.v1","data":`+user+`}`,
		`{"type":"mailplane.user.active.v1","data":`+user+`} {}`,
		`{"type":"mailplane.user.active.v1","data":`+user+`,}`,
		` {"type":"mailplane.user.active.v1","data":`+user+"}\n",
		`[]`, `{}`, ``,
	)
}

// checkStructuredFastAgrees fails if parseStructuredFast accepts raw but the
// generic path (parseEnvelope, then the strict path proper) reads it
// differently or refuses it.
func checkStructuredFastAgrees(t *testing.T, raw []byte) (fast bool) {
	t.Helper()
	a, d, ok := parseStructuredFast(raw)
	if !ok {
		return false
	}
	wa, data, ps := parseEnvelope(raw)
	if len(ps) > 0 {
		t.Fatalf("%q: the fast path read an envelope parseEnvelope refuses: %v", raw, ps)
	}
	if !reflect.DeepEqual(a, wa) {
		t.Fatalf("%q: attributes\n%#v\nparseEnvelope\n%#v", raw, a, wa)
	}
	zero, _ := NewData(wa.Type)
	wd, dps := decodeDataSlow(zero, data, true)
	if len(dps) > 0 || !reflect.DeepEqual(d, wd) {
		t.Fatalf("%q: data\n%#v\nthe strict path\n%#v %v", raw, d, wd, dps)
	}
	return true
}

func TestParseStructuredFastAgrees(t *testing.T) {
	t.Parallel()
	fast := 0
	for _, s := range structuredSamples() {
		if checkStructuredFastAgrees(t, []byte(s)) {
			fast++
		}
	}
	if fast < len(fastSamples) {
		t.Errorf("only %d samples took the fast path", fast)
	}
	// What producers send takes it (mailbox.added with plain credentials),
	// and ParseStructured's answer is the generic path's.
	raw := []byte(structuredSamples()[0])
	for _, s := range structuredSamples() {
		if strings.Contains(s, `"password":"hunter2"`) {
			raw = []byte(strings.Replace(s, `"subject":"s"`, `"subject":"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"`, 1))
		}
	}
	if !checkStructuredFastAgrees(t, raw) {
		t.Fatalf("%s missed the fast path", raw)
	}
	// Encoders that sort members (a map) put data before type.
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	sorted, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if !checkStructuredFastAgrees(t, sorted) {
		t.Fatalf("%s missed the fast path", sorted)
	}
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	seal := func(plain, aad []byte) (SealedSecret, error) {
		return SealedSecret{KeyID: "k1", Alg: SealAlg, Nonce: "AAAAAAAAAAAAAAAA", Ciphertext: "c2VhbGVk"}, nil
	}
	ev, ps := ParseStructured(raw, now, seal)
	a, data, _ := parseEnvelope(raw)
	want, wps := FromAttributes(a, data, now, seal, nil)
	if !reflect.DeepEqual(ev, want) || !reflect.DeepEqual(ps, wps) {
		t.Fatalf("ParseStructured %#v %v\nthe generic path %#v %v", ev, ps, want, wps)
	}
	if len(ps) > 0 {
		t.Fatalf("%s: %v", raw, ps)
	}
	if ev.Data.(*MailboxAdded).Credentials != nil || ev.Data.(*MailboxAdded).SealedCredentials == nil {
		t.Fatalf("credentials not sealed: %#v", ev.Data)
	}
}

func FuzzParseStructuredFast(f *testing.F) {
	for _, s := range structuredSamples() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkStructuredFastAgrees(t, raw)
	})
}
