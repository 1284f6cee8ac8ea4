package topics

import (
	"maps"
	"mime"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
)

// CloudEvents Kafka binary-mode header names.
const (
	HeaderSpecVersion = "ce_specversion"
	HeaderID          = "ce_id"
	HeaderType        = "ce_type"
	HeaderSource      = "ce_source"
	HeaderTime        = "ce_time"
	HeaderSubject     = "ce_subject"
	HeaderDataSchema  = "ce_dataschema"
	HeaderContentType = "content-type"
	// HeaderPrefix starts every attribute header; the other ce_* headers
	// of a domain event are its extension attributes.
	HeaderPrefix = "ce_"
)

// ContentTypeJSON is the content type of every record value mailplane
// writes. Readers also take it with a charset parameter (utf-8), and
// structured-mode records (ContentTypeCloudEvents: the whole CloudEvent in
// the value), as other Kafka producers write them.
const ContentTypeJSON = "application/json"

// ContentTypeCloudEvents marks a structured-mode record.
const ContentTypeCloudEvents = "application/cloudevents+json"

// Encode renders an event as a binary-mode record on its domain topic: value
// is the JSON data, ce_* headers carry the attributes, key is the aggregate id.
// Encode refuses events that do not validate, so nothing invalid (and no plain
// secret) is ever produced.
func Encode(e domain.Event) (*kgo.Record, error) {
	if ps := e.Validate(); len(ps) > 0 {
		return nil, ps.Err()
	}
	topic, err := ForType(e.Type)
	if err != nil {
		return nil, err
	}
	return EncodeTo(topic, e)
}

// EncodeTo is Encode onto an explicit topic (decisions and audit facts).
func EncodeTo(topic string, e domain.Event) (*kgo.Record, error) {
	value, err := marshalData(e.Data)
	if err != nil {
		return nil, err
	}
	if e.Subject == "" && e.Data != nil {
		e.Subject = e.Data.AggregateID()
	}
	return &kgo.Record{Topic: topic, Key: []byte(e.Subject), Value: value, Headers: AttributeHeaders(e)}, nil
}

// AttributeHeaders renders e's CloudEvents attributes and extensions as
// binary-mode headers (content-type application/json). It is the one
// place a record's ce_dataschema is set: e's own (what a producer sent),
// else domain.SchemaURI of its type, so that every record mailplane
// writes names the schema its value follows (domain/schemas/README.md).
func AttributeHeaders(e domain.Event) []kgo.RecordHeader {
	schema := e.DataSchema
	if schema == "" {
		schema = domain.SchemaURI(e.Type)
	}
	headers := []kgo.RecordHeader{
		{Key: HeaderSpecVersion, Value: []byte(domain.SpecVersion)},
		{Key: HeaderID, Value: []byte(e.ID)},
		{Key: HeaderType, Value: []byte(e.Type)},
		{Key: HeaderSource, Value: []byte(e.Source)},
		{Key: HeaderTime, Value: []byte(e.Time.UTC().Format(time.RFC3339Nano))},
		{Key: HeaderSubject, Value: []byte(e.Subject)},
		{Key: HeaderContentType, Value: []byte(ContentTypeJSON)},
		{Key: HeaderDataSchema, Value: []byte(schema)},
	}
	for _, k := range slices.Sorted(maps.Keys(e.Extensions)) {
		headers = append(headers, kgo.RecordHeader{Key: HeaderPrefix + k, Value: []byte(e.Extensions[k])})
	}
	return headers
}

