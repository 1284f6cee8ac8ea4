package domain

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SpecVersion is the CloudEvents version mailplane speaks.
const SpecVersion = "1.0"

// Event is a domain event: CloudEvents attributes around typed data.
type Event struct {
	ID      string    // the producer's id, any clean string (mailplane mints UUIDv7s); Key is what consumers dedupe by
	Type    string    // e.g. mailplane.mailbox.added.v1
	Source  string    // URI-reference naming the producer
	Time    time.Time // when it happened, per the producer: kept for audit, never a rule's clock (TrustedTime)
	Subject string    // the aggregate id; also the record key
	// DataSchema is the producer's dataschema attribute (a URI), kept on
	// the log; empty when none was sent (records then carry SchemaURI of
	// the type, which decoding also reads back as empty).
	DataSchema string
	// Extensions are the producer's extension attributes (traceparent,
	// partitionkey, ...), kept on the log as ce_<name> headers; mailplane
	// reads none of them.
	Extensions map[string]string
	Data       Data
	// Logged is the record timestamp of a consumed event: when mailplane's
	// producer received it (or the log appended it). Rules run on it
	// (TrustedTime), never on Time. Not part of the CloudEvent: set when
	// decoding a record, zero otherwise.
	Logged time.Time
}

// Aggregate returns the aggregate the event belongs to.
func (e Event) Aggregate() Aggregate {
	a, _ := AggregateOf(e.Type)
	return a
}

// MaxFutureSkew is how far ahead of the receiver's clock an event's time may
// be at ingest: producers' clocks drift, but an event dated later than this
// is refused (CodeTimeInFuture) rather than kept with a claim nobody can
// check. Rules never run on the event time anyway (see TrustedTime).
const MaxFutureSkew = 5 * time.Minute

// ValidateAt is Validate at ingest, where the receiver's clock reads now: it
// also refuses an event time more than MaxFutureSkew ahead of now.
func (e Event) ValidateAt(now time.Time) Problems {
	ps := e.Validate()
	if TooFarAhead(e.Time, now) {
		ps.Add("time", CodeTimeInFuture, "is more than %s ahead of the server's clock (%s)", MaxFutureSkew, now.UTC().Format(time.RFC3339))
	}
	return ps
}

// TooFarAhead reports whether a time a client claims, t, is more than
// MaxFutureSkew ahead of the receiver's clock, now (never when either is
// zero): such a time is refused at ingest (CodeTimeInFuture), whether an
// event's or a Stripe event's created.
func TooFarAhead(t, now time.Time) bool {
	return !t.IsZero() && !now.IsZero() && t.Sub(now) > MaxFutureSkew
}

// TrustedTime is the time rules (liveness, band dwell, capacity ramp,
// session heat) run on for a record the log holds with timestamp logged,
// read by a consumer whose clock reads now. mailplane's producers stamp the
// record timestamp with their own clock at ingest; the event's own time is
// the producer's claim, kept for audit only. A record timestamp ahead of
// the consumer's clock (written straight to the topic, or a skewed broker)
// counts as now: nothing can be seen before it happened, so a record dated
// 2099 cannot pin a state into the future. A zero timestamp counts as now.
func TrustedTime(logged, now time.Time) time.Time {
	if logged.IsZero() || logged.After(now) {
		return now
	}
	return logged
}

// ClaimNoLaterThanLogged is the event's claimed time, but never later than
// when mailplane received it (its record timestamp, when it was read from
// one). Facts kept from the claim (a mailbox's registration time, which
// keeps it out of the cold sync tier) can then only be dated back, which
// hurts nobody but the producer's own mailbox, never forward.
func (e Event) ClaimNoLaterThanLogged() time.Time {
	if !e.Logged.IsZero() && e.Time.After(e.Logged) {
		return e.Logged
	}
	return e.Time
}

