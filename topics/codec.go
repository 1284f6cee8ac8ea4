package topics

import (
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
	HeaderContentType = "content-type"
)

// ContentTypeJSON is the content type of every record value.
const ContentTypeJSON = "application/json"

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
	subject := e.Subject
	if subject == "" && e.Data != nil {
		subject = e.Data.AggregateID()
	}
	return &kgo.Record{
		Topic: topic,
		Key:   []byte(subject),
		Value: value,
		Headers: []kgo.RecordHeader{
			{Key: HeaderSpecVersion, Value: []byte(domain.SpecVersion)},
			{Key: HeaderID, Value: []byte(e.ID)},
			{Key: HeaderType, Value: []byte(e.Type)},
			{Key: HeaderSource, Value: []byte(e.Source)},
			{Key: HeaderTime, Value: []byte(e.Time.UTC().Format(time.RFC3339Nano))},
			{Key: HeaderSubject, Value: []byte(subject)},
			{Key: HeaderContentType, Value: []byte(ContentTypeJSON)},
		},
	}, nil
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
	// One pass over the headers; the first of a name counts, as in Header.
	var (
		spec, id, typ, source, ts, subject, ct []byte
		seen                                   uint8
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
		default:
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
	if len(ct) > 0 && string(ct) != ContentTypeJSON {
		ps.Add(HeaderContentType, domain.CodeMalformedHeader, "content-type must be %s", ContentTypeJSON)
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
		Logged: r.Timestamp}
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
	return e, nil
}
