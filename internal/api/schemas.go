package api

import (
	"net/http"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/eventschema"
)

// The schemas over HTTP, for analysts and producers who validate with
// them (mounted on the API by the api role):
//
//	GET /v1/schemas         the record types that have one
//	GET /v1/schemas/{type}  its reader's form (ReaderSchema);
//	                        ?form=producer the strict form ingest applies

// SchemaListHandler serves GET /v1/schemas.
func SchemaListHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, map[string][]string{"types": eventschema.SchemaTypes()})
	})
}

// SchemaHandler serves GET /v1/schemas/{type}.
func SchemaHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		typ := r.PathValue("type")
		strict, ok := eventschema.SchemaOf(typ)
		if !ok {
			WriteError(w, http.StatusNotFound, domain.CodeNotFound, "no schema for that record type (GET /v1/schemas lists them)")
			return
		}
		body := strict
		switch r.URL.Query().Get("form") {
		case "", "reader":
			var err error
			if body, err = eventschema.ReaderSchema(strict); err != nil {
				WriteError(w, http.StatusInternalServerError, domain.CodeInternal, "internal error")
				return
			}
		case "producer":
		default:
			WriteError(w, http.StatusBadRequest, domain.CodeInvalid, "form must be reader or producer")
			return
		}
		w.Header().Set("Content-Type", "application/schema+json")
		_, _ = w.Write(body)
	})
}