// Validate checks the envelope and the data and returns every problem; data
// problems carry field paths under "data.".
func (e Event) Validate() Problems {
	var ps Problems
	// Any id the spec allows (a non-empty string), as clean text: with
	// its source it identifies the event (Key).
	checkText(&ps, "id", e.ID, true, MaxEventID)
	checkSource(&ps, "source", e.Source)
	checkDataSchema(&ps, e.DataSchema)
	checkExtensions(&ps, e.Extensions)
	if e.Time.IsZero() {
		ps.Add("time", CodeRequired, "is required")
	} else if y := e.Time.UTC().Year(); y < 0 || y > 9999 {
		// RFC 3339 has four-digit years; in UTC (as encoded) this one has not.
		ps.Add("time", CodeInvalid, "must be within years 0000 to 9999 in UTC")
	}
	if _, ok := registry[e.Type]; !ok {
		if e.Type == "" {
			ps.Add("type", CodeRequired, "is required")
		} else {
			ps.Add("type", CodeUnknownType, "unknown event type %q", e.Type)
		}
		return ps
	}
	if e.Data == nil {
		ps.Add("data", CodeRequired, "is required")
		return ps
	}
	if e.Data.EventType() != e.Type {
		ps.Add("type", CodeInvalid, "data is %s, not %s", e.Data.EventType(), e.Type)
	}
	dps := e.Data.Validate()
	ps = append(ps, dps.Prefixed("data")...)
	if e.Subject != "" && e.Subject != e.Data.AggregateID() && len(dps) == 0 {
		ps.Add("subject", CodeKeyMismatch, "subject %q is not the aggregate id %q", e.Subject, e.Data.AggregateID())
	}
	return ps
}

// DecodeData decodes an event's JSON data for eventType. Strict decoding (at
// ingest) refuses unknown fields; lenient decoding (consumers) tolerates
// fields added by newer producers. Validation is not run here.
func DecodeData(eventType string, raw []byte, strict bool) (Data, Problems) {
	var ps Problems
	d, ok := NewData(eventType)
	if !ok {
		ps.Add("type", CodeUnknownType, "unknown event type %q", eventType)
		return nil, ps
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		ps.Add("data", CodeRequired, "is required")
		return nil, ps
	}
	// The plain form producers write takes a fast path, which decodes
	// exactly what the path below would (consumers decode every record;
	// ingest decodes every event a producer sends), and anything else the
	// path below.
	if strict {
		if decodeFastStrict(d, raw) {
			return d, nil
		}
	} else if decodeFast(d, raw) {
		return d, nil
	}
	d, _ = NewData(eventType)
	return decodeDataSlow(d, raw, strict)
}

// decodeDataSlow is DecodeData without its fast path: strictShape and
// encoding/json, into the zero value d.
func decodeDataSlow(d Data, raw []byte, strict bool) (Data, Problems) {
	var ps Problems
	if strict {
		// What the schemas refuse and encoding/json lets through.
		if raw, ps = strictShape(raw, reflect.TypeOf(d).Elem()); len(ps) > 0 {
			return nil, ps
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(d); err != nil {
		ps = append(ps, jsonProblem("data", err))
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) {
			return nil, ps
		}
		// A type error still fills the other fields; report them too.
		for _, p := range d.Validate().Prefixed("data") {
			if p.Field != ps[0].Field && !strings.HasPrefix(p.Field, ps[0].Field+".") {
				ps = append(ps, p)
			}
		}
		return nil, ps
	}
	if _, err := dec.Token(); err != io.EOF {
		ps.Add("data", CodeMalformedJSON, "trailing data after the JSON object")
		return nil, ps
	}
	return d, nil
}

// jsonProblem turns an encoding/json error into a problem with a field path.
func jsonProblem(prefix string, err error) Problem {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		f := prefix
		if te.Field != "" {
			f = prefix + "." + te.Field
		}
		return Problem{Field: f, Code: CodeInvalidType, Message: fmt.Sprintf("must be %s, not %s", jsonTypeName(te.Type.Kind().String()), te.Value)}
	case errors.As(err, &se):
		return Problem{Field: prefix, Code: CodeMalformedJSON, Message: fmt.Sprintf("malformed JSON at byte %d: %v", se.Offset, se)}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return Problem{Field: prefix + "." + name, Code: CodeUnknownField, Message: "unknown field"}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return Problem{Field: prefix, Code: CodeMalformedJSON, Message: "truncated JSON"}
	default:
		return Problem{Field: prefix, Code: CodeMalformedJSON, Message: err.Error()}
	}
}

