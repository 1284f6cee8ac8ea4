package domain

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// fastSamples are data that the fast path must decode, or give up on,
// exactly as encoding/json would decode them.
var fastSamples = map[string][]string{
	TypeMailboxAdded: {
		`{"mailbox_id":"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","org_id":"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c","user_id":"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5d","address":"box1@example.com","provider":"gmail","warmup_enabled":true,"imap":{"host":"imap.example.com","port":993,"tls":"implicit","username":"user1"},"sealed_credentials":{"key_id":"k1","alg":"A256GCM","nonce":"AAAA","ciphertext":"c2VhbGVk"}}`,
		` { "mailbox_id" : "x" , "imap" : { } , "sealed_credentials" : { } } ` + "\n",
		`{"address":"bøx@exämple.com","warmup_enabled":false,"imap":{"port":-0}}`,
		`{"credentials":{"password":"p"}}`,
		`{"credentials":{}}`,
		`{"sealed_credentials":null}`,
		`{"mailbox_id":"a","mailbox_id":"b"}`,
		`{"Mailbox_ID":"a"}`,
		`{"mailbox_id":"a\"b"}`,
		`{"mailbox_id":"a\u0041"}`,
		`{"mailbox_id":"\xff"}`,
		`{"imap":{"port":993.0}}`,
		`{"imap":{"port":1e3}}`,
		`{"imap":{"port":0123}}`,
		`{"imap":{"port":99999999999999999999}}`,
		`{"warmup_enabled":truex}`,
		`{"mailbox_id":"a"} x`,
		`{"mailbox_id":"a"}{}`,
		`{"unknown":1}`,
		`{"mailbox_id":"a",}`,
		`[]`,
		`{}`,
	},
	TypeMailboxRemoved: {`{"mailbox_id":"a","reason":"r"}`, `{"reason":1}`},
	TypeCredentialsRotated: {
		`{"mailbox_id":"a","sealed_credentials":{"key_id":"k2","alg":"A256GCM","nonce":"AAAA","ciphertext":"c2Vh"},"cause":"reseal","added_at":"2024-07-12T06:47:24Z"}`,
		`{"sealed_credentials":null}`, `{"added_at":"2024-07-12T06:47:24.5+02:00"}`, `{"added_at":"bad"}`, `{"cause":"reseal","cause":"oauth_rotation"}`, `{"sealed_credentials":{"key_id":1}}`,
	},
	TypeMailboxHealthScored: {
		`{"mailbox_id":"a","state":"healthy","score":12.5,"reason":"r","until":"2024-07-12T07:00:00Z"}`,
		`{"score":-0.0e+1}`, `{"score":1e999}`, `{"score":.5}`, `{"score":1.}`,
		`{"until":"2024-07-12T07:00:00.123+02:00"}`, `{"until":"2024-07-12 07:00:00Z"}`, `{"until":null}`,
	},
	TypeMailboxDisabled: {
		`{"mailbox_id":"a","cause":"auth_failing","reason":"AUTHENTICATIONFAILED","failing_since":"2024-07-10T06:47:24Z"}`,
		`{"cause":"operator","reason":"rü"}`, `{"failing_since":"2024-07-10T08:47:24.5+02:00"}`,
		`{"failing_since":null}`, `{"failing_since":"2024-07-10"}`, `{"failing_since":1}`,
		`{"reason":"a","reason":"b"}`,
	},
	TypeWarmupObserved: {
		`{"mailbox_id":"a","warmup_id":"wu-1.c_2","placement":"junk","landed_at":"2024-07-12T06:40:11Z","source":"imap_sync","recipient_mailbox_id":"b"}`,
		`{"landed_at":"2024-07-12T08:40:11.123456789+02:00","recipient_mailbox_id":""}`, `{"landed_at":"0001-01-01T00:00:00Z"}`,
		`{"landed_at":null}`, `{"landed_at":"x"}`, `{"landed_at":"2024-07-12T06:40:11Z","landed_at":"2024-07-12T06:40:12Z"}`,
		`{"placement":"inbox","source":"delivery_report"}`, `{"warmup_id":"w\u0031"}`,
	},
	TypeOrgPlanChanged: {`{"org_id":"a","plan":"free","dedicated_workers":3,"paid":true,"source":"s"}`, `{"paid":null}`},
	TypeMailboxOwnerTransferred: {`{"mailbox_id":"a","owner":"/product-api","comment":"ticket 42"}`,
		`{"owner":"a","owner":"b"}`, `{"comment":null}`, `{"owner":1}`},
	TypeOrgOwnerTransferred: {`{"org_id":"a","owner":"urn:acme:","comment":"c"}`, `{"org_id":"a\u0041"}`, `{"comment":"x","extra":1}`},
	TypeUserActive:          {`{"user_id":"a","source":"login"}`},
	TypeWorkerHeartbeat:     {`{"worker_id":"a","tier":"","egress":"cold_smtp","address":"1.2.3.4:25","stopping":false}`},
	TypeWorkerHealthSampled: {`{"worker_id":"a","window_seconds":60,"sends":9223372036854775807,"hard_bounces":-1,"complaints":0}`, `{"sends":9223372036854775808}`},
}

