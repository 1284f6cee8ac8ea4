package topics_test

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

// fuzzHeaders are the headers the fuzzer sets, in argument order.
var fuzzHeaders = []string{
	topics.HeaderSpecVersion, topics.HeaderID, topics.HeaderType, topics.HeaderSource,
	topics.HeaderTime, topics.HeaderSubject, topics.HeaderContentType,
}

// FuzzDecode feeds Decode arbitrary keys, values and header values (each
// header present or not, by a bit of present). Decode must not panic; every
// error must carry a stable code other than internal; and an event that
// decodes must encode again and decode to the same event.
func FuzzDecode(f *testing.F) {
	for _, r := range exampleRecords(f) {
		h := func(k string) string { v, _ := topics.Header(r, k); return v }
		add := func(key, value []byte, present uint8, hs []string) {
			f.Add(key, value, present, hs[0], hs[1], hs[2], hs[3], hs[4], hs[5], hs[6])
		}
		hs := make([]string, len(fuzzHeaders))
		for i, k := range fuzzHeaders {
			hs[i] = h(k)
		}
		add(r.Key, r.Value, 0x7f, hs)
		add(r.Key, r.Value[:len(r.Value)/2], 0x7f, hs)
		add(r.Key, r.Value[:len(r.Value)-1], 0x7f, hs)
		add(r.Key[:len(r.Key)-1], r.Value, 0x7f, hs)
		add(r.Key, r.Value, 0x7f&^(1<<4), hs) // no ce_time
		add(r.Key, r.Value, 0x1f, hs)         // no subject, no content-type
		add(nil, nil, 0, hs)
		mangled := append([]byte(nil), r.Value...)
		mangled[len(mangled)/3] ^= 0x20
		add(r.Key, mangled, 0x7f, hs)
		bad := append([]string(nil), hs...)
		bad[4] = "2024-07-12T06:47:24.5+02:00"
		add(r.Key, r.Value, 0x7f, bad)
		bad[4] = "2024-13-12T06:47:24Z"
		add(r.Key, r.Value, 0x7f, bad)
		bad[4] = "0000-01-01T00:30:00+01:00" // year -1 in UTC
		add(r.Key, r.Value, 0x7f, bad)
		bad[4] = "9999-12-31T23:30:00-01:00" // year 10000 in UTC
		add(r.Key, r.Value, 0x7f, bad)
		bad = append([]string(nil), hs...)
		bad[2] = "mailplane.mailbox.added.v2"
		add(r.Key, r.Value, 0x7f, bad)
	}
	f.Add([]byte("k"), []byte(`{"mailbox_id":"k","credentials":{"password":"x"}}`), uint8(0x7f),
		"1.0", "0190a5b2-4c5e-7b1a-9c3d-00000000e005", domain.TypeMailboxAdded, "/s", "2024-07-12T06:47:24Z", "", "application/json")
	f.Add([]byte(""), []byte(`null`), uint8(0x7f),
		"1.0", "0190a5b2-4c5e-7b1a-9c3d-00000000e005", domain.TypeWorkerHeartbeat, "/s", "2024-07-12T06:47:24Z", "", "")

	f.Fuzz(func(t *testing.T, key, value []byte, present uint8, spec, id, typ, source, ts, subject, ct string) {
		r := &kgo.Record{Key: key, Value: value}
		for i, v := range []string{spec, id, typ, source, ts, subject, ct} {
			if present&(1<<i) != 0 {
				r.Headers = append(r.Headers, kgo.RecordHeader{Key: fuzzHeaders[i], Value: []byte(v)})
			}
		}
		ev, err := topics.Decode(r)
		if err != nil {
			if code := domain.ErrorCode(err); code == "" || code == domain.CodeInternal {
				t.Fatalf("error without a stable code: %q: %v", code, err)
			}
			return
		}
		r2, err := topics.Encode(ev)
		if err != nil {
			t.Fatalf("decoded event does not encode: %v\n%+v", err, ev)
		}
		ev2, err := topics.Decode(r2)
		if err != nil {
			t.Fatalf("re-encoded event does not decode: %v", err)
		}
		if !sameEvent(ev, ev2) {
			t.Fatalf("round trip changed the event:\n %+v\n %+v", ev, ev2)
		}
		r3, err := topics.Encode(ev2)
		if err != nil || string(r3.Value) != string(r2.Value) || string(r3.Key) != string(r2.Key) {
			t.Fatalf("encoding is not stable: %v\n%s\n%s", err, r2.Value, r3.Value)
		}
	})
}
