package domain_test

import (
	"encoding/json"
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
)

// TestSchemaFiles checks the embedded schemas: one per event type, named
// and identified by the type, draft 2020-12, and every field described for
// analysts.
func TestSchemaFiles(t *testing.T) {
	t.Parallel()
	names, err := fs.Glob(domain.SchemaFiles(), "*")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, typ := range domain.EventTypes() {
		want = append(want, domain.SchemaFileName(typ))
	}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("schema files %v, want %v", names, want)
	}
	for _, typ := range domain.EventTypes() {
		b, ok := domain.Schema(typ)
		if !ok {
			t.Errorf("no schema for %s", typ)
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Errorf("%s: %v", typ, err)
			continue
		}
		checks := map[string]any{
			"$schema": "https://json-schema.org/draft/2020-12/schema",
			"$id":     domain.SchemaURI(typ),
			"title":   typ,
			"type":    "object",
		}
		for k, v := range checks {
			if m[k] != v {
				t.Errorf("%s: %s is %v, want %v", typ, k, m[k], v)
			}
		}
		describedAndBounded(t, typ, "data", m)
	}
	if _, ok := domain.Schema("mailplane.nothing.v1"); ok {
		t.Error("schema for an unknown type")
	}
}

func describedAndBounded(t *testing.T, typ, path string, node map[string]any) {
	t.Helper()
	if d, _ := node["description"].(string); strings.TrimSpace(d) == "" {
		t.Errorf("%s: %s has no description", typ, path)
	}
	switch node["type"] {
	case "string":
		_, enum := node["enum"]
		_, max := node["maxLength"]
		_, format := node["format"]
		if !enum && !max && !format && !strings.Contains(node["pattern"].(string), "{12}$") {
			t.Errorf("%s: %s is an unbounded string", typ, path)
		}
	case "integer", "number":
		if node["minimum"] == nil || node["maximum"] == nil {
			t.Errorf("%s: %s needs minimum and maximum", typ, path)
		}
	}
	props, _ := node["properties"].(map[string]any)
	for name, p := range props {
		describedAndBounded(t, typ, path+"."+name, p.(map[string]any))
	}
}