func jsonTypeName(kind string) string {
	switch kind {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer"
	case "float32", "float64":
		return "a number"
	case "bool":
		return "a boolean"
	case "string":
		return "a string"
	case "struct", "map", "ptr":
		return "an object"
	case "slice", "array":
		return "an array"
	}
	return kind
}

var structuredAttrs = map[string]bool{
	"specversion": true, "id": true, "type": true, "source": true, "time": true,
	"subject": true, "datacontenttype": true, "dataschema": true, "data": true,
}

// structured is the JSON form of a CloudEvent (structured content mode).
type structured struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Type            string          `json:"type"`
	Source          string          `json:"source"`
	Time            string          `json:"time,omitempty"`
	Subject         string          `json:"subject,omitempty"`
	DataContentType string          `json:"datacontenttype,omitempty"`
	DataSchema      string          `json:"dataschema,omitempty"`
	Data            json.RawMessage `json:"data,omitempty"`
}

// ParseStructured parses a structured-mode CloudEvent. Time defaults to now
// when absent. Problems from the envelope, the data's JSON and the data's
// validation are all returned together. Plain credentials in mailbox.added
// data are kept for the caller to seal; Validate reports them if it does not.
func ParseStructured(raw []byte, now time.Time, seal SealFunc) (Event, Problems) {
	c, ps := ParseChecked(raw, now, seal)
	return c.ev, ps
}

// ParseChecked is ParseStructured, the event returned as Checked: the
// ingest API hands it to the producer, which then does not validate it
// again.
func ParseChecked(raw []byte, now time.Time, seal SealFunc) (Checked, Problems) {
	if a, d, ok := parseStructuredFast(raw); ok {
		return fromAttributes(a, func() (Data, Problems) { return d, nil }, now, seal, nil)
	}
	a, data, ps := parseEnvelope(raw)
	if len(ps) > 0 {
		return Checked{}, ps
	}
	return FromAttributesChecked(a, data, now, seal, &ps)
}

// Checked is an event that passed ValidateAt (its plain credentials sealed
// first, when it was parsed with a SealFunc). Only this package makes one
// (Event.Check, ParseChecked, FromAttributesChecked), so holding a Checked
// is proof of the check, not a flag a caller sets: the producer encodes it
// without validating it again (producer.Client.PrepareChecked). Its data is
// the event's own pointer: whoever changes it after the check must build
// the event again and check it again.
type Checked struct{ ev Event }

// Event returns the checked event.
func (c Checked) Event() Event { return c.ev }

// Check runs ValidateAt on e; without problems, e is returned as Checked.
func (e Event) Check(now time.Time) (Checked, Problems) {
	if ps := e.ValidateAt(now); len(ps) > 0 {
		return Checked{}, ps
	}
	return Checked{ev: e}, nil
}

// parseStructuredFast reads the plain form of a structured-mode CloudEvent
// in one pass, its data decoded strictly in place (decodeFastStrict): the
// attributes of the spec, each once, as strings without escapes, data an
// object (before or after type), no extensions. Anything else (ok false) is
// for parseEnvelope and DecodeData, which then find what is wrong with it;
// what it accepts they read the same (TestParseStructuredFastAgrees,
// FuzzParseStructuredFast). It saves ingest the generic walks over each
// event (a map of raw members, a token walk of the data, then its decode).
func parseStructuredFast(raw []byte) (Attributes, Data, bool) {
	var a Attributes
	var d Data
	var later []byte // data that came before type
	s := scanner{b: raw, strict: true}
	var seen uint32
	ok := s.object(func(name []byte) bool {
		var dst *string
		var bit uint32
		switch string(name) { // no allocation
		case "specversion":
			dst, bit = &a.SpecVersion, 1<<0
		case "id":
			dst, bit = &a.ID, 1<<1
		case "type":
			dst, bit = &a.Type, 1<<2
		case "source":
			dst, bit = &a.Source, 1<<3
		case "time":
			dst, bit = &a.Time, 1<<4
		case "subject":
			dst, bit = &a.Subject, 1<<5
		case "datacontenttype":
			dst, bit = &a.DataContentType, 1<<6
		case "dataschema":
			dst, bit = &a.DataSchema, 1<<7
		case "data":
			if !once(&seen, 1<<8) {
				return false
			}
			if a.Type == "" {
				// Encoders that sort members (any map) put data first:
				// find its end now, decode it once type is known.
				var ok bool
				later, ok = s.skipObject()
				return ok
			}
			var known bool
			if d, known = NewData(a.Type); !known {
				return false // not one of ours
			}
			return s.data(d)
		default:
			return false // an extension, or a name parseEnvelope refuses
		}
		return once(&seen, bit) && s.str(dst)
	})
	if !ok {
		return Attributes{}, nil, false
	}
	s.ws()
	if s.i != len(s.b) {
		return Attributes{}, nil, false
	}
	if later != nil {
		var known bool
		if d, known = NewData(a.Type); !known || !decodeFastStrict(d, later) {
			return Attributes{}, nil, false
		}
	}
	if d == nil {
		return Attributes{}, nil, false
	}
	return a, d, true
}

