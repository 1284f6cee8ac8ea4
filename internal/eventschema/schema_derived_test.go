package eventschema_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/domain/schemas/derived"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/topics"
)

// The derived records (placement decisions, mailbox.state, sync.tier and
// sync.audit) have their schemas in schemas/derived, apart from the domain
// event schemas that the other schema tests enumerate as schemas/*.json.

const derivedBaselineDir = "../../domain/schemas/derived/baseline"

// derivedRecordTypes is every derived record type the Go code declares
// (domain's catalog).
func derivedRecordTypes() []string { return domain.DerivedRecordTypes() }

// derivedSchemaDoc returns typ's derived schema, decoded with numbers kept.
func derivedSchemaDoc(t testing.TB, typ string) map[string]any {
	t.Helper()
	b, ok := derived.Schema(typ)
	if !ok {
		t.Fatalf("no derived schema for %s", typ)
	}
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("%s: %v", typ, err)
	}
	return m
}

var derivedKeyPlaceholder = regexp.MustCompile(`\{([a-z_]+)\}`)

// derivedKey renders a schema's x-mailplane-key template ("{mailbox_id}",
// "partition-{partition}") from a record's data.
func derivedKey(template string, data map[string]any) (string, error) {
	var err error
	key := derivedKeyPlaceholder.ReplaceAllStringFunc(template, func(s string) string {
		name := s[1 : len(s)-1]
		switch v := data[name].(type) {
		case string:
			return v
		case json.Number:
			return v.String()
		case float64:
			return fmt.Sprint(v)
		}
		err = fmt.Errorf("key field %s missing or not a string or number", name)
		return ""
	})
	return key, err
}

// TestDerivedSchemaPerType: every derived record type has exactly one
// schema, and no schema is for a type the code does not declare.
func TestDerivedSchemaPerType(t *testing.T) {
	t.Parallel()
	want := derivedRecordTypes()
	if got := derived.Types(); !slices.Equal(got, want) {
		t.Errorf("derived schemas for %v, want %v", got, want)
	}
	if len(slices.Compact(slices.Clone(want))) != len(want) {
		t.Errorf("a derived type is declared twice: %v", want)
	}
	names, err := fs.Glob(derived.Files(), "*")
	if err != nil {
		t.Fatal(err)
	}
	var wantNames []string
	for _, typ := range want {
		wantNames = append(wantNames, derived.FileName(typ))
	}
	if !slices.Equal(names, wantNames) {
		t.Errorf("embedded files %v, want %v", names, wantNames)
	}
	for _, typ := range want {
		if slices.Contains(domain.EventTypes(), typ) {
			t.Errorf("%s is both a domain event type and a derived record type", typ)
		}
		if _, err := fs.Stat(domain.SchemaFiles(), domain.SchemaFileName(typ)); err == nil {
			t.Errorf("%s has a schema among the domain event schemas too", typ)
		}
	}
	// Every decision type is registered with the decoder.
	for _, typ := range domain.PlacementDecisionTypes() {
		if _, ok := domain.NewPlacementDecision(typ); !ok {
			t.Errorf("%s is not a registered decision type", typ)
		}
	}
	if _, ok := derived.Schema("mailplane.nothing.v1"); ok {
		t.Error("schema for an unknown type")
	}
	if _, ok := derived.Schema("../mailplane.mailbox.added.v1"); ok {
		t.Error("schema outside the directory")
	}
	v, err := eventschema.NewDerived()
	if err != nil {
		t.Fatal(err)
	}
	if got := v.Types(); !slices.Equal(got, want) {
		t.Errorf("validator types %v, want %v", got, want)
	}
}

// TestDerivedSchemaFiles checks each schema's identity and shape for
// analysts: draft 2020-12, $id and title from the type, the topic and key
// annotations, closed objects, and every field described and bounded.
func TestDerivedSchemaFiles(t *testing.T) {
	t.Parallel()
	topicNames := map[string]bool{}
	for _, s := range topics.Catalog(topics.Config{}) {
		topicNames[s.Name] = true
	}
	for _, typ := range derived.Types() {
		m := derivedSchemaDoc(t, typ)
		checks := map[string]any{
			"$schema":              "https://json-schema.org/draft/2020-12/schema",
			"$id":                  domain.SchemaURI(typ),
			"title":                typ,
			"type":                 "object",
			"additionalProperties": false,
		}
		for k, v := range checks {
			if m[k] != v {
				t.Errorf("%s: %s is %v, want %v", typ, k, m[k], v)
			}
		}
		topic, _ := m["x-mailplane-topic"].(string)
		if !topicNames[topic] {
			t.Errorf("%s: x-mailplane-topic %q is not a catalog topic", typ, topic)
		}
		if d, _ := m["description"].(string); !strings.Contains(d, topic) {
			t.Errorf("%s: the description does not name the topic %s", typ, topic)
		}
		key, _ := m["x-mailplane-key"].(string)
		required := stringList(m["required"])
		ks := derivedKeyPlaceholder.FindAllStringSubmatch(key, -1)
		if len(ks) != 1 {
			t.Errorf("%s: x-mailplane-key %q must name one field", typ, key)
		}
		for _, k := range ks {
			if !slices.Contains(required, k[1]) {
				t.Errorf("%s: key field %s is not required", typ, k[1])
			}
		}
		derivedDescribedAndBounded(t, typ, "data", m)
	}
}

