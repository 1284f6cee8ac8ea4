package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/eventschema"
)

// TestSchemasServed: GET /v1/schemas lists the types; GET
// /v1/schemas/{type} serves the reader's form, ?form=producer the strict
// one; an unknown type is 404 not_found.
func TestSchemasServed(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.Handle("GET /v1/schemas", SchemaListHandler())
	mux.Handle("GET /v1/schemas/{type}", SchemaHandler())
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