// ParseStructuredRecord parses a structured-mode CloudEvent read from the
// log (a Kafka record's value): data is decoded leniently, as a consumer
// does, time is required, and nothing is sealed (credentials must be
// sealed already). Validation problems are returned.
func ParseStructuredRecord(raw []byte) (Event, Problems) {
	a, data, ps := parseEnvelope(raw)
	if len(ps) > 0 {
		return Event{}, ps
	}
	ev := envelope(a, time.Time{}, &ps)
	if len(ps) > 0 {
		return Event{}, ps
	}
	d, dps := DecodeData(a.Type, data, false)
	if len(dps) > 0 {
		return Event{}, dps
	}
	ev.Data = d
	return ev, nil
}

// parseEnvelope reads a structured-mode CloudEvent's attributes, its
// extensions and its undecoded data.
func parseEnvelope(raw []byte) (Attributes, []byte, Problems) {
	// One pass into raw members: attribute names are matched exactly
	// (encoding/json would match struct fields case-insensitively), and the
	// data member is handed on undecoded.
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			return Attributes{}, nil, Problems{{Code: CodeInvalidType, Message: "a CloudEvent must be a JSON object, not " + ute.Value}}
		}
		return Attributes{}, nil, Problems{jsonProblem("", err)}
	}
	var ps Problems
	var ext map[string]string
	for _, k := range slices.Sorted(maps.Keys(top)) {
		if structuredAttrs[k] {
			continue
		}
		if !IsExtensionName(k) {
			ps.Add(k, CodeUnknownField, "unknown CloudEvents attribute: an extension's name is 1 to 20 lower-case letters or digits")
			continue
		}
		v, ok := extensionValue(top[k])
		if !ok {
			ps.Add(k, CodeInvalidType, "an extension attribute must be a string, a number or a boolean")
			continue
		}
		if ext == nil {
			ext = map[string]string{}
		}
		ext[k] = v
	}
	if len(ps) > 0 {
		return Attributes{}, nil, ps
	}
	attr := func(name string) string {
		m, ok := top[name]
		if !ok {
			return ""
		}
		var v string
		if err := json.Unmarshal(m, &v); err != nil {
			p := jsonProblem("", err)
			p.Field = name
			if p.Code == CodeInvalidType {
				p.Message = "must be a string"
			}
			ps = append(ps, p)
		}
		return v
	}
	a := Attributes{
		SpecVersion: attr("specversion"), ID: attr("id"), Type: attr("type"), Source: attr("source"),
		Time: attr("time"), Subject: attr("subject"), DataContentType: attr("datacontenttype"),
		DataSchema: attr("dataschema"), Extensions: ext,
	}
	if len(ps) > 0 {
		return Attributes{}, nil, ps
	}
	var data []byte
	if d, ok := top["data"]; ok && !bytes.Equal(bytes.TrimSpace(d), []byte("null")) {
		data = d
	}
	return a, data, nil
}

// Attributes are CloudEvents context attributes as received, before checks.
type Attributes struct {
	SpecVersion     string
	ID              string
	Type            string
	Source          string
	Time            string
	Subject         string
	DataContentType string
	DataSchema      string
	Extensions      map[string]string
}

