// Package eventschema validates event data against the JSON Schemas in
// domain/schemas, the contract analysts read the domain topics with, and
// checks that a schema change stays compatible with its released baseline.
// The domain package's Go validation is the authority at ingest; the schemas
// are kept in agreement with it by tests.
package eventschema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/mailplane/mailplane/domain"
)

// Validator validates event data against compiled schemas. It is safe for
// concurrent use.
type Validator struct {
	schemas map[string]*jsonschema.Schema
}

var printer = message.NewPrinter(language.English)

// New compiles the schema of every domain event type from
// domain.SchemaFiles.
func New() (*Validator, error) {
	return NewFromFS(domain.SchemaFiles(), domain.EventTypes())
}

// NewFromFS compiles the schemas of types from fsys, where each is a file
// named "<type>.json". Formats (date-time) are asserted, as the contract
// says.
func NewFromFS(fsys fs.FS, types []string) (*Validator, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	urls := make(map[string]string, len(types))
	for _, t := range types {
		b, err := fs.ReadFile(fsys, domain.SchemaFileName(t))
		if err != nil {
			return nil, fmt.Errorf("schema of %s: %w", t, err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("schema of %s: %w", t, err)
		}
		url := "file:///mailplane/schemas/" + domain.SchemaFileName(t)
		if err := c.AddResource(url, doc); err != nil {
			return nil, fmt.Errorf("schema of %s: %w", t, err)
		}
		urls[t] = url
	}
	v := &Validator{schemas: make(map[string]*jsonschema.Schema, len(types))}
	for _, t := range types {
		s, err := c.Compile(urls[t])
		if err != nil {
			return nil, fmt.Errorf("schema of %s: %w", t, err)
		}
		v.schemas[t] = s
	}
	return v, nil
}

var defaultValidator = sync.OnceValues(New)

// Default returns the validator of the embedded schemas, compiled once. It
// panics if they do not compile, which the package's tests rule out.
func Default() *Validator {
	v, err := defaultValidator()
	if err != nil {
		panic("eventschema: embedded schemas do not compile: " + err.Error())
	}
	return v
}

// Validate checks one event's JSON data against the schema of eventType (a
// full type, or a short one such as "mailbox.added"). Violations carry code
// schema, a field path under "data" (e.g. "data.imap.port") and the
// validator's message; an unknown type is unknown_type, data that is not
// JSON is malformed_json. No problems means the data conforms.
func (v *Validator) Validate(eventType string, data []byte) domain.Problems {
	var ps domain.Problems
	full, ok := domain.ResolveType(eventType)
	s := v.schemas[full]
	if !ok || s == nil {
		ps.Add("type", domain.CodeUnknownType, "unknown event type %q", eventType)
		return ps
	}
	if len(bytes.TrimSpace(data)) == 0 {
		ps.Add("data", domain.CodeRequired, "is required")
		return ps
	}
	// The plain form (no escapes, no repeated names: what encoding/json
	// writes from a Go value, all ingest validates) is read in one pass;
	// anything else by the parser and the checks below.
	doc, ok := plainDoc(data)
	if !ok {
		var err error
		if doc, err = jsonschema.UnmarshalJSON(bytes.NewReader(data)); err != nil {
			ps.Add("data", domain.CodeMalformedJSON, "malformed JSON: %v", err)
			return ps
		}
		// A repeated member name makes an object mean different things to
		// different readers (this parser keeps the last one); ingest
		// refuses it.
		if path, ok := repeatedName(data); ok {
			ps.Add(path, domain.CodeMalformedJSON, "field appears more than once")
			return ps
		}
	}
	err := s.Validate(doc)
	if err == nil {
		return nil
	}
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		ps.Add("data", domain.CodeSchema, "%v", err)
		return ps
	}
	collect(&ps, ve)
	if len(ps) == 0 { // a root error without leaves; never expected
		ps.Add("data", domain.CodeSchema, "%s", ve.Error())
	}
	return ps
}

