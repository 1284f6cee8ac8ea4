package topics_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

// hostile are characters no text field or attribute may hold.
var hostile = []string{"\x00", "\r", "\n", "\r\nforged: line", "\x1b[2J", "\x7f", "\u0085", "\u2028", "\u202e", "\u2066"}

// A record written straight to a domain topic by a non-mailplane producer
// with a hostile ce_source (CR/LF forge lines in kcat and Console views) or
// a ce_source that is not valid UTF-8 or not a URI-reference is refused by
// every consumer (they all decode with topics.Decode, and the refused
// record goes to the DLQ) rather than folded.
func TestDecodeRefusesHostileSource(t *testing.T) {
	t.Parallel()
	for _, r := range exampleRecords(t) {
		typ, _ := topics.Header(r, topics.HeaderType)
		for _, h := range hostile {
			_, err := topics.Decode(setHeader(r, topics.HeaderSource, "mailplane/cli"+h))
			if code := domain.ErrorCode(err); code != domain.CodeForbiddenCharacter {
				t.Errorf("%s: ce_source with %+q: got %v, want forbidden_character", typ, h, err)
			}
		}
		for _, s := range []string{"mailplane/\xff", "with space", "a%zz"} {
			if _, err := topics.Decode(setHeader(r, topics.HeaderSource, s)); err == nil {
				t.Errorf("%s: ce_source %+q decoded", typ, s)
			}
		}
		// ce_subject must be the aggregate id, so a hostile one is refused too.
		if _, err := topics.Decode(setHeader(r, topics.HeaderSubject, string(r.Key)+"\r\n")); err == nil {
			t.Errorf("%s: ce_subject with CR/LF decoded", typ)
		}
	}
}

// Every string in every example record's data, with each hostile character
// appended, is refused when decoded from the topic.
func TestDecodeRefusesHostileData(t *testing.T) {
	t.Parallel()
	n := 0
	for _, r := range exampleRecords(t) {
		typ, _ := topics.Header(r, topics.HeaderType)
		var data map[string]any
		if err := json.Unmarshal(r.Value, &data); err != nil {
			t.Fatal(err)
		}
		for _, path := range stringLeaves(data, "") {
			for _, h := range hostile {
				n++
				v := editLeaf(t, r.Value, path, h)
				bad := cloneRecord(r)
				bad.Value = v
				if _, err := topics.Decode(bad); err == nil {
					t.Errorf("%s: %s with %+q decoded", typ, path, h)
				}
			}
		}
	}
	if n < 100 {
		t.Fatalf("only %d samples: the walk is broken", n)
	}
}

func stringLeaves(m map[string]any, prefix string) []string {
	var out []string
	for k, v := range m {
		switch v := v.(type) {
		case string:
			out = append(out, prefix+k)
		case map[string]any:
			out = append(out, stringLeaves(v, prefix+k+".")...)
		}
	}
	return out
}

func editLeaf(t *testing.T, raw []byte, path, suffix string) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	keys := strings.Split(path, ".")
	obj := m
	for _, k := range keys[:len(keys)-1] {
		obj = obj[k].(map[string]any)
	}
	obj[keys[len(keys)-1]] = obj[keys[len(keys)-1]].(string) + suffix
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func workerChanged(address string) topics.Decision {
	return topics.Decision{
		ID: decID, Source: "mailplane/placement-engine",
		Data: &domain.PlacementWorkerChanged{
			PlacementMeta: domain.PlacementMeta{At: decisionAt, Reason: domain.ReasonHeartbeat},
			WorkerID:      decWorker, Tier: domain.TierSharedPremium, Egress: domain.EgressColdSMTP,
			Address: address, Capacity: 16,
		},
		Cause: topics.Cause{ID: "0190a5b2-4c5e-7b1a-9c3d-00000000e001", Type: domain.TypeWorkerHeartbeat,
			Topic: topics.WorkerEvents, Partition: 1, Offset: 9, Index: 0, Count: 1},
	}
}

// The engine never writes a decision with hostile text; one written before
// the rule (the NUL address of issue 9) is read with the text cleaned, the
// same by every reader, so the placement projection and the engine's
// restore move past it instead of retrying forever.
func TestDecisionTextHygiene(t *testing.T) {
	t.Parallel()
	for _, h := range hostile {
		if _, err := topics.EncodeDecision(workerChanged("10.0.0.1:25" + h)); domain.ErrorCode(err) != domain.CodeForbiddenCharacter {
			t.Errorf("address with %+q: EncodeDecision says %v, want forbidden_character", h, err)
		}
	}
	r, err := topics.EncodeDecision(workerChanged("10.0.0.1:25"))
	if err != nil {
		t.Fatal(err)
	}
	legacy := cloneRecord(r)
	legacy.Value = []byte(strings.Replace(string(r.Value), `"10.0.0.1:25"`, `"10.0.0.1:25\u0000\r\n"`, 1))
	if string(legacy.Value) == string(r.Value) {
		t.Fatal("the address was not replaced")
	}
	d, err := topics.DecodeDecision(legacy)
	if err != nil {
		t.Fatalf("legacy decision with a NUL address: %v", err)
	}
	if got := d.Data.(*domain.PlacementWorkerChanged).Address; got != "10.0.0.1:25\uFFFD\uFFFD\uFFFD" {
		t.Errorf("address read as %+q", got)
	}
	// What was cleaned encodes again: it is storable and valid.
	if _, err := topics.EncodeDecision(d); err != nil {
		t.Errorf("re-encoding the cleaned decision: %v", err)
	}
}
