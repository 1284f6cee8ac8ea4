package api

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/mailplane/mailplane/producer"
)

// TestOpenAPIDocumentIsValid: the embedded document loads (every $ref
// resolves) and validates as OpenAPI (path parameters declared, schemas
// well formed), and every server serves it without a token. That it
// matches the routes is internal/roles' TestOpenAPIMatchesTheServer.
func TestOpenAPIDocumentIsValid(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Errorf("openapi %q", doc.OpenAPI)
	}

	e := newEnv(t, envOpts{noBroker: true, prod: producer.New(nil)})
	rec := httptest.NewRecorder()
	e.srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/openapi.json", nil))
	body, _ := io.ReadAll(rec.Body)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" || !bytes.Equal(body, OpenAPI()) {
		t.Errorf("GET /v1/openapi.json: %d %q, %d bytes", rec.Code, rec.Header().Get("Content-Type"), len(body))
	}
}