// Types returns the event types the validator has schemas for, sorted.
func (v *Validator) Types() []string {
	ts := make([]string, 0, len(v.schemas))
	for t := range v.schemas {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// collect turns the leaves of a validation error tree into problems.
func collect(ps *domain.Problems, ve *jsonschema.ValidationError) {
	if len(ve.Causes) > 0 {
		for _, c := range ve.Causes {
			collect(ps, c)
		}
		return
	}
	at := fieldPath(ve.InstanceLocation)
	msg := ve.ErrorKind.LocalizedString(printer)
	switch k := ve.ErrorKind.(type) {
	case *kind.Required:
		for _, m := range k.Missing {
			ps.Add(join(at, m), domain.CodeSchema, "missing property %q", m)
		}
	case *kind.AdditionalProperties:
		for _, p := range k.Properties {
			ps.Add(join(at, p), domain.CodeSchema, "additional property %q not allowed", p)
		}
	case *kind.FalseSchema:
		ps.Add(at, domain.CodeSchema, "not allowed")
	default:
		ps.Add(at, domain.CodeSchema, "%s", msg)
	}
}

func fieldPath(loc []string) string {
	if len(loc) == 0 {
		return "data"
	}
	return "data." + strings.Join(loc, ".")
}

func join(path, name string) string { return path + "." + name }

// repeatedName returns the field path of the first member name repeated in
// one object of well-formed JSON data.
func repeatedName(data []byte) (string, bool) {
	// Names without escapes (all that encoding/json writes from a Go
	// value, which is what ingest validates) are compared as bytes in one
	// pass; anything else is decoded token by token.
	if path, found, ok := repeatedNamePlain(data); ok {
		return path, found
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	path, ok, _ := scanRepeated(dec, "data")
	return path, ok
}

func scanRepeated(dec *json.Decoder, path string) (string, bool, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", false, err
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return "", false, err
			}
			k, _ := kt.(string)
			if seen[k] {
				return path + "." + k, true, nil
			}
			seen[k] = true
			if p, ok, err := scanRepeated(dec, path+"."+k); ok || err != nil {
				return p, ok, err
			}
		}
		_, err = dec.Token()
		return "", false, err
	case json.Delim('['):
		for i := 0; dec.More(); i++ {
			if p, ok, err := scanRepeated(dec, fmt.Sprintf("%s.%d", path, i)); ok || err != nil {
				return p, ok, err
			}
		}
		_, err = dec.Token()
		return "", false, err
	}
	return "", false, nil
}

// repeatedNamePlain is repeatedName for data whose member names have no
// escapes and are valid UTF-8, where a name's bytes are the name; ok false
// for anything else (then the caller decodes). data has been parsed as
// JSON already; anything unexpected gives up rather than judge.
func repeatedNamePlain(data []byte) (path string, found, ok bool) {
	sc := dupScanner{b: data}
	_, p, found, ok := sc.value()
	if !ok || found {
		return "data" + p, found, ok
	}
	sc.ws()
	return "", false, sc.i == len(sc.b)
}

// plainDoc reads data as jsonschema.UnmarshalJSON does (objects as
// map[string]any, numbers as json.Number) when it is in the plain form:
// strings and names without escapes, in valid UTF-8, no repeated name.
// ok false for anything else, which the caller then parses and checks
// (TestPlainDocAgrees, FuzzPlainDoc).
func plainDoc(data []byte) (any, bool) {
	sc := dupScanner{b: data, strict: true}
	v, _, found, ok := sc.value()
	if !ok || found {
		return nil, false
	}
	sc.ws()
	return v, sc.i == len(sc.b)
}

// dupScanner reads JSON values, finding repeated names. strict: also
// give up on what it would otherwise pass over unchecked (escapes and
// invalid UTF-8 in strings, malformed numbers and literals), so that what
// it accepts is well-formed JSON.
type dupScanner struct {
	b      []byte
	i      int
	strict bool
}