func stringList(v any) []string {
	arr, _ := v.([]any)
	var out []string
	for _, x := range arr {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

var derivedFixedLengthPattern = regexp.MustCompile(`\{[0-9]+\}\$$`)

func derivedDescribedAndBounded(t *testing.T, typ, path string, node map[string]any) {
	t.Helper()
	if d, _ := node["description"].(string); strings.TrimSpace(d) == "" {
		t.Errorf("%s: %s has no description", typ, path)
	}
	_, enum := node["enum"]
	switch node["type"] {
	case "string":
		_, max := node["maxLength"]
		pattern, _ := node["pattern"].(string)
		if f, ok := node["format"]; ok && (f != "date-time" || pattern == "") {
			t.Errorf("%s: %s: format %v must be date-time with the strict RFC 3339 pattern", typ, path, f)
		}
		if !enum && !max && pattern == "" {
			t.Errorf("%s: %s is an unbounded string", typ, path)
		}
		if pattern != "" && !max && !derivedFixedLengthPattern.MatchString(pattern) && node["format"] == nil {
			t.Errorf("%s: %s: pattern %s does not bound the length", typ, path, pattern)
		}
	case "integer", "number":
		if !enum && (node["minimum"] == nil || node["maximum"] == nil) {
			t.Errorf("%s: %s needs minimum and maximum", typ, path)
		}
	case "boolean":
	case "object":
		if node["additionalProperties"] != false {
			t.Errorf("%s: object %s must set additionalProperties: false", typ, path)
		}
	default:
		t.Errorf("%s: %s has type %v", typ, path, node["type"])
	}
	props, _ := node["properties"].(map[string]any)
	for _, r := range stringList(node["required"]) {
		if _, ok := props[r]; !ok {
			t.Errorf("%s: %s requires %s, which it does not describe", typ, path, r)
		}
	}
	if dr, ok := node["dependentRequired"].(map[string]any); ok {
		for k, v := range dr {
			for _, r := range append(stringList(v), k) {
				if _, ok := props[r]; !ok {
					t.Errorf("%s: %s: dependentRequired names %s, which it does not describe", typ, path, r)
				}
			}
		}
	}
	if props == nil && node["type"] == "object" {
		t.Errorf("%s: object %s has no properties", typ, path)
	}
	for name, p := range props {
		derivedDescribedAndBounded(t, typ, path+"."+name, p.(map[string]any))
	}
}

// ---- released baselines (schemas/derived/baseline) ----

// TestDerivedSchemaCompatibleWithBaseline fails CI on a breaking change to
// a released derived schema (see schemas/README.md).
func TestDerivedSchemaCompatibleWithBaseline(t *testing.T) {
	t.Parallel()
	checkCompatibleWithBaseline(t, derivedBaselineDir, derived.Files())
}

// TestDerivedSchemaEveryTypeHasBaseline makes releasing a derived type
// include its baseline.
func TestDerivedSchemaEveryTypeHasBaseline(t *testing.T) {
	t.Parallel()
	names := baselineNames(t, derivedBaselineDir)
	for _, typ := range derived.Types() {
		if !slices.Contains(names, derived.FileName(typ)) {
			t.Errorf("%s has no baseline: copy domain/schemas/derived/%s to %s and add its line to SHA256SUMS", typ, derived.FileName(typ), derivedBaselineDir)
		}
	}
}

// TestDerivedSchemaBaselinesUnedited checks every derived baseline against
// its SHA256SUMS.
func TestDerivedSchemaBaselinesUnedited(t *testing.T) {
	t.Parallel()
	checkBaselinesUnedited(t, derivedBaselineDir)
}

// TestDerivedBaselineCheckCatchesBreaks guards the check itself on a derived
// schema: the edits the compatibility rule forbids are found, the ones it
// allows are not.
func TestDerivedBaselineCheckCatchesBreaks(t *testing.T) {
	t.Parallel()
	typ := domain.TypePlacementRefused
	orig, _ := derived.Schema(typ)
	edit := func(f func(m map[string]any)) []byte {
		m := derivedSchemaDoc(t, typ)
		f(m)
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	prop := func(m map[string]any, name string) map[string]any {
		return m["properties"].(map[string]any)[name].(map[string]any)
	}
	breaking := map[string]func(m map[string]any){
		"enum value removed": func(m map[string]any) {
			p := prop(m, "band")
			p["enum"] = p["enum"].([]any)[:2]
		},
		"weight removed": func(m map[string]any) {
			p := prop(m, "weight_milli")
			p["enum"] = p["enum"].([]any)[1:]
		},
		"property removed": func(m map[string]any) { delete(m["properties"].(map[string]any), "cause") },
		"newly required":   func(m map[string]any) { m["required"] = append(m["required"].([]any), "from_worker") },
		"dependency changed": func(m map[string]any) {
			m["dependentRequired"] = map[string]any{"from_worker": []any{"from_band", "cause"}}
		},
		"pattern changed": func(m map[string]any) { prop(m, "org_id")["pattern"] = "^[0-9a-f]{36}$" },
	}
	for name, f := range breaking {
		cs, err := eventschema.BreakingChanges(orig, edit(f))
		if err != nil || len(cs) == 0 {
			t.Errorf("%s: not found (%v)", name, err)
		}
	}
	compatible := map[string]func(m map[string]any){
		"description":  func(m map[string]any) { prop(m, "band")["description"] = "better words" },
		"new reason":   func(m map[string]any) { p := prop(m, "reason"); p["enum"] = append(p["enum"].([]any), "new_code") },
		"new optional": func(m map[string]any) { m["properties"].(map[string]any)["note"] = map[string]any{"type": "string"} },
		"annotation":   func(m map[string]any) { m["x-mailplane-key"] = "{mailbox_id}" },
	}
	for name, f := range compatible {
		cs, err := eventschema.BreakingChanges(orig, edit(f))
		if err != nil || len(cs) > 0 {
			t.Errorf("%s: reported as breaking: %v %v", name, cs, err)
		}
	}
}
