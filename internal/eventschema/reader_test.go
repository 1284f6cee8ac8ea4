package eventschema_test

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/domain/schemas/derived"
	"github.com/mailplane/mailplane/internal/eventschema"
)

// TestReaderSchemasAcceptNewFields: a reader validating with the reader's
// form of a schema accepts a record that carries a field the schema does
// not know (added in a later, compatible version), where the producer's
// strict form refuses it; both still refuse a known field of the wrong
// type. Every schema's reader form compiles.
func TestReaderSchemasAcceptNewFields(t *testing.T) {
	t.Parallel()
	types := eventschema.SchemaTypes()
	readers := fstest.MapFS{}
	for _, typ := range types {
		strict, ok := eventschema.SchemaOf(typ)
		if !ok {
			t.Fatalf("no schema for %s", typ)
		}
		r, err := eventschema.ReaderSchema(strict)
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if strings.Contains(string(r), `"additionalProperties": false`) {
			t.Errorf("%s: the reader's form still refuses unknown members", typ)
		}
		readers[domain.SchemaFileName(typ)] = &fstest.MapFile{Data: r}
	}
	if len(types) < len(domain.EventTypes())+len(derived.Types()) {
		t.Errorf("%d types with schemas, want every event type and derived record", len(types))
	}
	reader, err := eventschema.NewFromFS(readers, types)
	if err != nil {
		t.Fatalf("the reader schemas do not compile: %v", err)
	}
	strict := eventschema.Default()
	const user = `"user_id":"0190a5b2-4c5e-7b1a-9c3d-00000000b001","source":"login"`
	newer := []byte(`{` + user + `,"device":"phone"}`)
	if ps := strict.Validate(domain.TypeUserActive, newer); len(ps) == 0 {
		t.Error("the producer's schema accepted an unknown field")
	}
	if ps := reader.Validate(domain.TypeUserActive, newer); len(ps) > 0 {
		t.Errorf("the reader's schema refused a newer field: %v", ps)
	}
	wrong := []byte(`{"user_id":5,"source":"login","device":"phone"}`)
	if ps := reader.Validate(domain.TypeUserActive, wrong); len(ps) == 0 {
		t.Error("the reader's schema accepted a known field of the wrong type")
	}
}