// Header returns the value of the first header named key.
func Header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// Decode reads a domain event from a binary-mode record. Missing or
// malformed headers, unknown types, bad JSON, invalid data, a key that is
// not the aggregate id, and plain-text secrets are all errors with a code;
// Decode never panics. Data decoding is lenient about unknown fields so that
// old consumers read what newer producers write.
func Decode(r *kgo.Record) (domain.Event, error) {
	if ct, ok := Header(r, HeaderContentType); ok && mediaType(ct) == ContentTypeCloudEvents {
		return decodeStructured(r)
	}
	// One pass over the headers; the first of a name counts, as in Header.
	var (
		spec, id, typ, source, ts, subject, ct, schema []byte
		ext                                            map[string]string
		seen                                           uint8
	)
	for _, h := range r.Headers {
		var dst *[]byte
		var bit uint8
		switch h.Key {
		case HeaderSpecVersion:
			dst, bit = &spec, 1<<0
		case HeaderID:
			dst, bit = &id, 1<<1
		case HeaderType:
			dst, bit = &typ, 1<<2
		case HeaderSource:
			dst, bit = &source, 1<<3
		case HeaderTime:
			dst, bit = &ts, 1<<4
		case HeaderSubject:
			dst, bit = &subject, 1<<5
		case HeaderContentType:
			dst, bit = &ct, 1<<6
		case HeaderDataSchema:
			dst, bit = &schema, 1<<7
		default:
			if name, ok := strings.CutPrefix(h.Key, HeaderPrefix); ok {
				if ext == nil {
					ext = map[string]string{}
				}
				if _, dup := ext[name]; !dup {
					ext[name] = string(h.Value)
				}
			}
			continue
		}
		if seen&bit == 0 {
			seen |= bit
			*dst = h.Value
		}
	}
	var ps domain.Problems
	for i, key := range []string{HeaderSpecVersion, HeaderID, HeaderType, HeaderSource, HeaderTime} {
		if seen&(1<<i) == 0 {
			ps.Add(key, domain.CodeMissingHeader, "header %s is missing", key)
		}
	}
	if len(ps) > 0 {
		return domain.Event{}, ps.Err()
	}
	if string(spec) != domain.SpecVersion {
		ps.Add(HeaderSpecVersion, domain.CodeMalformedHeader, "unsupported specversion %q", spec)
	}
	if len(ct) > 0 && !isJSON(string(ct)) {
		ps.Add(HeaderContentType, domain.CodeMalformedHeader, "content-type must be %s (charset utf-8 if any) or %s", ContentTypeJSON, ContentTypeCloudEvents)
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		ps.Add(HeaderTime, domain.CodeMalformedHeader, "ce_time is not RFC 3339")
	}
	if _, ok := domain.AggregateOf(string(typ)); !ok {
		ps.Add(HeaderType, domain.CodeUnknownType, "unknown event type %q", typ)
	}
	if len(ps) > 0 {
		return domain.Event{}, ps.Err()
	}
	data, dps := domain.DecodeData(string(typ), r.Value, false)
	if len(dps) > 0 {
		return domain.Event{}, dps.Err()
	}
	// data.EventType() is typ (DecodeData made data for it), as a constant.
	e := domain.Event{ID: string(id), Type: data.EventType(), Source: string(source), Time: t.UTC(), Subject: string(subject), Data: data,
		DataSchema: string(schema), Extensions: ext, Logged: r.Timestamp}
	return checked(r, e)
}

// checked validates a decoded event and its record key.
func checked(r *kgo.Record, e domain.Event) (domain.Event, error) {
	data := e.Data
	if ps := e.Validate(); len(ps) > 0 {
		if ps.Has(domain.CodePlaintextSecret) {
			return domain.Event{}, &domain.Error{Code: domain.CodePlaintextSecret, Message: "record carries a plain-text secret", Problems: ps}
		}
		return domain.Event{}, ps.Err()
	}
	if string(r.Key) != data.AggregateID() {
		return domain.Event{}, domain.Errorf(domain.CodeKeyMismatch, "record key %q is not the aggregate id %q", r.Key, data.AggregateID())
	}
	if e.Subject == "" {
		e.Subject = data.AggregateID()
	}
	if e.DataSchema == domain.SchemaURI(e.Type) {
		// mailplane's own (AttributeHeaders sets it again on encoding):
		// DataSchema holds only what a producer sent of its own, so a
		// record decodes to the event it was encoded from.
		e.DataSchema = ""
	}
	return e, nil
}

// decodeStructured reads a structured-mode record: the value is the whole
// CloudEvent (JSON), as other Kafka producers may write it. Its data is
// read leniently, like a binary-mode record's; credentials must be sealed.
func decodeStructured(r *kgo.Record) (domain.Event, error) {
	e, ps := domain.ParseStructuredRecord(r.Value)
	if len(ps) > 0 {
		if ps.Has(domain.CodePlaintextSecret) {
			return domain.Event{}, &domain.Error{Code: domain.CodePlaintextSecret, Message: "record carries a plain-text secret", Problems: ps}
		}
		return domain.Event{}, ps.Err()
	}
	e.Logged = r.Timestamp
	return checked(r, e)
}

// mediaType is a content type without its parameters, lower-cased.
func mediaType(ct string) string {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}

// isJSON accepts application/json, with a charset parameter of utf-8 at
// most (JSON is UTF-8: RFC 8259).
func isJSON(ct string) bool {
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != ContentTypeJSON {
		return false
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return false
		}
	}
	return true
}
