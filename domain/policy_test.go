package domain_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
)

func defaultPolicyJSON(t testing.TB) []byte {
	t.Helper()
	b, err := json.Marshal(domain.DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The default policy is today's health rules exactly, and its document
// parses back to it.
func TestDefaultPolicyIsTodaysRules(t *testing.T) {
	p := domain.DefaultPolicy()
	if !reflect.DeepEqual(p.Health(), domain.DefaultHealthPolicy()) {
		t.Fatalf("DefaultPolicy().Health() = %+v, want DefaultHealthPolicy()", p.Health())
	}
	got, ps := domain.ParsePolicy(defaultPolicyJSON(t))
	if len(ps) > 0 {
		t.Fatalf("the default document is refused: %v", ps)
	}
	if !reflect.DeepEqual(got, p) {
		t.Fatalf("round trip: %+v, want %+v", got, p)
	}
}

// The document's text is pinned: a change to a default or a field name
// shows here.
func TestDefaultPolicyDocument(t *testing.T) {
	want := `{"version":1,"health":{"window":"168h","min_observations":20,"probation":"72h","levels":[` +
		`{"min_rate":0.8,"state":"blocked","for":"2160h"},{"min_rate":0.4,"state":"blocked","for":"720h"},` +
		`{"min_rate":0.2,"state":"quarantined","for":"168h"},{"min_rate":0.15,"state":"throttled","for":"72h"},` +
		`{"min_rate":0.1,"state":"watch","for":"0s"}]},"placement":{"band_dwell":"1h","liveness_window":"30s",` +
		`"liveness_hold_share":0.55,"liveness_hold_min_workers":3,"liveness_hold_max":"10m","tier_dwell":"5m",` +
		`"worker_retention":"168h","max_forget_per_tick":5000,"worker_health_min_sends":100,` +
		`"worker_complaint_rates":{"watch":0.001,"throttled":0.003,"quarantined":0.005,"blocked":0.01},` +
		`"worker_hard_bounce_rates":{"watch":0.02,"throttled":0.05,"quarantined":0.08,"blocked":0.1}}}`
	if got := string(defaultPolicyJSON(t)); got != want {
		t.Fatalf("default document:\n%s\nwant\n%s", got, want)
	}
}

// Health returns a copy: changing it leaves the policy as it was.
func TestPolicyHealthIsACopy(t *testing.T) {
	p := domain.DefaultPolicy()
	h := p.Health()
	h.Levels[0].MinRate = 0.99
	if p.HealthRules.Levels[0].MinRate != 0.8 {
		t.Fatal("Health() shares the policy's levels")
	}
}

// withField returns the default document with one field (a path of object
// keys) set to v.
func withField(t *testing.T, v any, path ...string) []byte {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(defaultPolicyJSON(t), &doc); err != nil {
		t.Fatal(err)
	}
	m := doc
	for _, k := range path[:len(path)-1] {
		m = m[k].(map[string]any)
	}
	m[path[len(path)-1]] = v
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParsePolicyRefuses(t *testing.T) {
	levels := func(n int) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = map[string]any{"min_rate": 1 - float64(i)/float64(n+1), "state": "watch", "for": "0s"}
		}
		return out
	}
	for _, c := range []struct {
		name  string
		doc   []byte
		field string
		code  domain.Code
	}{
		{"version 2", withField(t, 2, "version"), "version", domain.CodeInvalid},
		{"unknown field", withField(t, 1, "health", "windows"), "health.windows", domain.CodeUnknownField},
		{"unknown top-level field", withField(t, 1, "comment"), "comment", domain.CodeUnknownField},
		{"unknown level field", withField(t, []any{map[string]any{"min_rate": 0.5, "state": "watch", "for": "0s", "x": 1}}, "health", "levels"), "health.levels[0].x", domain.CodeUnknownField},
		{"case-folded level field", withField(t, []any{map[string]any{"Min_Rate": 0.5, "state": "watch", "for": "0s"}}, "health", "levels"), "health.levels[0].Min_Rate", domain.CodeUnknownField},
		{"null", withField(t, nil, "placement", "band_dwell"), "placement.band_dwell", domain.CodeInvalidType},
		{"negative duration", withField(t, "-1h", "placement", "tier_dwell"), "placement.tier_dwell", domain.CodeInvalid},
		{"compound duration", withField(t, "1h30m", "placement", "tier_dwell"), "placement.tier_dwell", domain.CodeInvalid},
		{"window too long", withField(t, "2161h", "health", "window"), "health.window", domain.CodeOutOfRange},
		{"window too short", withField(t, "59m", "health", "window"), "health.window", domain.CodeOutOfRange},
		{"huge duration", withField(t, "9999999999h", "health", "probation"), "health.probation", domain.CodeOutOfRange},
		{"control character", withField(t, "1h\n", "placement", "band_dwell"), "placement.band_dwell", domain.CodeForbiddenCharacter},
		{"rate above 1", withField(t, 1.5, "placement", "liveness_hold_share"), "placement.liveness_hold_share", domain.CodeOutOfRange},
		{"rate 0", withField(t, 0, "placement", "worker_complaint_rates", "watch"), "placement.worker_complaint_rates.watch", domain.CodeOutOfRange},
		{"rate finer than ppm", withField(t, 0.0010005, "placement", "worker_complaint_rates", "watch"), "placement.worker_complaint_rates.watch", domain.CodeInvalid},
		{"rates not ascending", withField(t, 0.002, "placement", "worker_complaint_rates", "quarantined"), "placement.worker_complaint_rates.quarantined", domain.CodeInvalid},
		{"count 0", withField(t, 0, "health", "min_observations"), "health.min_observations", domain.CodeOutOfRange},
		{"count overflow", withField(t, json.Number("1e30"), "placement", "max_forget_per_tick"), "placement.max_forget_per_tick", domain.CodeInvalidType},
		{"fractional count", withField(t, 2.5, "placement", "liveness_hold_min_workers"), "placement.liveness_hold_min_workers", domain.CodeInvalidType},
		{"string for a number", withField(t, "20", "health", "min_observations"), "health.min_observations", domain.CodeInvalidType},
		{"retention below a minute", withField(t, "10s", "placement", "worker_retention"), "placement.worker_retention", domain.CodeOutOfRange},
		{"retention below liveness", bytes.Replace(withField(t, "1m", "placement", "worker_retention"), []byte(`"liveness_window":"30s"`), []byte(`"liveness_window":"1h"`), 1), "placement.worker_retention", domain.CodeOutOfRange},
		{"hold max of seconds", withField(t, "30s", "placement", "liveness_hold_max"), "placement.liveness_hold_max", domain.CodeOutOfRange},
		{"no levels", withField(t, []any{}, "health", "levels"), "health.levels", domain.CodeRequired},
		{"a thousand levels", withField(t, levels(1000), "health", "levels"), "health.levels", domain.CodeOutOfRange},
		{"levels ascending", withField(t, []any{map[string]any{"min_rate": 0.1, "state": "watch", "for": "0s"}, map[string]any{"min_rate": 0.2, "state": "blocked", "for": "1h"}}, "health", "levels"), "health.levels[1].min_rate", domain.CodeInvalid},
		{"healthy level", withField(t, []any{map[string]any{"min_rate": 0.5, "state": "healthy", "for": "0s"}}, "health", "levels"), "health.levels[0].state", domain.CodeInvalid},
		{"level without for", withField(t, []any{map[string]any{"min_rate": 0.5, "state": "watch"}}, "health", "levels"), "health.levels[0].for", domain.CodeRequired},
		{"NaN", bytes.Replace(defaultPolicyJSON(t), []byte(`"liveness_hold_share":0.55`), []byte(`"liveness_hold_share":NaN`), 1), "", domain.CodeMalformedJSON},
		{"repeated field", bytes.Replace(defaultPolicyJSON(t), []byte(`"version":1`), []byte(`"version":1,"version":1`), 1), "version", domain.CodeMalformedJSON},
		{"trailing data", append(defaultPolicyJSON(t), []byte(` {}`)...), "", domain.CodeMalformedJSON},
		{"not an object", []byte(`[]`), "", domain.CodeInvalidType},
		{"empty", nil, "", domain.CodeMalformedJSON},
		{"10 MB", append(defaultPolicyJSON(t), bytes.Repeat([]byte(" "), 10<<20)...), "", domain.CodeTooLarge},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, ps := domain.ParsePolicy(c.doc)
			if len(ps) == 0 {
				t.Fatalf("accepted: %+v", p)
			}
			for _, pr := range ps {
				if pr.Field == c.field && pr.Code == c.code {
					return
				}
			}
			t.Fatalf("problems %v, want %s at %q", ps, c.code, c.field)
		})
	}
}