func (s *dupScanner) ws() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

// str reads a string and reports whether it had an escape.
func (s *dupScanner) str() (raw []byte, escaped, ok bool) {
	s.i++ // the opening quote
	start := s.i
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return s.b[start : s.i-1], escaped, true
		case c == '\\':
			escaped = true
			s.i++
		case c < 0x20 && s.strict:
			return nil, false, false
		}
		s.i++
	}
	return nil, false, false
}

// value reads one value; path is the repeated name's path below it.
func (s *dupScanner) value() (v any, path string, found, ok bool) {
	s.ws()
	if s.i >= len(s.b) {
		return nil, "", false, false
	}
	switch s.b[s.i] {
	case '{':
		return s.object()
	case '[':
		return s.array()
	case '"':
		raw, escaped, ok := s.str()
		if s.strict && (!ok || escaped || !utf8.Valid(raw)) {
			return nil, "", false, false
		}
		return string(raw), "", false, ok
	}
	return s.literal()
}

// object reads an object, the scanner at its '{'.
func (s *dupScanner) object() (v any, path string, found, ok bool) {
	s.i++
	var small [16][]byte
	names := small[:0]
	var many map[string]bool // past 16 names, so no object costs n²
	var obj map[string]any
	if s.strict {
		obj = map[string]any{}
	}
	for first := true; ; first = false {
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == '}' && first {
			s.i++
			return obj, "", false, true
		}
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return nil, "", false, false
		}
		name, escaped, ok := s.str()
		if !ok || escaped || !utf8.Valid(name) {
			return nil, "", false, false
		}
		dup := false
		if many != nil {
			dup = many[string(name)]
			many[string(name)] = true
		} else {
			dup = slices.ContainsFunc(names, func(n []byte) bool { return bytes.Equal(n, name) })
			if names = append(names, name); len(names) > len(small) {
				many = make(map[string]bool, 2*len(names))
				for _, n := range names {
					many[string(n)] = true
				}
			}
		}
		if dup {
			return nil, "." + string(name), true, true
		}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return nil, "", false, false
		}
		s.i++
		mv, p, found, ok := s.value()
		if !ok || found {
			return nil, "." + string(name) + p, found, ok
		}
		if obj != nil {
			obj[string(name)] = mv
		}
		s.ws()
		if s.i >= len(s.b) {
			return nil, "", false, false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			return obj, "", false, true
		default:
			return nil, "", false, false
		}
	}
}

// array reads an array, the scanner at its '['.
func (s *dupScanner) array() (v any, path string, found, ok bool) {
	s.i++
	var arr []any
	if s.strict {
		arr = []any{}
	}
	for n := 0; ; n++ {
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == ']' && n == 0 {
			s.i++
			return arr, "", false, true
		}
		ev, p, found, ok := s.value()
		if !ok || found {
			return nil, "." + strconv.Itoa(n) + p, found, ok
		}
		if s.strict {
			arr = append(arr, ev)
		}
		s.ws()
		if s.i >= len(s.b) {
			return nil, "", false, false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case ']':
			s.i++
			return arr, "", false, true
		default:
			return nil, "", false, false
		}
	}
}

// literal reads a number, true, false or null.
func (s *dupScanner) literal() (v any, path string, found, ok bool) {
	// Up to the structure that follows.
	start := s.i
	for s.i < len(s.b) && !strings.ContainsRune(",]} \t\n\r", rune(s.b[s.i])) {
		s.i++
	}
	lit := s.b[start:s.i]
	if !s.strict {
		return nil, "", false, s.i > start
	}
	switch string(lit) {
	case "true":
		return true, "", false, true
	case "false":
		return false, "", false, true
	case "null":
		return nil, "", false, true
	}
	if !jsonNumber.Match(lit) {
		return nil, "", false, false
	}
	return json.Number(lit), "", false, true
}

var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)
