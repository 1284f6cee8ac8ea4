package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/mailplane/mailplane/domain"
)

// CodeMethodNotAllowed is the stable code of a 405 response. The domain
// package has no code for it because it is purely an HTTP concern.
const CodeMethodNotAllowed domain.Code = "method_not_allowed"

// ErrorInfo is the "error" member of every error response.
type ErrorInfo struct {
	Code    domain.Code `json:"code"`
	Message string      `json:"message"`
}

// Problem is one thing wrong with one event of a request. Index is the
// event's position in the request (0 for structured and binary mode), ID
// its id when one could be read, Field a path such as "data.imap.port" or,
// in binary mode, a header name such as "ce-type" ("" means the whole
// event).
type Problem struct {
	Index   int         `json:"index"`
	ID      string      `json:"id,omitempty"`
	Field   string      `json:"field"`
	Code    domain.Code `json:"code"`
	Message string      `json:"message"`
}

// ErrorResponse is the body of every non-2xx response. Problems is set on
// validation failures (400), Events and Failed on produce failures (503):
// Events lists what landed, Failed what did not (or is not known to have).
type ErrorResponse struct {
	Error    ErrorInfo `json:"error"`
	Problems []Problem `json:"problems,omitempty"`
	Events   []Receipt `json:"events,omitempty"`
	Failed   []Failed  `json:"failed,omitempty"`
}

// Receipt says where one accepted event landed.
type Receipt struct {
	Index     int    `json:"index"`
	ID        string `json:"id"`
	Type      string `json:"type"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

// Failed names an event that was valid but is not known to have landed.
type Failed struct {
	Index int    `json:"index"`
	ID    string `json:"id"`
	Type  string `json:"type"`
}

// AcceptedResponse is the body of a 202 from POST /v1/events: one receipt
// per event, in request order.
type AcceptedResponse struct {
	Events []Receipt `json:"events"`
}

// WriteJSON writes v as the JSON body of a response with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"response could not be encoded"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// WriteError writes {"error":{"code":code,"message":message}} with status.
// message must never carry request content that may be secret.
func WriteError(w http.ResponseWriter, status int, code domain.Code, message string) {
	WriteJSON(w, status, ErrorResponse{Error: ErrorInfo{Code: code, Message: message}})
}

// StatusOf maps a stable code to its HTTP status.
func StatusOf(code domain.Code) int {
	switch code {
	case domain.CodeUnauthorized:
		return http.StatusUnauthorized
	case domain.CodeForbidden, domain.CodeSourceForbidden, domain.CodeNotOwner:
		return http.StatusForbidden
	case domain.CodeRateLimited:
		return http.StatusTooManyRequests
	case domain.CodeNotFound:
		return http.StatusNotFound
	case domain.CodeConflict:
		return http.StatusConflict
	case domain.CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case domain.CodeUnsupportedMediaType:
		return http.StatusUnsupportedMediaType
	case CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case domain.CodeUnavailable:
		return http.StatusServiceUnavailable
	case domain.CodeInternal, "":
		return http.StatusInternalServerError
	}
	return http.StatusBadRequest
}

// WriteDomainError writes err with the status of its code. Foreign errors
// (code internal) get a generic message, so internal details never reach
// a client; domain errors keep their message and problems (at index 0).
func WriteDomainError(w http.ResponseWriter, err error) {
	code := domain.ErrorCode(err)
	var de *domain.Error
	if !errors.As(err, &de) || code == domain.CodeInternal {
		WriteError(w, http.StatusInternalServerError, domain.CodeInternal, "internal error")
		return
	}
	WriteJSON(w, StatusOf(code), ErrorResponse{Error: ErrorInfo{Code: code, Message: de.Message}, Problems: atIndex0(de.Problems)})
}

// WriteProblems writes the response refusing a request for ps (all of
// one input, so at index 0): status, the problems' code
// (domain.Problems.Code), msg and every problem. msg must never carry
// request content that may be secret.
func WriteProblems(w http.ResponseWriter, status int, msg string, ps domain.Problems) {
	WriteJSON(w, status, ErrorResponse{Error: ErrorInfo{Code: ps.Code(), Message: msg}, Problems: atIndex0(ps)})
}

// atIndex0 renders ps as the problems of a request's only input (nil for
// none, so the member is left out).
func atIndex0(ps domain.Problems) []Problem {
	var out []Problem
	for _, p := range ps {
		out = append(out, Problem{Field: p.Field, Code: p.Code, Message: p.Message})
	}
	return out
}

// ReadBody reads a request body of at most limit bytes (http.MaxBytesReader).
// Errors are *domain.Error: too_large past the limit, malformed_json for an
// interrupted body. Routes added with WithRoute use it for the same limits
// and codes as /v1/events.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, domain.Errorf(domain.CodeTooLarge, "request body is larger than %d bytes", limit)
	}
	body, err := readAll(http.MaxBytesReader(w, r.Body, limit), r.ContentLength)
	if err != nil {
		clear(body) // it may hold plain credentials
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, domain.Errorf(domain.CodeTooLarge, "request body is larger than %d bytes", limit)
		}
		return nil, domain.Errorf(domain.CodeMalformedJSON, "request body could not be read")
	}
	return body, nil
}

// readAll is io.ReadAll into a buffer sized for the declared length (size,
// -1 when unknown): a batch is read without growing its buffer a dozen
// times, which copied and cleared it each time (7% of ingest's CPU) and
// left the copies, plain credentials and all, to the garbage collector
// unwiped. Grown buffers are wiped before they are dropped.
func readAll(r io.Reader, size int64) ([]byte, error) {
	size = max(size, 0)                    // ReadBody refused a declared length past its limit
	b := make([]byte, 0, max(size+1, 512)) // +1: room to see EOF without growing
	for {
		if len(b) == cap(b) {
			old := b
			b = append(b, 0)[:len(b)]
			clear(old)
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// DecodeJSON reads a JSON object body of at most limit bytes into v,
// strictly: unknown fields and trailing data are refused. It checks the
// content type (application/json) too. Errors are *domain.Error suitable
// for WriteDomainError.
func DecodeJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	if mt, ok := mediaType(r.Header.Get("Content-Type")); !ok || mt != "application/json" {
		return domain.Errorf(domain.CodeUnsupportedMediaType, "Content-Type must be application/json")
	}
	body, err := ReadBody(w, r, limit)
	if err != nil {
		return err
	}
	defer clear(body)
	if len(bytes.TrimSpace(body)) == 0 {
		return domain.Errorf(domain.CodeMalformedJSON, "request body is empty")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var ute *json.UnmarshalTypeError
		switch {
		case errors.As(err, &ute):
			return &domain.Error{Code: domain.CodeInvalid, Message: "invalid request", Problems: domain.Problems{{
				Field: ute.Field, Code: domain.CodeInvalidType, Message: "must be " + ute.Type.String(),
			}}}
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return &domain.Error{Code: domain.CodeInvalid, Message: "invalid request", Problems: domain.Problems{{
				Field: name, Code: domain.CodeUnknownField, Message: "unknown field",
			}}}
		}
		return domain.Errorf(domain.CodeMalformedJSON, "request body is not valid JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		return domain.Errorf(domain.CodeMalformedJSON, "trailing data after the JSON object")
	}
	return nil
}

// mediaType returns the lower-case media type of a Content-Type value and
// whether it is well-formed with no charset other than UTF-8.
func mediaType(ct string) (string, bool) {
	if ct == "" {
		return "", false
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return "", false
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return mt, false
	}
	return mt, true
}

// summary renders a count with a noun, for messages.
func summary(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
