// Package domain holds mailplane's types, validation, decisions and folds.
// It is pure: no network, no broker, no database. Everything with I/O sits
// around it and calls it, so every rule lives here exactly once.
package domain

import (
	"errors"
	"fmt"
	"strings"
)

// Code is a stable, machine-readable error code. Codes are part of the API:
// clients branch on them, so they never change meaning.
type Code string

// Stable error codes.
const (
	CodeInvalid              Code = "invalid"
	CodeRequired             Code = "required"
	CodeTooLong              Code = "too_long"
	CodeOutOfRange           Code = "out_of_range"
	CodeInvalidType          Code = "invalid_type"
	CodeUnknownField         Code = "unknown_field"
	CodeUnknownType          Code = "unknown_type"
	CodeTierNotAllowed       Code = "tier_not_allowed"
	CodePlaintextSecret      Code = "plaintext_secret"
	CodeMalformedJSON        Code = "malformed_json"
	CodeMissingHeader        Code = "missing_header"
	CodeMalformedHeader      Code = "malformed_header"
	CodeKeyMismatch          Code = "key_mismatch"
	CodeSchema               Code = "schema"
	CodeNotFound             Code = "not_found"
	CodeConflict             Code = "conflict"
	CodeUnauthorized         Code = "unauthorized"
	CodeTooLarge             Code = "too_large"
	CodeUnsupportedMediaType Code = "unsupported_media_type"
	CodeUnavailable          Code = "unavailable"
	CodeInternal             Code = "internal"

	// CodeForbidden: the caller is authenticated but its scopes do not
	// allow the request (publishing an event type, acting as another
	// worker, reading another worker's assignments). The message names the
	// scope missing.
	CodeForbidden Code = "forbidden"
	// CodeSourceForbidden: an event's ce source is not the caller's
	// source (nor below it, as a URI path prefix).
	CodeSourceForbidden Code = "source_forbidden"
	// CodeNotOwner: the caller is allowed the event's type and source, but
	// the mailbox or org it changes, removes or registers into belongs to
	// another tenant (domain/ownership.go). 403; nothing is produced.
	CodeNotOwner Code = "not_owner"
	// CodeRateLimited: too many requests of a limited kind (new worker
	// ids); the response carries Retry-After.
	CodeRateLimited Code = "rate_limited"
	// CodeTimeInFuture: an event's time is further ahead of the receiver's
	// clock than MaxFutureSkew allows.
	CodeTimeInFuture Code = "time_in_future"
	// CodeForbiddenCharacter: a text field or attribute holds a control,
	// line-separator or bidi character (domain.TextPattern), or is not
	// valid UTF-8.
	CodeForbiddenCharacter Code = "forbidden_character"
	// CodeSealedCredentialsRefused: a producer sent sealed_credentials;
	// only mailplane seals (a copied sealed blob must not re-register a
	// mailbox at another endpoint).
	CodeSealedCredentialsRefused Code = "sealed_credentials_refused"
	// CodeCredentialsRequired: a mailbox.added without fresh plain-text
	// credentials for the endpoint it names.
	CodeCredentialsRequired Code = "credentials_required"
	// CodeProviderEndpoint: a gmail or outlook mailbox names an IMAP
	// endpoint other than its provider's (host, port 993, implicit TLS).
	CodeProviderEndpoint Code = "provider_endpoint"
	// CodeEndpointRefused: the IMAP host is an internal address (loopback,
	// private, link-local, ...) the operator has not allowlisted.
	CodeEndpointRefused Code = "endpoint_refused"
	// CodePlaintextRefused: tls none to a host that is neither loopback nor
	// allowlisted.
	CodePlaintextRefused Code = "plaintext_refused"
	// CodeDuplicateKeyID: two sealing keys share an id.
	CodeDuplicateKeyID Code = "duplicate_key_id"
	// CodeValueWithheld: a dead letter whose value the DLQ withheld (it
	// held or may hold a secret) cannot be redriven: re-publish the event.
	CodeValueWithheld Code = "value_withheld"
	// CodeNotRedrivable: a dead letter (or a consumer) that redrive refuses
	// to hand back; the message says why and what to do instead.
	CodeNotRedrivable Code = "not_redrivable"
	// CodeAlreadyRedriven: a dead letter redriven before, skipped unless
	// the operator asks again.
	CodeAlreadyRedriven Code = "already_redriven"
	// CodeOutOfOrder: a dead letter whose key has later records in its
	// source partition; redriven, it would be applied after them.
	CodeOutOfOrder Code = "out_of_order"
)

// Problem is one thing wrong with an input, at a field path such as
// "data.imap.port".
type Problem struct {
	Field   string `json:"field,omitempty"`
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

func (p Problem) String() string {
	if p.Field == "" {
		return fmt.Sprintf("%s: %s", p.Code, p.Message)
	}
	return fmt.Sprintf("%s: %s: %s", p.Field, p.Code, p.Message)
}

// Problems collects every problem found in one input, so a caller fixes them
// all in one round trip.
type Problems []Problem

// Add appends a problem.
func (ps *Problems) Add(field string, code Code, format string, args ...any) {
	*ps = append(*ps, Problem{Field: field, Code: code, Message: fmt.Sprintf(format, args...)})
}

// Prefixed returns the problems with prefix prepended to their field paths.
func (ps Problems) Prefixed(prefix string) Problems {
	out := make(Problems, len(ps))
	for i, p := range ps {
		if p.Field == "" {
			p.Field = prefix
		} else {
			p.Field = prefix + "." + p.Field
		}
		out[i] = p
	}
	return out
}

// Has reports whether any problem carries code.
func (ps Problems) Has(code Code) bool {
	for _, p := range ps {
		if p.Code == code {
			return true
		}
	}
	return false
}

// Err returns nil when there are no problems, else an *Error with code
// invalid (or the single most specific code when all problems share it).
func (ps Problems) Err() error {
	if len(ps) == 0 {
		return nil
	}
	return &Error{Code: ps.Code(), Message: ps.String(), Problems: ps}
}

// Code is the code of an input refused for ps: the one code every problem
// shares, else invalid (none, too). Err and the API's problem responses
// (api.WriteProblems) answer with it.
func (ps Problems) Code() Code {
	if len(ps) == 0 {
		return CodeInvalid
	}
	c := ps[0].Code
	for _, p := range ps[1:] {
		if p.Code != c {
			return CodeInvalid
		}
	}
	return c
}

func (ps Problems) String() string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = p.String()
	}
	return strings.Join(parts, "; ")
}

// Error is mailplane's error type: a stable code, a human message and, for
// validation failures, every problem found.
type Error struct {
	Code     Code
	Message  string
	Problems Problems
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Errorf returns an *Error with code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of err, CodeInternal for foreign errors and ""
// for nil.
func ErrorCode(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// ErrorProblems returns the problems carried by err, if any.
func ErrorProblems(err error) Problems {
	var e *Error
	if errors.As(err, &e) {
		return e.Problems
	}
	return nil
}