// A policy other than the default parses to what it says.
func TestParsePolicyReadsEveryField(t *testing.T) {
	doc := strings.NewReplacer(`"window":"168h"`, `"window":"72h"`, `"tier_dwell":"5m"`, `"tier_dwell":"90s"`,
		`"liveness_hold_share":0.55`, `"liveness_hold_share":0.6`).Replace(string(defaultPolicyJSON(t)))
	p, ps := domain.ParsePolicy([]byte(doc))
	if len(ps) > 0 {
		t.Fatal(ps)
	}
	if p.HealthRules.Window.Hours() != 72 || p.PlacementRules.TierDwell.Seconds() != 90 || p.PlacementRules.LivenessHoldPermille != 600 {
		t.Fatalf("parsed %+v", p)
	}
	if ch := domain.DiffPolicies(domain.DefaultPolicy(), p); len(ch) != 3 || ch[0] != (domain.PolicyChange{Field: "health.window", From: "168h", To: "72h"}) {
		t.Fatalf("diff %+v", ch)
	}
}

func TestDiffPolicies(t *testing.T) {
	a, b := domain.DefaultPolicy(), domain.DefaultPolicy()
	if ch := domain.DiffPolicies(a, b); len(ch) != 0 {
		t.Fatalf("equal policies differ: %+v", ch)
	}
	b.HealthRules.Levels = b.HealthRules.Levels[:4]
	b.PlacementRules.ComplaintPPM[0] = 2000
	want := []domain.PolicyChange{
		{Field: "health.levels[4].min_rate", From: "0.1"}, {Field: "health.levels[4].state", From: "watch"},
		{Field: "health.levels[4].for", From: "0s"},
		{Field: "placement.worker_complaint_rates.watch", From: "0.001", To: "0.002"},
	}
	if ch := domain.DiffPolicies(a, b); !reflect.DeepEqual(ch, want) {
		t.Fatalf("diff %+v, want %+v", ch, want)
	}
}

// FuzzParsePolicy: any input is either refused with problems, each with a
// code, or accepted as a policy whose own document parses back to it.
func FuzzParsePolicy(f *testing.F) {
	f.Add(defaultPolicyJSON(f))
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"health":{"levels":[{"min_rate":1e-400,"state":"watch","for":"0s"}]}}`))
	f.Add(bytes.Replace(defaultPolicyJSON(f), []byte(`"168h"`), []byte(`"0168h"`), 1))
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, ps := domain.ParsePolicy(raw)
		if len(ps) > 0 {
			for _, pr := range ps {
				if pr.Code == "" {
					t.Fatalf("problem without a code: %v", ps)
				}
			}
			return
		}
		if err := p.Health().Validate(); err != nil {
			t.Fatalf("accepted a policy the scorer refuses: %v", err)
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		back, ps := domain.ParsePolicy(b)
		if len(ps) > 0 || !reflect.DeepEqual(back, p) {
			t.Fatalf("accepted %q, but its document %s parses to %+v, %v", raw, b, back, ps)
		}
	})
}
