// Package srtest is an in-process stand-in for a Confluent-compatible
// Schema Registry, for tests of what mailplane sends one. It is NOT
// Redpanda: no Schema Registry can run where the tests run (no Redpanda
// binary, no Docker), so it implements, after the Confluent REST API that
// Redpanda also serves, only the subset mailplane calls, for JSON Schema
// only:
//
//	GET  /subjects                                     the subjects, sorted
//	POST /subjects/{subject}/versions                  register: {"id"}; the same schema again
//	                                                   is the same id and no new version; 409
//	                                                   (error_code 409) when incompatible with
//	                                                   the latest version under the subject's
//	                                                   level; 422 (42201) when not a schema
//	POST /subjects/{subject}                           look up: the version holding the schema;
//	                                                   404 40401 (no subject), 40403 (not in it)
//	GET  /config/{subject}, PUT /config/{subject}      the subject's level; 40408 when unset,
//	                                                   422 42203 for an unknown level
//	POST /compatibility/subjects/{subject}/versions/{version}  {"is_compatible"}, with
//	                                                   "messages" when ?verbose=true
//
// Compatibility is judged by eventschema.BreakingChanges (mailplane's own
// analysis), not by a registry's rules: it is stricter (a property
// dropped or a type widened counts as breaking, so under FORWARD it
// refuses a property added to an open object, which Confluent's rules
// and Redpanda's accept), and it may pass what Redpanda refuses. A test
// here proves the protocol and mailplane's handling of the answers, not
// Redpanda's verdicts. Schemas are compared in compact JSON, as registries compare a
// canonical form; ids are global and shared by equal schemas.
package srtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/mailplane/mailplane/internal/eventschema"
)

// Registry is the stand-in. Its zero value is not usable: use Start.
type Registry struct {
	URL string

	mu       sync.Mutex
	subjects map[string]*subject
	ids      map[string]int // compact schema → id
	nextID   int
	global   string
	failing  int // when non-zero, every request answers this status
	requests []string
}

type subject struct {
	level    string   // "" when unset
	versions []string // compact schemas; version n is versions[n-1]
}

// Start serves a registry on a loopback port until the test ends. Its
// global compatibility level is BACKWARD, a registry's default.
func Start(t testing.TB) *Registry {
	t.Helper()
	r := &Registry{subjects: map[string]*subject{}, ids: map[string]int{}, nextID: 1, global: "BACKWARD"}
	srv := httptest.NewServer(r.handler())
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

// Fail makes every request answer status (a 5xx: the registry is
// failing) until Fail(0).
func (r *Registry) Fail(status int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failing = status
}

// Requests returns "METHOD path" of every request so far, in order.
func (r *Registry) Requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.requests)
}

// Versions returns subject's schemas, oldest first (compact JSON).
func (r *Registry) Versions(subj string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.subjects[subj]; s != nil {
		return slices.Clone(s.versions)
	}
	return nil
}

// Register registers schema under subj as a client would, bypassing
// HTTP: for tests that need a subject to hold an older schema. It answers
// what POST /subjects/{subj}/versions would (status, body).
func (r *Registry) Register(subj, schema string) (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	status, body := r.register(subj, schemaRequest{Schema: schema, SchemaType: "JSON"})
	b, _ := json.Marshal(body)
	return status, string(b)
}

const contentType = "application/vnd.schemaregistry.v1+json"

type errBody struct {
	ErrorCode int    `json:"error_code"`
	Message   string `json:"message"`
}

type schemaRequest struct {
	Schema     string            `json:"schema"`
	SchemaType string            `json:"schemaType"`
	References []json.RawMessage `json:"references"`
}

