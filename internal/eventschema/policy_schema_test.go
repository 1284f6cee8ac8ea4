package eventschema

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/mailplane/mailplane/domain"
)

func compilePolicySchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(domain.PolicySchema()))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	const url = "file:///mailplane/schemas/policy/mailplane.policy.v1.json"
	if err := c.AddResource(url, doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(url)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// policySample is the default policy document with one change: set is a
// path of object keys (levels by index) and the value it takes.
func policySample(t *testing.T, v any, path ...any) []byte {
	t.Helper()
	b, err := json.Marshal(domain.DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(path) == 0 {
		doc = v
	} else {
		parent := doc
		for _, k := range path[:len(path)-1] {
			parent = step(parent, k)
		}
		switch k := path[len(path)-1].(type) {
		case string:
			if v == deleted {
				delete(parent.(map[string]any), k)
			} else {
				parent.(map[string]any)[k] = v
			}
		case int:
			parent.([]any)[k] = v
		}
	}
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func step(v any, k any) any {
	if s, ok := k.(string); ok {
		return v.(map[string]any)[s]
	}
	return v.([]any)[k.(int)]
}

// deleted, as a sample's value, removes the field.
var deleted = &struct{}{}

// The policy schema and domain.ParsePolicy agree: on valid documents, on
// documents both refuse, and the schema accepts what only the Go
// validation can check (ranges of durations, orders, units of rates) —
// so the schema never refuses a document Go accepts.
func TestPolicySchemaAgreesWithParsePolicy(t *testing.T) {
	s := compilePolicySchema(t)
	level := func(rate float64, state, dur string) map[string]any {
		return map[string]any{"min_rate": rate, "state": state, "for": dur}
	}
	valid := map[string][]byte{
		"default":        policySample(t, 1, "version"),
		"one level":      policySample(t, []any{level(0.3, "blocked", "24h")}, "health", "levels"),
		"short window":   policySample(t, "1h", "health", "window"),
		"share of 1":     policySample(t, 1, "placement", "liveness_hold_share"),
		"seconds dwell":  policySample(t, "90s", "placement", "tier_dwell"),
		"no tier dwell":  policySample(t, "0s", "placement", "tier_dwell"),
		"no hold bound":  policySample(t, "0s", "placement", "liveness_hold_max"),
		"max sends":      policySample(t, 1_000_000_000, "placement", "worker_health_min_sends"),
		"rate of 1":      policySample(t, 1, "health", "levels", 0, "min_rate"),
		"integral float": policySample(t, json.Number("20.0"), "health", "min_observations"),
	}
	bothRefuse := map[string][]byte{
		"version 2":           policySample(t, 2, "version"),
		"unknown field":       policySample(t, 1, "placement", "x"),
		"unknown level field": policySample(t, map[string]any{"min_rate": 0.5, "state": "watch", "for": "0s", "x": 1}, "health", "levels", 0),
		"missing field":       policySample(t, deleted, "placement", "tier_dwell"),
		"missing level for":   policySample(t, map[string]any{"min_rate": 0.5, "state": "watch"}, "health", "levels", 0),
		"null":                policySample(t, nil, "health", "window"),
		"healthy level":       policySample(t, "healthy", "health", "levels", 4, "state"),
		"unknown state":       policySample(t, "doomed", "health", "levels", 4, "state"),
		"rate above 1":        policySample(t, 1.5, "placement", "worker_hard_bounce_rates", "blocked"),
		"rate 0":              policySample(t, 0, "health", "levels", 0, "min_rate"),
		"count 0":             policySample(t, 0, "placement", "max_forget_per_tick"),
		"count too big":       policySample(t, 1_000_001, "placement", "liveness_hold_min_workers"),
		"count 1e30":          policySample(t, json.Number("1e30"), "health", "min_observations"),
		"fractional count":    policySample(t, 2.5, "health", "min_observations"),
		"string count":        policySample(t, "20", "health", "min_observations"),
		"compound duration":   policySample(t, "1h30m", "health", "window"),
		"negative duration":   policySample(t, "-1h", "health", "window"),
		"leading zero":        policySample(t, "0168h", "health", "window"),
		"days":                policySample(t, "7d", "health", "window"),
		"no levels":           policySample(t, []any{}, "health", "levels"),
		"nine levels":         policySample(t, []any{level(.9, "watch", "0s"), level(.8, "watch", "0s"), level(.7, "watch", "0s"), level(.6, "watch", "0s"), level(.5, "watch", "0s"), level(.4, "watch", "0s"), level(.3, "watch", "0s"), level(.2, "watch", "0s"), level(.1, "watch", "0s")}, "health", "levels"),
		"not an object":       policySample(t, []any{}),
	}
	goOnly := map[string][]byte{
		"window too long":          policySample(t, "2161h", "health", "window"),
		"levels ascending":         policySample(t, []any{level(0.1, "watch", "0s"), level(0.2, "blocked", "1h")}, "health", "levels"),
		"rates not ascending":      policySample(t, 0.002, "placement", "worker_complaint_rates", "quarantined"),
		"rate finer than ppm":      policySample(t, 0.0010005, "placement", "worker_complaint_rates", "watch"),
		"share finer than 1/1000":  policySample(t, 0.5505, "placement", "liveness_hold_share"),
		"retention below a minute": policySample(t, "10s", "placement", "worker_retention"),
		"hold max of seconds":      policySample(t, "30s", "placement", "liveness_hold_max"),
	}
	check := func(name string, doc []byte, wantSchema, wantGo bool) {
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		schemaOK := s.Validate(inst) == nil
		_, ps := domain.ParsePolicy(doc)
		if schemaOK != wantSchema || (len(ps) == 0) != wantGo {
			t.Errorf("%s: schema accepts %v (want %v), ParsePolicy accepts %v (want %v; %v)\n%s", name, schemaOK, wantSchema, len(ps) == 0, wantGo, ps, doc)
		}
	}
	for name, doc := range valid {
		check(name, doc, true, true)
	}
	for name, doc := range bothRefuse {
		check(name, doc, false, false)
	}
	for name, doc := range goOnly {
		check(name, doc, true, false)
	}
}
