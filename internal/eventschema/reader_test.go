package eventschema_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
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

// TestSchemasServed: GET /v1/schemas lists the types; GET
// /v1/schemas/{type} serves the reader's form, ?form=producer the strict
// one; an unknown type is 404 not_found.
func TestSchemasServed(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.Handle("GET /v1/schemas", eventschema.ListHandler())
	mux.Handle("GET /v1/schemas/{type}", eventschema.SchemaHandler())
	srv := httptest.NewServer(mux)
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/v1/schemas")
	var list struct{ Types []string }
	if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil || len(list.Types) != len(eventschema.SchemaTypes()) {
		t.Fatalf("list: %d %s", code, body)
	}
	code, body = get("/v1/schemas/" + domain.TypeMailboxAdded)
	if code != 200 || !strings.Contains(body, `urn:mailplane:schema:mailplane.mailbox.added.v1:reader`) || strings.Contains(body, `"additionalProperties": false`) {
		t.Errorf("reader form: %d %.300s", code, body)
	}
	strict, _ := eventschema.SchemaOf(domain.TypeMailboxAdded)
	if code, body = get("/v1/schemas/" + domain.TypeMailboxAdded + "?form=producer"); code != 200 || body != string(strict) {
		t.Errorf("producer form: %d %.300s", code, body)
	}
	if code, body = get("/v1/schemas/mailplane.placement.assigned.v1"); code != 200 || !strings.Contains(body, ":reader") {
		t.Errorf("derived record: %d %.300s", code, body)
	}
	if code, body = get("/v1/schemas/mailplane.nothing.v1"); code != 404 || !strings.Contains(body, `"not_found"`) {
		t.Errorf("unknown type: %d %s", code, body)
	}
	if code, _ = get("/v1/schemas/" + domain.TypeMailboxAdded + "?form=xml"); code != 400 {
		t.Errorf("bad form: %d", code)
	}
}
