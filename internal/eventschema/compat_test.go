package eventschema_test

import (
	"encoding/json"
	"io/fs"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/eventschema"
)

// base is a small schema in the shape of the event schemas.
const base = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "$id": "urn:test:thing.v1",
  "title": "thing",
  "description": "a thing",
  "type": "object",
  "additionalProperties": false,
  "required": ["id", "kind", "inner"],
  "properties": {
    "id": {"type": "string", "pattern": "^[a-z]+$", "description": "id"},
    "kind": {"type": "string", "enum": ["a", "b"]},
    "name": {"type": "string", "minLength": 1, "maxLength": 100},
    "count": {"type": "integer", "minimum": 0, "maximum": 10},
    "score": {"type": "number", "exclusiveMaximum": 100},
    "at": {"type": "string", "format": "date-time"},
    "inner": {
      "type": "object",
      "additionalProperties": false,
      "required": ["port"],
      "properties": {
        "port": {"type": "integer", "minimum": 1, "maximum": 65535},
        "host": {"type": "string", "maxLength": 253},
        "deep": {"type": "object", "properties": {"x": {"type": "boolean"}}}
      }
    },
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}},
    "open": {"type": "object"}
  }
}`

// mutate applies f to a decoded copy of base.
func mutate(f func(m map[string]any)) string {
	var m map[string]any
	if err := json.Unmarshal([]byte(base), &m); err != nil {
		panic(err)
	}
	f(m)
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func props(m map[string]any, path ...string) map[string]any {
	for _, p := range path {
		m = m["properties"].(map[string]any)[p].(map[string]any)
	}
	return m["properties"].(map[string]any)
}

func prop(m map[string]any, path ...string) map[string]any {
	return props(m, path[:len(path)-1]...)[path[len(path)-1]].(map[string]any)
}

func TestBreakingChangesSynthetic(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		next string
		want string // substring of the single expected "path: message"; "" for compatible
	}{
		// compatible
		{"identical", base, ""},
		{"description edited", mutate(func(m map[string]any) { m["description"] = "another"; prop(m, "id")["description"] = "x" }), ""},
		{"title and examples", mutate(func(m map[string]any) { m["title"] = "t"; m["examples"] = []any{1}; prop(m, "kind")["x-note"] = 1 }), ""},
		{"optional property added", mutate(func(m map[string]any) { props(m)["colour"] = map[string]any{"type": "string"} }), ""},
		{"nested optional property added", mutate(func(m map[string]any) { props(m, "inner")["user"] = map[string]any{"type": "string"} }), ""},
		{"enum value added", mutate(func(m map[string]any) { prop(m, "kind")["enum"] = []any{"a", "b", "c"} }), ""},
		{"enum reordered", mutate(func(m map[string]any) { prop(m, "kind")["enum"] = []any{"b", "a"} }), ""},
		{"maxLength raised", mutate(func(m map[string]any) { prop(m, "name")["maxLength"] = 200 }), ""},
		{"maxLength removed", mutate(func(m map[string]any) { delete(prop(m, "name"), "maxLength") }), ""},
		{"minLength lowered", mutate(func(m map[string]any) { prop(m, "name")["minLength"] = 0 }), ""},
		{"minimum lowered", mutate(func(m map[string]any) { prop(m, "count")["minimum"] = -5 }), ""},
		{"maximum raised", mutate(func(m map[string]any) { prop(m, "inner", "port")["maximum"] = 70000 }), ""},
		{"maximum same value written as float", mutate(func(m map[string]any) { prop(m, "count")["maximum"] = 10.0 }), ""},
		{"pattern removed", mutate(func(m map[string]any) { delete(prop(m, "id"), "pattern") }), ""},
		{"format removed", mutate(func(m map[string]any) { delete(prop(m, "at"), "format") }), ""},
		{"no longer required", mutate(func(m map[string]any) { m["required"] = []any{"id", "inner"} }), ""},
		{"required reordered", mutate(func(m map[string]any) { m["required"] = []any{"inner", "kind", "id"} }), ""},
		{"items loosened", mutate(func(m map[string]any) { delete(prop(m, "tags")["items"].(map[string]any), "maxLength") }), ""},
		{"additionalProperties opened", mutate(func(m map[string]any) { m["additionalProperties"] = true }), ""},
		{"text hygiene pattern added", mutate(func(m map[string]any) { prop(m, "name")["pattern"] = domain.TextPattern }), ""},

		// breaking
		{"property removed", mutate(func(m map[string]any) { delete(props(m), "name") }), "data.name: property removed"},
		{"nested property removed", mutate(func(m map[string]any) { delete(props(m, "inner"), "host") }), "data.inner.host: property removed"},
		{"deep property removed", mutate(func(m map[string]any) { delete(props(m, "inner", "deep"), "x") }), "data.inner.deep.x: property removed"},
		{"type changed", mutate(func(m map[string]any) { prop(m, "count")["type"] = "string" }), "data.count: type changed from integer to string"},
		{"type widened", mutate(func(m map[string]any) { prop(m, "count")["type"] = []any{"integer", "null"} }), "data.count: type changed"},
		{"nested type changed", mutate(func(m map[string]any) { prop(m, "inner", "port")["type"] = "number" }), "data.inner.port: type changed"},
		{"enum value removed", mutate(func(m map[string]any) { prop(m, "kind")["enum"] = []any{"a"} }), `data.kind: enum value "b" removed`},
		{"enum added", mutate(func(m map[string]any) { prop(m, "name")["enum"] = []any{"x"} }), "data.name: enum"},
		{"maxLength lowered", mutate(func(m map[string]any) { prop(m, "name")["maxLength"] = 99 }), "data.name: maxLength lowered from 100 to 99"},
		{"nested maxLength lowered", mutate(func(m map[string]any) { prop(m, "inner", "host")["maxLength"] = 63 }), "data.inner.host: maxLength lowered"},
		{"maxLength added", mutate(func(m map[string]any) { prop(m, "at")["maxLength"] = 40 }), "data.at: maxLength 40 added"},
		{"minLength raised", mutate(func(m map[string]any) { prop(m, "name")["minLength"] = 2 }), "data.name: minLength raised from 1 to 2"},
		{"minimum raised", mutate(func(m map[string]any) { prop(m, "inner", "port")["minimum"] = 1024 }), "data.inner.port: minimum raised from 1 to 1024"},
		{"minimum added", mutate(func(m map[string]any) { prop(m, "score")["minimum"] = 0 }), "data.score: minimum 0 added"},
		{"maximum lowered", mutate(func(m map[string]any) { prop(m, "count")["maximum"] = 9 }), "data.count: maximum lowered from 10 to 9"},
		{"exclusiveMaximum lowered", mutate(func(m map[string]any) { prop(m, "score")["exclusiveMaximum"] = 99.5 }), "data.score: exclusiveMaximum lowered from 100 to 99.5"},
		{"pattern changed", mutate(func(m map[string]any) { prop(m, "id")["pattern"] = "^[a-z0-9]+$" }), "data.id: pattern changed"},
		{"pattern added", mutate(func(m map[string]any) { prop(m, "name")["pattern"] = "^x" }), "data.name: pattern"},
		{"text hygiene pattern anchored differently", mutate(func(m map[string]any) { prop(m, "name")["pattern"] = domain.TextPattern[1:] + "x" }), "data.name: pattern"},
		{"text hygiene class folded outside a negated class", mutate(func(m map[string]any) {
			prop(m, "id")["pattern"] = "^[a-z]+" + domain.TextPatternClass + "$"
		}), "data.id: pattern changed"},
		{"text hygiene class folded into a positive class", mutate(func(m map[string]any) {
			prop(m, "id")["pattern"] = "^[" + domain.TextPatternClass + "a-z]+$"
		}), "data.id: pattern changed"},
		{"text hygiene pattern and another change", mutate(func(m map[string]any) {
			prop(m, "id")["pattern"] = "^[^" + domain.TextPatternClass + "a-y]+$"
		}), "data.id: pattern changed"},
		{"format changed", mutate(func(m map[string]any) { prop(m, "at")["format"] = "date" }), "data.at: format changed"},
		{"newly required", mutate(func(m map[string]any) { m["required"] = []any{"id", "kind", "inner", "name"} }), "data.name: became required"},
		{"nested newly required", mutate(func(m map[string]any) { prop(m, "inner")["required"] = []any{"port", "host"} }), "data.inner.host: became required"},
		{"open object closed", mutate(func(m map[string]any) { prop(m, "open")["additionalProperties"] = false }), "data.open: additional properties no longer allowed"},
		{"property added to open object", mutate(func(m map[string]any) {
			prop(m, "open")["properties"] = map[string]any{"a": map[string]any{"type": "string"}}
		}), "data.open.a: type changed from any to string"},
		{"items tightened", mutate(func(m map[string]any) { prop(m, "tags")["items"].(map[string]any)["maxLength"] = 5 }), "data.tags[]: maxLength lowered"},
		{"unanalysed keyword added", mutate(func(m map[string]any) { prop(m, "name")["not"] = map[string]any{"const": "x"} }), "data.name: keyword not changed"},
		{"property made false", mutate(func(m map[string]any) { props(m)["name"] = false }), "data.name: no value allowed"},
		{"id changed", mutate(func(m map[string]any) { m["$id"] = "urn:test:thing.v2" }), "data: keyword $id changed"},
	}
	for _, c := range cases {
		got, err := eventschema.BreakingChanges([]byte(base), []byte(c.next))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		switch {
		case c.want == "" && len(got) > 0:
			t.Errorf("%s: compatible change reported as breaking: %v", c.name, got)
		case c.want != "" && len(got) != 1:
			t.Errorf("%s: want one breaking change like %q, got %v", c.name, c.want, got)
		case c.want != "" && !strings.Contains(got[0].String(), c.want):
			t.Errorf("%s: got %q, want it to contain %q", c.name, got[0], c.want)
		}
	}
}

// TestBreakingChangesTextHygieneFold: refusing control characters in a
// field that had a negated-class pattern (the mailbox address) is the one
// pattern tightening that is compatible.
func TestBreakingChangesTextHygieneFold(t *testing.T) {
	t.Parallel()
	schema := func(p string) []byte {
		b, _ := json.Marshal(map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"type": "string", "pattern": p}}})
		return b
	}
	c := domain.TextPatternClass
	for _, tc := range []struct {
		old, next  string
		compatible bool
	}{
		{`^[^@\s]+@[^@\s]+$`, `^[^@\s` + c + `]+@[^@\s` + c + `]+$`, true},
		{`^[^@\s]+@[^@\s]+$`, `^[^@\s` + c + `]+@[^@\s]+$`, true},
		{`^[^@\s]+@[^@\s]+$`, `^[^@\s]` + c + `+@[^@\s]+$`, false},
		{`^[^@\s]+@[^@\s]+$`, `^[^@\s` + c + `]+@[^@]+$`, false},
		{`^[^@\s]+$`, domain.TextPattern, false},
	} {
		got, err := eventschema.BreakingChanges(schema(tc.old), schema(tc.next))
		if err != nil {
			t.Fatal(err)
		}
		if (len(got) == 0) != tc.compatible {
			t.Errorf("%q -> %q: breaking changes %v, want compatible %v", tc.old, tc.next, got, tc.compatible)
		}
	}
}

func TestBreakingChangesManyAtOnce(t *testing.T) {
	t.Parallel()
	next := mutate(func(m map[string]any) {
		delete(props(m), "name")
		prop(m, "kind")["enum"] = []any{"b"}
		prop(m, "inner", "port")["maximum"] = 1000
		m["required"] = []any{"id", "kind", "inner", "count"}
	})
	got, err := eventschema.BreakingChanges([]byte(base), []byte(next))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Errorf("want 4 breaking changes, got %v", got)
	}
}

func TestBreakingChangesRejectsNonSchemas(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{``, `{`, `[]`, `"x"`} {
		if _, err := eventschema.BreakingChanges([]byte(bad), []byte(base)); err == nil {
			t.Errorf("baseline %q accepted", bad)
		}
		if _, err := eventschema.BreakingChanges([]byte(base), []byte(bad)); err == nil {
			t.Errorf("current %q accepted", bad)
		}
	}
}

// TestBreakingChangesOnRealSchemas proves the checker bites on the real
// files: each schema is compatible with itself, and a typical careless edit
// of each is caught.
func TestBreakingChangesOnRealSchemas(t *testing.T) {
	t.Parallel()
	for _, typ := range domain.EventTypes() {
		b, err := fs.ReadFile(domain.SchemaFiles(), domain.SchemaFileName(typ))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := eventschema.BreakingChanges(b, b); err != nil || len(got) > 0 {
			t.Errorf("%s vs itself: %v %v", typ, got, err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		req := m["required"].([]any)
		dropped := req[len(req)-1].(string)
		delete(m["properties"].(map[string]any), dropped)
		m["required"] = req[:len(req)-1]
		edited, _ := json.Marshal(m)
		got, err := eventschema.BreakingChanges(b, edited)
		if err != nil || len(got) != 1 || got[0].Path != "data."+dropped {
			t.Errorf("%s without %s: %v %v", typ, dropped, got, err)
		}
	}
}
