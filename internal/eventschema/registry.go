package eventschema

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/mailplane/mailplane/domain"
)

// Schemas in a Confluent-compatible Schema Registry (Redpanda's): every
// record type's reader schema (ReaderSchema) is registered as JSON Schema
// under a subject of its own, named by the type (RecordNameStrategy: a
// topic carries several types, so <topic>-value cannot name one schema).
// An analyst reading a record takes its ce_type, or the last segment of
// its ce_dataschema, and asks the registry for that subject's latest
// version. The type carries its major version (".v1"); a breaking change
// is a new type, so a new subject, and each subject only evolves
// compatibly: its compatibility level is RegistryCompatibility.
// docs: domain/schemas/README.md.

// RegistryCompatibility is the compatibility level set on every subject.
// The registered schemas are readers' forms, open objects, so what they
// promise is that a reader holding an older version accepts newer
// records (fields added since included): FORWARD, each new version's data
// readable with the previous one. BACKWARD would refuse the change
// mailplane makes most, an optional field added, since a typed property
// added to an open object narrows what it accepts (Confluent's rule,
// which Redpanda follows). A change FORWARD refuses (an enum value added,
// a bound loosened) is one a reader validating with the older schema
// would refuse records over too: the 409 is the news analysts need.
const RegistryCompatibility = sr.CompatForward

// Subject is the Schema Registry subject of recordType's schema.
func Subject(recordType string) string { return recordType }

// Registration outcomes (Registration.Status).
const (
	StatusRegistered    = "registered"     // a new version was registered
	StatusUnchanged     = "unchanged"      // the subject already holds this schema
	StatusWouldRegister = "would_register" // dry run: a new version would be registered
	StatusFailed        = "failed"         // see Code and Message
)

// Registration is what registering one record type's schema did.
type Registration struct {
	Type    string `json:"type"`
	Subject string `json:"subject"`
	Status  string `json:"status"`
	// ID and Version are the registry's schema id and the subject's
	// version holding the schema (0 when none: a dry run's new schema, a
	// failure).
	ID      int `json:"id,omitempty"`
	Version int `json:"version,omitempty"`
	// Code is a stable code when Status is StatusFailed: conflict (the
	// schema is incompatible with the subject's latest version), schema
	// (the registry refused it as invalid), unauthorized, unavailable
	// (the registry did not answer or failed), too_large (an answer past
	// the reader's bound), invalid (any other refusal).
	Code    domain.Code `json:"code,omitempty"`
	Message string      `json:"message,omitempty"`
}

// RegisterSchemas registers the reader schema of every record type with
// a schema (SchemaTypes), in type order, and sets each subject's
// compatibility to RegistryCompatibility. It is idempotent: a subject
// already holding the schema is left alone (StatusUnchanged). With dryRun
// nothing is written: each schema is looked up and, when new, checked
// against the subject's latest version. Every call runs under ctx; the
// client carries its own per-request deadline. A type's failure does not
// stop the others; the returned error is non-nil only when ctx ends.
func RegisterSchemas(ctx context.Context, cl *sr.Client, dryRun bool) ([]Registration, error) {
	var out []Registration
	for _, typ := range SchemaTypes() {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		out = append(out, registerOne(ctx, cl, typ, dryRun))
	}
	return out, nil
}