// extensionValue reads a structured-mode extension attribute: a JSON
// string as is, a number or a boolean as its JSON text (the canonical
// string form the spec's binary modes carry).
func extensionValue(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "", false
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", false
		}
		return s, true
	case 't', 'f':
		var b bool
		if err := json.Unmarshal(raw, &b); err != nil {
			return "", false
		}
		return strconv.FormatBool(b), true
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		var n json.Number
		if err := json.Unmarshal(raw, &n); err != nil {
			return "", false
		}
		return n.String(), true
	}
	return "", false
}

// SealFunc seals a secret bound to aad (see CredentialsAAD).
type SealFunc func(plain, aad []byte) (SealedSecret, error)

// FromAttributes builds and validates an event from raw attributes and JSON
// data, strictly (unknown data fields are problems). When seal is not nil,
// the data is a producer's: sealed credentials are refused (RefuseSealed),
// plain ones are checked and sealed before validation (SealData), so the
// event returned carries only the sealed form. prior problems are included.
func FromAttributes(a Attributes, data []byte, now time.Time, seal SealFunc, prior *Problems) (Event, Problems) {
	c, ps := FromAttributesChecked(a, data, now, seal, prior)
	return c.ev, ps
}

// FromAttributesChecked is FromAttributes, the event returned as Checked.
func FromAttributesChecked(a Attributes, data []byte, now time.Time, seal SealFunc, prior *Problems) (Checked, Problems) {
	return fromAttributes(a, func() (Data, Problems) { return DecodeData(a.Type, data, true) }, now, seal, prior)
}

// fromAttributes is FromAttributes with the data's strict decoding given
// as decode, which runs when a's type is registered.
func fromAttributes(a Attributes, decode func() (Data, Problems), now time.Time, seal SealFunc, prior *Problems) (Checked, Problems) {
	var ps Problems
	if prior != nil {
		ps = *prior
	}
	ev := envelope(a, now, &ps)
	if _, ok := registry[a.Type]; ok {
		d, dps := decode()
		if len(dps) > 0 {
			// Envelope problems still count; data problems replace validation.
			env := ev
			env.Data = nil
			for _, p := range env.Validate() {
				if p.Field != "data" {
					ps = append(ps, p)
				}
			}
			return Checked{}, append(ps, dps...)
		}
		ev.Data = d
		var sps Problems
		if seal != nil {
			sps = RefuseSealed(d)
		}
		if len(sps) == 0 {
			sps = SealData(d, seal)
		}
		if len(sps) > 0 {
			return Checked{}, append(ps, sps.Prefixed("data")...)
		}
	}
	ps = append(ps, ev.ValidateAt(now)...)
	if len(ps) > 0 {
		return Checked{}, ps
	}
	if ev.Subject == "" {
		ev.Subject = ev.Data.AggregateID()
	}
	return Checked{ev: ev}, nil
}

// envelope checks the context attributes every CloudEvent carries and
// returns the event they make, without data. The time defaults to now;
// with now zero (a record on the log) it is required.
func envelope(a Attributes, now time.Time, ps *Problems) Event {
	switch a.SpecVersion {
	case SpecVersion:
	case "":
		ps.Add("specversion", CodeRequired, "is required")
	default:
		ps.Add("specversion", CodeInvalid, "must be %q", SpecVersion)
	}
	if a.DataContentType != "" && !isJSONContentType(a.DataContentType) {
		ps.Add("datacontenttype", CodeInvalid, "must be application/json")
	}
	ev := Event{ID: a.ID, Type: a.Type, Source: a.Source, Subject: a.Subject, Time: now.UTC(),
		DataSchema: a.DataSchema, Extensions: a.Extensions}
	if a.Time == "" && !now.IsZero() {
		return ev
	}
	if t, err := time.Parse(time.RFC3339Nano, a.Time); err != nil {
		ps.Add("time", CodeInvalid, "must be an RFC 3339 timestamp")
	} else {
		ev.Time = t.UTC()
	}
	return ev
}