func (r *Registry) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /subjects", func(w http.ResponseWriter, _ *http.Request) {
		r.answer(w, http.StatusOK, r.subjectNames())
	})
	mux.HandleFunc("POST /subjects/{subject}/versions", func(w http.ResponseWriter, req *http.Request) {
		in, ok := r.decode(w, req)
		if ok {
			status, body := r.register(req.PathValue("subject"), in)
			r.answer(w, status, body)
		}
	})
	mux.HandleFunc("POST /subjects/{subject}", func(w http.ResponseWriter, req *http.Request) {
		in, ok := r.decode(w, req)
		if ok {
			status, body := r.lookup(req.PathValue("subject"), in)
			r.answer(w, status, body)
		}
	})
	mux.HandleFunc("GET /config/{subject}", func(w http.ResponseWriter, req *http.Request) {
		s := r.subjects[req.PathValue("subject")]
		if s == nil || s.level == "" {
			r.answer(w, http.StatusNotFound, errBody{40408, fmt.Sprintf("Subject '%s' does not have subject-level compatibility configured", req.PathValue("subject"))})
			return
		}
		r.answer(w, http.StatusOK, map[string]string{"compatibilityLevel": s.level})
	})
	mux.HandleFunc("PUT /config/{subject}", func(w http.ResponseWriter, req *http.Request) {
		var in struct {
			Compatibility string `json:"compatibility"`
		}
		if err := json.NewDecoder(io.LimitReader(req.Body, 1<<20)).Decode(&in); err != nil {
			r.answer(w, http.StatusBadRequest, errBody{400, "Unrecognized request body"})
			return
		}
		if !slices.Contains(levels, in.Compatibility) {
			r.answer(w, http.StatusUnprocessableEntity, errBody{42203, "Invalid compatibility level. Valid values are none, backward, forward, full, backward_transitive, forward_transitive, and full_transitive"})
			return
		}
		r.subject(req.PathValue("subject")).level = in.Compatibility
		r.answer(w, http.StatusOK, map[string]string{"compatibility": in.Compatibility})
	})
	mux.HandleFunc("POST /compatibility/subjects/{subject}/versions/{version}", func(w http.ResponseWriter, req *http.Request) {
		in, ok := r.decode(w, req)
		if ok {
			status, body := r.check(req.PathValue("subject"), req.PathValue("version"), in, req.URL.Query().Get("verbose") == "true")
			r.answer(w, status, body)
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		r.answer(w, http.StatusNotFound, errBody{404, "HTTP 404 Not Found"})
	})
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.requests = append(r.requests, req.Method+" "+req.URL.Path)
		if r.failing != 0 {
			r.answer(w, r.failing, errBody{50001, "Error in the backend data store"})
			return
		}
		mux.ServeHTTP(w, req)
	})
}

var levels = []string{"NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE"}