func registerOne(ctx context.Context, cl *sr.Client, typ string, dryRun bool) Registration {
	reg := Registration{Type: typ, Subject: Subject(typ)}
	fail := func(err error) Registration {
		reg.Status, reg.Code, reg.Message = StatusFailed, registryCode(err), registryMessage(err)
		return reg
	}
	strict, ok := SchemaOf(typ)
	if !ok {
		return fail(fmt.Errorf("no schema for %s", typ))
	}
	reader, err := ReaderSchema(strict)
	if err != nil {
		return fail(err)
	}
	schema := sr.Schema{Schema: string(reader), Type: sr.TypeJSON}
	if !dryRun {
		// Set first, so the level holds for the registration below.
		res := cl.SetCompatibility(ctx, sr.SetCompatibility{Level: RegistryCompatibility}, reg.Subject)
		if err := res[0].Err; err != nil {
			return fail(err)
		}
	}
	found, err := cl.LookupSchema(ctx, reg.Subject, schema)
	switch {
	case err == nil:
		reg.Status, reg.ID, reg.Version = StatusUnchanged, found.ID, found.Version
		return reg
	case isRegistryError(err, sr.ErrSubjectNotFound):
		// A new subject: nothing to be compatible with.
		if dryRun {
			reg.Status = StatusWouldRegister
			return reg
		}
	case isRegistryError(err, sr.ErrSchemaNotFound):
		if dryRun {
			res, err := cl.CheckCompatibility(sr.WithParams(ctx, sr.Verbose), reg.Subject, -1, schema)
			if err != nil {
				return fail(err)
			}
			if !res.Is {
				return fail(incompatible(res.Messages))
			}
			reg.Status = StatusWouldRegister
			return reg
		}
	default:
		return fail(err)
	}
	id, err := cl.RegisterSchema(ctx, reg.Subject, schema, -1, -1)
	if err != nil {
		return fail(err)
	}
	// The registry answers an id only; the version is the lookup's.
	found, err = cl.LookupSchema(ctx, reg.Subject, schema)
	if err != nil {
		return fail(err)
	}
	reg.Status, reg.ID, reg.Version = StatusRegistered, id, found.Version
	return reg
}

// errIncompatible is a compatibility check's negative answer.
type errIncompatible struct{ messages []string }

func (e errIncompatible) Error() string {
	if len(e.messages) == 0 {
		return "incompatible with the subject's latest version"
	}
	return "incompatible with the subject's latest version: " + strings.Join(e.messages, "; ")
}

func incompatible(messages []string) error { return errIncompatible{messages} }

func isRegistryError(err error, want *sr.Error) bool {
	var re *sr.ResponseError
	return errors.As(err, &re) && re.ErrorCode == want.Code
}

// registryCode maps a registry failure to a stable code.
func registryCode(err error) domain.Code {
	if errors.As(err, new(errIncompatible)) {
		return domain.CodeConflict
	}
	var re *sr.ResponseError
	if !errors.As(err, &re) {
		var ue *url.Error
		switch {
		case errors.Is(err, ErrRegistryResponseTooLarge):
			return domain.CodeTooLarge
		case errors.As(err, &ue), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
			// Not answered: refused, unreachable, timed out.
			return domain.CodeUnavailable
		}
		return domain.CodeInternal
	}
	switch {
	case re.StatusCode == http.StatusConflict:
		return domain.CodeConflict
	case re.StatusCode == http.StatusUnprocessableEntity:
		return domain.CodeSchema
	case re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden:
		return domain.CodeUnauthorized
	case re.StatusCode >= 500:
		return domain.CodeUnavailable
	}
	return domain.CodeInvalid
}

// ErrRegistryResponseTooLarge is a registry answer cut short because it
// went past the bound its reader sets.
var ErrRegistryResponseTooLarge = errors.New("registry response too large")

// MaxRegistryMessage bounds how much of a registry's error text is kept:
// the registry is another service, and its text ends up on a terminal.
const MaxRegistryMessage = 300

// registryMessage is err's text, printable and bounded.
func registryMessage(err error) string {
	msg := err.Error()
	var re *sr.ResponseError
	if errors.As(err, &re) {
		msg = fmt.Sprintf("registry answered %d (error_code %d): %s", re.StatusCode, re.ErrorCode, re.Message)
	}
	msg = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, msg)
	if len(msg) > MaxRegistryMessage {
		msg = strings.ToValidUTF8(msg[:MaxRegistryMessage], "") + "…"
	}
	return msg
}
