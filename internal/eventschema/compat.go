package eventschema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strings"

	"github.com/mailplane/mailplane/domain"
)

// Change is one breaking difference between a released schema and its
// successor: data the released schema accepts that the successor may refuse
// or read differently.
type Change struct {
	// Path is where in the data the change is: "data" for the data object,
	// "data.imap.port" for a nested property, "data.tags[]" for array items.
	Path    string
	Message string
}

func (c Change) String() string { return c.Path + ": " + c.Message }

// BreakingChanges compares a released schema (baseline) with its current
// version, walking nested object properties, and returns every breaking
// change, sorted: a property removed, its type changed, an enum value
// removed, a constraint added or tightened (maxLength, maximum lowered;
// minLength, minimum raised; pattern or format changed), a property newly
// required, an open object closed. Adding optional properties, adding enum
// values and loosening constraints are compatible. Keywords it does not
// analyse (anyOf, $ref, ...) count as breaking whenever they change, so an
// unexpected edit fails safe. Descriptions, titles and other annotations
// may change freely.
func BreakingChanges(baseline, current []byte) ([]Change, error) {
	oldDoc, err := decodeSchema(baseline)
	if err != nil {
		return nil, fmt.Errorf("baseline: %w", err)
	}
	newDoc, err := decodeSchema(current)
	if err != nil {
		return nil, fmt.Errorf("current: %w", err)
	}
	var cs []Change
	compareSchema(&cs, "data", oldDoc, newDoc)
	slices.SortStableFunc(cs, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	return cs, nil
}

// textHygieneOnly reports whether a pattern change only refuses the
// characters domain.TextPattern refuses: the new pattern is TextPattern
// where there was none, or the old pattern with domain.TextPatternClass
// folded into negated classes ([^...]). That one tightening is compatible
// by decree (domain/schemas/README.md, "Text"): such characters could
// never be projected (Postgres text refuses NUL) or shown safely, so no
// released consumer could rely on them, and every text field refuses them
// since the same release.
func textHygieneOnly(oldP, newP any) bool {
	np, ok := newP.(string)
	if !ok {
		return false
	}
	if oldP == nil {
		return np == domain.TextPattern
	}
	op, ok := oldP.(string)
	if !ok || !strings.Contains(np, domain.TextPatternClass) || strings.ReplaceAll(np, domain.TextPatternClass, "") != op {
		return false
	}
	for rest := np; ; {
		i := strings.Index(rest, domain.TextPatternClass)
		if i < 0 {
			return true
		}
		// The class must sit in a negated class: "[^" opened before it and
		// not closed since.
		open := strings.LastIndex(rest[:i], "[^")
		if open < 0 || strings.Contains(rest[open:i], "]") {
			return false
		}
		rest = rest[i+len(domain.TextPatternClass):]
	}
}

func decodeSchema(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	switch v.(type) {
	case map[string]any, bool:
		return v, nil
	}
	return nil, fmt.Errorf("a schema is an object or a boolean")
}

// annotations never change what is valid.
var annotations = map[string]bool{
	"title": true, "description": true, "$comment": true, "examples": true,
	"default": true, "deprecated": true, "readOnly": true, "writeOnly": true,
}

// Bounds: a lower bound breaks when it is added or raised, an upper one when
// it is added or lowered.
var (
	lowerBounds = []string{"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", "minContains"}
	upperBounds = []string{"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", "maxContains"}
)

func compareSchema(cs *[]Change, path string, oldS, newS any) {
	d := &schemaDiff{cs: cs, path: path, handled: map[string]bool{}}
	// Boolean schemas: true accepts every value (as {} does), false none.
	if oldS == false {
		return // nothing was valid, so nothing valid can break
	}
	d.oldM, d.newM = asObject(oldS), asObject(newS)
	if newS == false {
		d.add("no value allowed any more")
		return
	}
	if d.oldM == nil || d.newM == nil {
		d.add("schema is not an object or a boolean")
		return
	}
	for k := range annotations {
		d.handled[k] = true
	}
	d.values()
	d.required()
	d.properties()
	d.items()
	d.rest()
}

// schemaDiff compares one schema object with its new version; handled
// names the keywords it has analysed.
type schemaDiff struct {
	cs         *[]Change
	path       string
	oldM, newM map[string]any
	handled    map[string]bool
}

func (d *schemaDiff) add(format string, args ...any) {
	d.change(Change{Path: d.path, Message: fmt.Sprintf(format, args...)})
}

func (d *schemaDiff) change(c Change) { *d.cs = append(*d.cs, c) }

// values compares what constrains a value itself: type, enum, const,
// bounds, pattern, format, uniqueItems.
func (d *schemaDiff) values() {
	// type
	d.handled["type"] = true
	if ot, nt := typeSet(d.oldM["type"]), typeSet(d.newM["type"]); !slices.Equal(ot, nt) {
		d.add("type changed from %s to %s", typeName(ot), typeName(nt))
	}

	// enum and const
	d.handled["enum"], d.handled["const"] = true, true
	if oe, ok := d.oldM["enum"].([]any); ok {
		ne, ok := d.newM["enum"].([]any)
		if ok {
			for _, v := range oe {
				if !slices.ContainsFunc(ne, func(w any) bool { return sameJSON(v, w) }) {
					d.add("enum value %s removed", canon(v))
				}
			}
		} else if _, has := d.newM["enum"]; has {
			d.add("enum changed to %s", canon(d.newM["enum"]))
		}
	} else if _, has := d.newM["enum"]; has {
		d.add("enum %s added", canon(d.newM["enum"]))
	}
	if !sameJSON(d.oldM["const"], d.newM["const"]) {
		if _, has := d.newM["const"]; has {
			d.add("const changed from %s to %s", canon(d.oldM["const"]), canon(d.newM["const"]))
		}
	}

	// numeric and length bounds
	for _, k := range lowerBounds {
		d.handled[k] = true
		compareBound(d.add, k, d.oldM[k], d.newM[k], +1)
	}
	for _, k := range upperBounds {
		d.handled[k] = true
		compareBound(d.add, k, d.oldM[k], d.newM[k], -1)
	}
	d.handled["multipleOf"] = true
	if nv, has := d.newM["multipleOf"]; has && !sameJSON(d.oldM["multipleOf"], nv) {
		d.add("multipleOf changed from %s to %s", canon(d.oldM["multipleOf"]), canon(nv))
	}

	// pattern and format: any new or different one may refuse old data,
	// except refusing control characters (textHygieneOnly).
	for _, k := range []string{"pattern", "format"} {
		d.handled[k] = true
		if k == "pattern" && textHygieneOnly(d.oldM[k], d.newM[k]) {
			continue
		}
		if nv, has := d.newM[k]; has && !sameJSON(d.oldM[k], nv) {
			if _, had := d.oldM[k]; had {
				d.add("%s changed from %s to %s", k, canon(d.oldM[k]), canon(nv))
			} else {
				d.add("%s %s added", k, canon(nv))
			}
		}
	}
	d.handled["uniqueItems"] = true
	if d.newM["uniqueItems"] == true && d.oldM["uniqueItems"] != true {
		d.add("uniqueItems added")
	}

}

// required reports properties that became required.
func (d *schemaDiff) required() {
	// required
	d.handled["required"] = true
	oldReq, newReq := stringSet(d.oldM["required"]), stringSet(d.newM["required"])
	for _, r := range newReq {
		if !slices.Contains(oldReq, r) {
			d.change(Change{Path: d.path + "." + r, Message: "became required"})
		}
	}

}

// properties walks the properties, and what the old schema let any other
// name hold.
func (d *schemaDiff) properties() {
	// properties, walked
	d.handled["properties"] = true
	oldProps, _ := d.oldM["properties"].(map[string]any)
	newProps, _ := d.newM["properties"].(map[string]any)
	oldOpen := d.oldM["additionalProperties"] != false
	for _, name := range sortedKeys(oldProps) {
		np, ok := newProps[name]
		if !ok {
			d.change(Change{Path: d.path + "." + name, Message: "property removed"})
			continue
		}
		compareSchema(d.cs, d.path+"."+name, oldProps[name], np)
	}
	for _, name := range sortedKeys(newProps) {
		if _, ok := oldProps[name]; !ok && oldOpen {
			// The old schema let this name hold anything.
			compareSchema(d.cs, d.path+"."+name, oldAdditional(d.oldM), newProps[name])
		}
	}
	d.handled["additionalProperties"] = true
	_, oldHas := d.oldM["additionalProperties"]
	_, newHas := d.newM["additionalProperties"]
	switch {
	case oldOpen && d.newM["additionalProperties"] == false:
		d.add("additional properties no longer allowed")
	case oldHas || newHas:
		compareSchema(d.cs, d.path+".*", oldAdditional(d.oldM), oldAdditional(d.newM))
	}

}

// items walks array items.
func (d *schemaDiff) items() {
	// array items, walked
	d.handled["items"] = true
	if oi, ni := d.oldM["items"], d.newM["items"]; oi != nil || ni != nil {
		if oi == nil {
			oi = true
		}
		if ni == nil {
			ni = true
		}
		compareSchema(d.cs, d.path+"[]", oi, ni)
	}

}

// rest reports every other keyword that changed: not analysed, so
// breaking.
func (d *schemaDiff) rest() {
	// everything else: unchanged, or breaking
	keys := sortedKeys(d.oldM)
	for _, k := range sortedKeys(d.newM) {
		if _, ok := d.oldM[k]; !ok {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		if d.handled[k] || strings.HasPrefix(k, "x-") {
			continue
		}
		if !sameJSON(d.oldM[k], d.newM[k]) {
			d.add("keyword %s changed from %s to %s (not analysed, so treated as breaking)", k, canon(d.oldM[k]), canon(d.newM[k]))
		}
	}
}

// oldAdditional is the schema for properties not listed in m.
func oldAdditional(m map[string]any) any {
	if v, ok := m["additionalProperties"]; ok {
		return v
	}
	return true
}

// asObject returns a schema as an object, true as {}; nil otherwise.
func asObject(s any) map[string]any {
	switch v := s.(type) {
	case map[string]any:
		return v
	case bool:
		if v {
			return map[string]any{}
		}
	}
	return nil
}

func compareBound(add func(string, ...any), k string, oldV, newV any, dir int) {
	if newV == nil {
		return // removed or never there: looser
	}
	nr, ok := number(newV)
	if !ok {
		add("%s is not a number: %s", k, canon(newV))
		return
	}
	if oldV == nil {
		add("%s %s added", k, canon(newV))
		return
	}
	or, ok := number(oldV)
	if !ok {
		add("%s changed from %s to %s", k, canon(oldV), canon(newV))
		return
	}
	switch c := nr.Cmp(or); {
	case dir > 0 && c > 0:
		add("%s raised from %s to %s", k, canon(oldV), canon(newV))
	case dir < 0 && c < 0:
		add("%s lowered from %s to %s", k, canon(oldV), canon(newV))
	}
}

func number(v any) (*big.Rat, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return nil, false
	}
	r, ok := new(big.Rat).SetString(string(n))
	return r, ok
}

// typeSet returns the types a "type" keyword allows, sorted; nil is any.
func typeSet(v any) []string {
	switch t := v.(type) {
	case string:
		return []string{t}
	case []any:
		s := stringSet(t)
		slices.Sort(s)
		return slices.Compact(s)
	}
	return nil
}

func typeName(ts []string) string {
	if ts == nil {
		return "any"
	}
	return strings.Join(ts, "|")
}

func stringSet(v any) []string {
	arr, _ := v.([]any)
	var out []string
	for _, x := range arr {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// canon renders a JSON value canonically (sorted keys; numbers as written).
func canon(v any) string {
	if v == nil {
		return "(none)"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func sameJSON(a, b any) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if an, ok := number(a); ok {
		if bn, ok := number(b); ok {
			return an.Cmp(bn) == 0
		}
	}
	return canon(a) == canon(b)
}
