package api

import (
	_ "embed"
	"net/http"
)

// openAPI is the OpenAPI 3.1 document of every route the api role serves
// (GET /v1/openapi.json). Kept by hand next to the handlers; the roles'
// TestOpenAPIMatchesTheServer fails when a mounted route is missing from it
// or it names a route nobody mounts.
//
//go:embed openapi.json
var openAPI []byte

// RouteOpenAPI serves the document; every Server mounts it, without auth,
// so clients can be generated before holding a token.
const RouteOpenAPI = "GET /v1/openapi.json"

// OpenAPI returns the OpenAPI 3.1 document (a copy).
func OpenAPI() []byte { return append([]byte(nil), openAPI...) }

func openAPIHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write(openAPI)
	})
}