func (r *Registry) answer(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func (r *Registry) decode(w http.ResponseWriter, req *http.Request) (schemaRequest, bool) {
	var in schemaRequest
	if err := json.NewDecoder(io.LimitReader(req.Body, 8<<20)).Decode(&in); err != nil {
		r.answer(w, http.StatusUnprocessableEntity, errBody{422, "Unrecognized field or malformed JSON"})
		return in, false
	}
	return in, true
}

func (r *Registry) subjectNames() []string {
	names := []string{}
	for n, s := range r.subjects {
		if len(s.versions) > 0 {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

func (r *Registry) subject(name string) *subject {
	s := r.subjects[name]
	if s == nil {
		s = &subject{}
		r.subjects[name] = s
	}
	return s
}

// compact validates in as a JSON Schema and returns its compact form.
func compact(in schemaRequest) (string, *errBody) {
	if in.SchemaType != "JSON" {
		return "", &errBody{42201, fmt.Sprintf("srtest: schemaType %q: this stand-in knows JSON only", in.SchemaType)}
	}
	if len(in.References) > 0 {
		return "", &errBody{42201, "srtest: references are not implemented"}
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(in.Schema)); err != nil {
		return "", &errBody{42201, "Invalid schema: " + err.Error()}
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(buf.Bytes()))
	if err != nil {
		return "", &errBody{42201, "Invalid schema: " + err.Error()}
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("srtest:schema.json", doc); err != nil {
		return "", &errBody{42201, "Invalid schema: " + err.Error()}
	}
	if _, err := c.Compile("srtest:schema.json"); err != nil {
		return "", &errBody{42201, "Invalid schema: " + err.Error()}
	}
	return buf.String(), nil
}

func (r *Registry) register(name string, in schemaRequest) (int, any) {
	schema, bad := compact(in)
	if bad != nil {
		return http.StatusUnprocessableEntity, *bad
	}
	s := r.subject(name)
	if slices.Contains(s.versions, schema) {
		return http.StatusOK, map[string]int{"id": r.ids[schema]}
	}
	if msgs := r.incompatible(s, schema, len(s.versions)); len(msgs) > 0 {
		return http.StatusConflict, errBody{409, fmt.Sprintf("Schema being registered is incompatible with an earlier schema for subject \"%s\", details: %s", name, strings.Join(msgs, "; "))}
	}
	id, ok := r.ids[schema]
	if !ok {
		id = r.nextID
		r.nextID++
		r.ids[schema] = id
	}
	s.versions = append(s.versions, schema)
	return http.StatusOK, map[string]int{"id": id}
}

func (r *Registry) lookup(name string, in schemaRequest) (int, any) {
	s := r.subjects[name]
	if s == nil || len(s.versions) == 0 {
		return http.StatusNotFound, errBody{40401, fmt.Sprintf("Subject '%s' not found.", name)}
	}
	schema, bad := compact(in)
	if bad != nil {
		return http.StatusUnprocessableEntity, *bad
	}
	i := slices.Index(s.versions, schema)
	if i < 0 {
		return http.StatusNotFound, errBody{40403, "Schema not found"}
	}
	return http.StatusOK, map[string]any{"subject": name, "version": i + 1, "id": r.ids[schema], "schemaType": "JSON", "schema": in.Schema}
}

func (r *Registry) check(name, version string, in schemaRequest, verbose bool) (int, any) {
	s := r.subjects[name]
	if s == nil || len(s.versions) == 0 {
		return http.StatusNotFound, errBody{40401, fmt.Sprintf("Subject '%s' not found.", name)}
	}
	upTo := len(s.versions)
	if version != "latest" && version != "-1" {
		n, err := strconv.Atoi(version)
		if err != nil || n < 1 || n > len(s.versions) {
			return http.StatusNotFound, errBody{40402, fmt.Sprintf("Version %s not found.", version)}
		}
		upTo = n
	}
	schema, bad := compact(in)
	if bad != nil {
		return http.StatusUnprocessableEntity, *bad
	}
	msgs := r.incompatibleWith(r.levelOf(s), s.versions[:upTo], schema, true)
	out := map[string]any{"is_compatible": len(msgs) == 0}
	if verbose {
		out["messages"] = msgs
	}
	return http.StatusOK, out
}

func (r *Registry) levelOf(s *subject) string {
	if s.level != "" {
		return s.level
	}
	return r.global
}

// incompatible checks schema against s's first n versions under its level.
func (r *Registry) incompatible(s *subject, schema string, n int) []string {
	return r.incompatibleWith(r.levelOf(s), s.versions[:n], schema, false)
}

// incompatibleWith judges schema against versions under level; a
// non-transitive level looks at the latest only (or, for a check against
// one version, that version: onlyLast).
func (r *Registry) incompatibleWith(level string, versions []string, schema string, onlyLast bool) []string {
	if len(versions) == 0 || level == "NONE" {
		return nil
	}
	against := versions[len(versions)-1:]
	if strings.HasSuffix(level, "_TRANSITIVE") && !onlyLast {
		against = versions
	}
	base := strings.TrimSuffix(level, "_TRANSITIVE")
	var msgs []string
	for _, old := range against {
		if base == "BACKWARD" || base == "FULL" {
			msgs = append(msgs, breaking(old, schema)...)
		}
		if base == "FORWARD" || base == "FULL" {
			msgs = append(msgs, breaking(schema, old)...)
		}
	}
	return msgs
}

// breaking lists what a reader of newer misses of data older accepts.
func breaking(older, newer string) []string {
	cs, err := eventschema.BreakingChanges([]byte(older), []byte(newer))
	if err != nil {
		return []string{err.Error()}
	}
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.String()
	}
	return out
}
