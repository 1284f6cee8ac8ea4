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
	"slices"
	"strings"
	"sync"

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
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		ps.Add("data", domain.CodeMalformedJSON, "malformed JSON: %v", err)
		return ps
	}
	// A repeated member name makes an object mean different things to
	// different readers (this parser keeps the last one); ingest refuses it.
	if path, ok := repeatedName(data); ok {
		ps.Add(path, domain.CodeMalformedJSON, "field appears more than once")
		return ps
	}
	err = s.Validate(doc)
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
