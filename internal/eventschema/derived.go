package eventschema

import (
	"bytes"
	"io/fs"
	"slices"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/domain/schemas/derived"
)

// DerivedValidator validates the data of derived records (placement
// decisions, mailbox.state, sync.tier and sync.audit records) against the
// schemas in domain/schemas/derived. It is kept apart from Validator, whose
// types are the domain events only. It is safe for concurrent use.
type DerivedValidator struct {
	schemas map[string]*jsonschema.Schema
}

// NewDerived compiles the schema of every derived record type from
// package derived.
func NewDerived() (*DerivedValidator, error) {
	return NewDerivedFromFS(derived.Files(), derived.Types())
}

// NewDerivedFromFS compiles the schemas of types from fsys, where each is a
// file named "<type>.json", asserting formats (date-time) as NewFromFS does.
func NewDerivedFromFS(fsys fs.FS, types []string) (*DerivedValidator, error) {
	v, err := NewFromFS(fsys, types)
	if err != nil {
		return nil, err
	}
	return &DerivedValidator{schemas: v.schemas}, nil
}

var derivedValidator = sync.OnceValues(NewDerived)

// Derived returns the validator of the embedded derived-record schemas,
// compiled once. It panics if they do not compile, which the package's
// tests rule out.
func Derived() *DerivedValidator {
	v, err := derivedValidator()
	if err != nil {
		panic("eventschema: embedded derived schemas do not compile: " + err.Error())
	}
	return v
}

// Validate checks one record's JSON data (its Kafka value) against the
// schema of recordType: a full type (the record's ce_type, e.g.
// "mailplane.placement.assigned.v1") or a short one ("placement.assigned",
// "mailbox.state", "sync.failed"). Problems are as Validator.Validate
// reports them: code schema with a field path under "data", unknown_type,
// malformed_json, or required for empty data. A tombstone (a null record
// value on mailbox.state or sync.tier) has no data to validate.
func (v *DerivedValidator) Validate(recordType string, data []byte) domain.Problems {
	var ps domain.Problems
	s := v.schemas[v.resolve(recordType)]
	if s == nil {
		ps.Add("type", domain.CodeUnknownType, "unknown record type %q", recordType)
		return ps
	}
	return validateData(s, data)
}

// Types returns the record types the validator has schemas for, sorted.
func (v *DerivedValidator) Types() []string {
	ts := make([]string, 0, len(v.schemas))
	for t := range v.schemas {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// resolve returns the full type of a full or short record type, or "".
func (v *DerivedValidator) resolve(t string) string {
	if _, ok := v.schemas[t]; ok {
		return t
	}
	for _, full := range v.Types() {
		if domain.ShortType(full) == t {
			return full
		}
	}
	return ""
}

// validateData is the part of Validator.Validate after the type is known.
func validateData(s *jsonschema.Schema, data []byte) domain.Problems {
	var ps domain.Problems
	if len(bytes.TrimSpace(data)) == 0 {
		ps.Add("data", domain.CodeRequired, "is required")
		return ps
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		ps.Add("data", domain.CodeMalformedJSON, "malformed JSON: %v", err)
		return ps
	}
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
	collectDerived(&ps, ve)
	if len(ps) == 0 {
		ps.Add("data", domain.CodeSchema, "%s", ve.Error())
	}
	return ps
}

// collectDerived is collect, with a property missing under
// dependentRequired (from_band with from_worker, since with candidate)
// reported at its own path.
func collectDerived(ps *domain.Problems, ve *jsonschema.ValidationError) {
	if len(ve.Causes) > 0 {
		for _, c := range ve.Causes {
			collectDerived(ps, c)
		}
		return
	}
	if k, ok := ve.ErrorKind.(*kind.DependentRequired); ok {
		at := fieldPath(ve.InstanceLocation)
		for _, m := range k.Missing {
			ps.Add(join(at, m), domain.CodeSchema, "missing property %q (required with %q)", m, k.Prop)
		}
		return
	}
	collect(ps, ve)
}
