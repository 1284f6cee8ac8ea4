package domain

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// PolicyChange is one field whose value differs between two policies.
type PolicyChange struct {
	// Field is the document path, e.g. "health.levels[2].min_rate".
	Field string `json:"field"`
	// From and To are the values as the document writes them ("" where
	// the field is absent, as a level only one side has).
	From string `json:"from"`
	To   string `json:"to"`
}

// DiffPolicies compares a and b field by field, in document order.
func DiffPolicies(a, b Policy) []PolicyChange {
	fa, fb := flattenPolicy(a), flattenPolicy(b)
	seen := make(map[string]bool, len(fa.keys))
	var out []PolicyChange
	for _, k := range append(fa.keys, fb.keys...) {
		if seen[k] {
			continue
		}
		seen[k] = true
		if fa.vals[k] != fb.vals[k] {
			out = append(out, PolicyChange{Field: k, From: fa.vals[k], To: fb.vals[k]})
		}
	}
	return out
}

// PolicyField is one field of a policy document and its value as the
// document writes it.
type PolicyField struct {
	Field string `json:"field"`
	Value string `json:"value"`
}

// PolicyFields lists p's fields in document order, levels by index
// ("health.levels[0].min_rate").
func PolicyFields(p Policy) []PolicyField {
	f := flattenPolicy(p)
	out := make([]PolicyField, len(f.keys))
	for i, k := range f.keys {
		out[i] = PolicyField{Field: k, Value: f.vals[k]}
	}
	return out
}

type flatPolicy struct {
	keys []string
	vals map[string]string
}

// flattenPolicy lists the document's leaves by path, in document order.
func flattenPolicy(p Policy) flatPolicy {
	f := flatPolicy{vals: map[string]string{}}
	b, err := json.Marshal(p.doc())
	if err != nil {
		return f // a doc of strings and finite numbers always marshals
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := readJSON(dec)
	if err != nil {
		return f
	}
	f.walk("", v)
	return f
}

func (f *flatPolicy) walk(path string, v any) {
	switch x := v.(type) {
	case jsonObject:
		for _, m := range x {
			p := m.Key
			if path != "" {
				p = path + "." + m.Key
			}
			f.walk(p, m.Value)
		}
	case []any:
		for i, e := range x {
			f.walk(path+"["+strconv.Itoa(i)+"]", e)
		}
	default:
		s := ""
		switch y := x.(type) {
		case string:
			s = y
		case json.Number:
			s = y.String()
		}
		f.keys = append(f.keys, path)
		f.vals[path] = s
	}
}