func isJSONContentType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.TrimSpace(strings.ToLower(mt))
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// MarshalStructured renders an event as a structured-mode CloudEvent.
func MarshalStructured(e Event) ([]byte, error) {
	data, err := json.Marshal(e.Data)
	if err != nil {
		return nil, err
	}
	s := structured{
		SpecVersion: SpecVersion, ID: e.ID, Type: e.Type, Source: e.Source,
		Time: e.Time.UTC().Format(time.RFC3339Nano), Subject: e.Subject,
		DataContentType: "application/json", DataSchema: e.DataSchema, Data: data,
	}
	if len(e.Extensions) == 0 {
		return json.Marshal(s)
	}
	// Extensions are top-level members, beside the attributes.
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, err
	}
	for k, v := range e.Extensions {
		if top[k], err = json.Marshal(v); err != nil {
			return nil, err
		}
	}
	return json.Marshal(top)
}

// RefuseSealed refuses a mailbox.added that arrives with
// sealed_credentials from a producer (sealed_credentials_refused): only
// mailplane seals, so a sealed blob copied from the log cannot register a
// mailbox anew, at the endpoint of the attacker's choosing or any other.
// Callers that seal (the ingest API, the Go client with a sealer) call it
// on what producers hand them, before SealData.
//
// A mailbox.credentials_rotated is refused whole, whatever the caller's
// scopes: it is nothing but sealed credentials, written by mailplane's own
// roles (credentials reseal, OAuth rotation) straight to the log; from a
// producer it could only put back an older password or refresh token.
func RefuseSealed(d Data) Problems {
	var ps Problems
	switch m := d.(type) {
	case *MailboxAdded:
		if m.SealedCredentials != nil {
			ps.Add("sealed_credentials", CodeSealedCredentialsRefused, "sealed credentials are not accepted from producers: send credentials in plain text, mailplane seals them")
		}
	case *CredentialsRotated:
		ps.Add("sealed_credentials", CodeSealedCredentialsRefused, "mailbox.credentials_rotated is written by mailplane's roles only; to change a mailbox's credentials send a mailbox.added with fresh ones")
	}
	return ps
}

// FromRolesOnly reports whether events of eventType are written only by
// mailplane's roles and refused from producers (RefuseSealed), so no
// example of them is publishable.
func FromRolesOnly(eventType string) bool { return eventType == TypeCredentialsRotated }

// SealData seals plain secrets in d when seal is not nil, bound to the
// mailbox's endpoint. A mailbox.added without any credentials is refused
// (credentials_required: a new or changed endpoint needs fresh
// credentials), and so is a gmail or outlook mailbox at another endpoint
// than its provider's (provider_endpoint). It is idempotent: data it
// sealed already passes again (the API seals, then its producer
// prepares). Problems are returned with field paths relative to d. With
// seal nil (a consumer of the log) nothing is checked here.
func SealData(d Data, seal SealFunc) Problems {
	m, ok := d.(*MailboxAdded)
	if !ok || seal == nil {
		return nil
	}
	var ps Problems
	// A gmail or outlook mailbox only at its provider's endpoint: checked
	// where credentials are sealed bound to the endpoint, so no sealed
	// OAuth token ever opens for another host. (The log form stays as
	// released: records written before this rule still decode.)
	checkProviderEndpoint(&ps, m.Provider, m.IMAP)
	if len(ps) > 0 {
		return ps.Prefixed("imap")
	}
	switch {
	case m.Credentials != nil && m.SealedCredentials != nil:
		ps.Add("sealed_credentials", CodeSealedCredentialsRefused, "give credentials in plain text only: mailplane seals them")
		return ps
	case m.Credentials == nil && m.SealedCredentials == nil:
		ps.Add("credentials", CodeCredentialsRequired, "a mailbox.added needs its credentials (password or oauth_refresh_token) for the endpoint it names")
		return ps
	case m.Credentials == nil:
		return nil // sealed here already
	}
	if cps := m.Credentials.Validate(); len(cps) > 0 {
		return cps.Prefixed("credentials")
	}
	if err := m.SealWith(seal); err != nil {
		ps.Add("credentials", CodeInternal, "sealing failed: %v", err)
	}
	return ps
}