// checkFastAgrees fails if the fast path accepts raw but encoding/json
// would decode it differently (or not at all).
func checkFastAgrees(t *testing.T, typ string, raw []byte) (fast bool) {
	t.Helper()
	d, _ := NewData(typ)
	if !decodeFast(d, raw) {
		return false
	}
	want, _ := NewData(typ)
	if err := json.Unmarshal(raw, want); err != nil {
		t.Fatalf("%s %q: fast path decoded what encoding/json refuses: %v", typ, raw, err)
	}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("%s %q: fast path decoded\n%#v\nencoding/json\n%#v", typ, raw, d, want)
	}
	return true
}

func TestFastDecodeAgrees(t *testing.T) {
	fast := 0
	for typ, samples := range fastSamples {
		for _, s := range samples {
			if checkFastAgrees(t, typ, []byte(s)) {
				fast++
			}
		}
	}
	// The plain forms (one per type at least) take the fast path.
	if fast < len(fastSamples) {
		t.Errorf("only %d samples took the fast path", fast)
	}
	// What producers write takes it.
	for _, typ := range EventTypes() {
		raw := []byte(fastSamples[typ][0])
		d, _ := NewData(typ)
		if !decodeFast(d, raw) {
			t.Errorf("%s: the plain form missed the fast path", typ)
		}
	}
}

// TestFastDecodeRefusesPlainCredentials: plain credentials always go
// through encoding/json, whose result Validate rejects.
func TestFastDecodeRefusesPlainCredentials(t *testing.T) {
	for _, s := range []string{`{"credentials":{}}`, `{"sealed_credentials":{},"credentials":{"password":"x"}}`} {
		if decodeFast(new(MailboxAdded), []byte(s)) {
			t.Errorf("%s took the fast path", s)
		}
		d, ps := DecodeData(TypeMailboxAdded, []byte(s), false)
		if len(ps) > 0 || d.(*MailboxAdded).Credentials == nil {
			t.Errorf("%s: credentials not decoded: %v", s, ps)
		}
	}
}

func FuzzFastDecode(f *testing.F) {
	types := EventTypes()
	for i, typ := range types {
		for _, s := range fastSamples[typ] {
			f.Add(uint8(i), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, i uint8, raw []byte) {
		typ := types[int(i)%len(types)]
		checkFastAgrees(t, typ, raw)
		// And DecodeData as a whole is what encoding/json gives.
		d, ps := DecodeData(typ, raw, false)
		if len(ps) == 0 {
			want, _ := NewData(typ)
			if err := json.Unmarshal(raw, want); err != nil || !reflect.DeepEqual(d, want) {
				t.Fatalf("%s %q: DecodeData %#v, encoding/json %#v (%v)", typ, raw, d, want, err)
			}
		}
	})
}

// TestFastDecodeCoversEveryField fills every field of every type (but plain
// credentials, which are refused) and marshals it: the fast path must take
// that and agree, so a field added to a type without its fast path shows
// here rather than as every record quietly taking the slow path.
func TestFastDecodeCoversEveryField(t *testing.T) {
	var fill func(v reflect.Value)
	fill = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.String:
			v.SetString("x")
		case reflect.Int, reflect.Int64:
			v.SetInt(7)
		case reflect.Float64:
			v.SetFloat(1.5)
		case reflect.Bool:
			v.SetBool(true)
		case reflect.Pointer:
			if v.Type() == reflect.TypeFor[*Credentials]() {
				return
			}
			v.Set(reflect.New(v.Type().Elem()))
			fill(v.Elem())
		case reflect.Struct:
			if v.Type() == reflect.TypeFor[time.Time]() {
				v.Set(reflect.ValueOf(time.Date(2024, 7, 12, 7, 0, 0, 5, time.UTC)))
				return
			}
			for i := range v.NumField() {
				fill(v.Field(i))
			}
		default:
			t.Fatalf("no filler for %s", v.Type())
		}
	}
	for _, typ := range EventTypes() {
		d, _ := NewData(typ)
		fill(reflect.ValueOf(d).Elem())
		raw, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if !checkFastAgrees(t, typ, raw) {
			t.Errorf("%s: %s missed the fast path", typ, raw)
		}
	}
}
