package api

import (
	"reflect"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/producer"
)

// batchSamples are batch bodies the fast split must read as the streaming
// decoder does, or leave to it.
func batchSamples(t testing.TB) []string {
	ok := string(mailplanetest.MustJSON(t, []any{mailboxAdded(), userActive()}))
	one := string(mailplanetest.MustJSON(t, userActive()))
	return []string{
		ok,
		"[ " + one + " ,\n" + one + " ]",
		"[" + one + "]",
		"[" + one + "," + one + "]",
		"[" + one + " " + one + "]",
		"[" + one + ",]",
		"[," + one + "]",
		"[" + one + "] x",
		"[" + one + "][]",
		"[" + one,
		"[" + one[:len(one)-1] + "]",
		`[1, "a", null, true, {"a":[1,{"b":"]"}]}]`,
		`[{"id":"a\"],"}]`,
		`[{"id":"a\\"}]`,
		`[tru e]`,
		`[{]`,
		`[}]`,
		`[]]`,
		`[]`,
		`[ ]`,
		`[`,
		`["unterminated]`,
		`[{"specversion":"1.0","id":"x","type":"mailplane.user.active.v1","source":"/s","data":{"user_id":"a"}} {}]`,
		`[{"specversion":"1.0","id":"x","type":"mailplane.user.active.v1","source":"/s","data":{"user_id":"a","user_id":"b"}}]`,
		`[{"specversion":"1.0","id":"x","type":"mailplane.user.active.v1","source":"/s","data":{"user_id":"a"}},{"id":"x","data":{,}}]`,
	}
}

// checkBatchSplitAgrees fails if parseBatchFast takes a body that
// parseBatchStream refuses or reads differently.
func checkBatchSplitAgrees(t *testing.T, s *Server, body []byte) bool {
	t.Helper()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	fast, ok := s.parseBatchFast(body, now)
	if !ok {
		return false
	}
	stream, err := s.parseBatchStream(append([]byte(nil), body...), now)
	if err != nil {
		t.Fatalf("%q: the fast split took a batch the stream refuses: %v", body, err)
	}
	if len(fast) != len(stream) {
		t.Fatalf("%q: %d events, the stream %d", body, len(fast), len(stream))
	}
	for i := range fast {
		f, w := fast[i], stream[i]
		// Sealed credentials differ (fresh nonces); all else is the same.
		if f.id != w.id || f.typ != w.typ || !reflect.DeepEqual(f.problems, w.problems) ||
			f.ev.ID != w.ev.ID || f.ev.Type != w.ev.Type || f.ev.Subject != w.ev.Subject || f.ev.Time != w.ev.Time {
			t.Fatalf("%q: event %d\n%#v\nthe stream\n%#v", body, i, f, w)
		}
	}
	return true
}

func TestBatchSplitAgrees(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{noBroker: true, prod: producer.New(nil)})
	fast := 0
	for _, b := range batchSamples(t) {
		if checkBatchSplitAgrees(t, e.srv, []byte(b)) {
			fast++
		}
	}
	// The well-formed batches (and the one with invalid but well-formed
	// events) take the fast split.
	if fast < 6 {
		t.Errorf("only %d batches took the fast split", fast)
	}
	// A batch over the limit is left to the stream, which says too_large.
	many := []byte("[" + string(mailplanetest.MustJSON(t, userActive())))
	for range e.srv.cfg.maxBatch {
		many = append(many, ',')
		many = append(many, mailplanetest.MustJSON(t, userActive())...)
	}
	many = append(many, ']')
	if _, ok := e.srv.parseBatchFast(many, time.Now()); ok {
		t.Errorf("a batch over the limit took the fast split")
	}
	if _, err := e.srv.parseBatch(many, time.Now()); err == nil || err.Code != domain.CodeTooLarge {
		t.Errorf("a batch over the limit: %v", err)
	}
}

func FuzzBatchSplit(f *testing.F) {
	for _, b := range batchSamples(f) {
		f.Add([]byte(b))
	}
	e := newEnv(f, envOpts{noBroker: true, prod: producer.New(nil)})
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) == 0 || body[0] != '[' {
			return
		}
		checkBatchSplitAgrees(t, e.srv, body)
	})
}
