package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/producer"
)

// Content types of POST /v1/events.
const (
	ContentTypeStructured = "application/cloudevents+json"
	ContentTypeBatch      = "application/cloudevents-batch+json"
	ContentTypeBinary     = "application/json"
)

type contentMode int

const (
	modeStructured contentMode = iota + 1
	modeBatch
	modeBinary
)

// item is one event of a request on its way through ingestion.
type item struct {
	ev       domain.Event
	chk      domain.Checked // ev, as the domain checked it; set when problems is empty
	rec      *kgo.Record
	problems domain.Problems
	id       string // as read, for problems and duplicate detection
	typ      string // metric label: a domain event type or "unknown"
}

// handleEvents is POST /v1/events.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	var mode contentMode
	mt, ok := mediaType(r.Header.Get("Content-Type"))
	if ok {
		switch mt {
		case ContentTypeStructured:
			mode = modeStructured
		case ContentTypeBatch:
			mode = modeBatch
		case ContentTypeBinary:
			mode = modeBinary
		}
	}
	if mode == 0 {
		s.rejectRequest(w, domain.CodeUnsupportedMediaType, fmt.Sprintf(
			"Content-Type must be %s, %s or %s (binary mode with ce-* headers), charset utf-8 if any",
			ContentTypeStructured, ContentTypeBatch, ContentTypeBinary))
		return
	}
	body, err := ReadBody(w, r, s.cfg.maxBody)
	if err != nil {
		var de *domain.Error
		_ = errors.As(err, &de)
		s.rejectRequest(w, domain.ErrorCode(err), de.Message)
		return
	}
	// The body may hold plain credentials: wipe it once done (best effort;
	// decoded strings are copies the garbage collector reclaims).
	defer clear(body)

	now := s.cfg.now()
	var items []item
	switch mode {
	case modeStructured:
		if len(bytes.TrimSpace(body)) == 0 {
			s.rejectRequest(w, domain.CodeMalformedJSON, "request body is empty; expected a CloudEvent JSON object")
			return
		}
		items = []item{s.parseStructured(body, now)}
	case modeBatch:
		var reqErr *domain.Error
		items, reqErr = s.parseBatch(body, now)
		if reqErr != nil {
			s.rejectRequest(w, reqErr.Code, reqErr.Message)
			return
		}
	case modeBinary:
		items = []item{s.parseBinary(r.Header, body, now)}
	}

	if s.forbid(w, r, items) {
		return
	}
	s.finish(w, r, items)
}

// forbid refuses the whole request with 403 when the caller may not
// publish one of its events: a type its scopes do not grant (internal
// types need their explicit scope) or a source that is not its own. It runs
// before validation, so a caller learns nothing about events it may not
// send, and nothing is produced.
func (s *Server) forbid(w http.ResponseWriter, r *http.Request, items []item) bool {
	caller := CallerFrom(r.Context())
	var problems []Problem
	code := domain.CodeForbidden
	for i, it := range items {
		typ := it.ev.Type
		if typ == "" && it.typ != typeUnknown {
			typ = it.typ // unparsed, but its type was readable
		}
		if typ != "" {
			if miss := caller.PublishScopeMissing(typ); miss != "" {
				problems = append(problems, Problem{Index: i, ID: it.id, Field: "type", Code: domain.CodeForbidden,
					Message: "publishing " + domain.ShortType(typ) + " needs the scope " + miss})
				continue
			}
		}
		if len(it.problems) == 0 && !caller.MaySpeakAs(it.ev.Source) {
			problems = append(problems, Problem{Index: i, ID: it.id, Field: "source", Code: domain.CodeSourceForbidden,
				Message: "the source must be the caller's own source or a path below it"})
		}
	}
	if len(problems) == 0 {
		return false
	}
	if !slices.ContainsFunc(problems, func(p Problem) bool { return p.Code == domain.CodeForbidden }) {
		code = domain.CodeSourceForbidden
	}
	name := "unknown"
	if caller != nil {
		name = caller.Name
	}
	s.metrics.refused.WithLabelValues(name, string(code)).Inc()
	s.metrics.rejected.WithLabelValues(typeUnknown, string(code)).Inc()
	s.log.Info("ingest: request forbidden", "caller", name, "events", len(items), "refused", len(problems), "code", code)
	msg := fmt.Sprintf("%s of %d may not be published by this caller; nothing was produced", summary(len(problems), "event"), len(items))
	WriteJSON(w, http.StatusForbidden, ErrorResponse{Error: ErrorInfo{Code: code, Message: msg}, Problems: problems})
	return true
}

// finish checks duplicates, prepares (encodes, schema-validates) and, when
// every event is valid, produces; it writes the response.
func (s *Server) finish(w http.ResponseWriter, r *http.Request, items []item) {
	markDuplicates(items)
	if err := s.prepare(items); err != nil {
		s.log.Error("ingest: preparing events failed", "events", len(items), "err", err)
		s.metrics.rejected.WithLabelValues(typeUnknown, string(domain.CodeInternal)).Inc()
		WriteError(w, http.StatusInternalServerError, domain.CodeInternal, "internal error; nothing was produced")
		return
	}
	if problems := s.collectProblems(items); len(problems) > 0 {
		s.rejectEvents(w, items, problems)
		return
	}
	if s.cfg.admit != nil && !s.admit(w, r, items) {
		return
	}
	s.produce(w, r, items)
}

// admit runs the admission hook on a valid request; when it refuses, the
// request is answered (429 with Retry-After for rate_limited) and nothing
// is produced.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, items []item) bool {
	events := make([]domain.Event, len(items))
	for i := range items {
		events[i] = items[i].ev
	}
	err := s.cfg.admit(r.Context(), events)
	if err == nil {
		return true
	}
	code := domain.ErrorCode(err)
	s.metrics.rejected.WithLabelValues(typeUnknown, string(code)).Inc()
	var ra interface{ RetryAfter() time.Duration }
	if errors.As(err, &ra) {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(ra.RetryAfter().Round(time.Second)/time.Second))))
	} else if code == domain.CodeRateLimited || code == domain.CodeUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	if code == domain.CodeInternal {
		s.log.Error("ingest: admission failed", "err", err)
	}
	writeAdmissionError(w, err)
	return false
}

// rejectRequest refuses a request as a whole (no event could be told
// apart); it counts once, with type unknown.
func (s *Server) rejectRequest(w http.ResponseWriter, code domain.Code, msg string) {
	s.metrics.rejected.WithLabelValues(typeUnknown, string(code)).Inc()
	WriteError(w, StatusOf(code), code, msg)
}

func (s *Server) parseStructured(raw []byte, now time.Time) item {
	chk, ps := domain.ParseChecked(raw, now, s.seal)
	if len(ps) == 0 {
		return checkedItem(chk)
	}
	it := item{problems: s.dropSealable(ps)}
	it.id, it.typ = peek(raw)
	return it
}

// dropSealable drops plaintext_secret problems when this server seals and
// the event has other problems: when data does not decode, the domain still
// validates what did, which flags the plain credentials the server would
// have sealed, and that would only mislead the client.
func (s *Server) dropSealable(ps domain.Problems) domain.Problems {
	if s.seal == nil || len(ps) < 2 || !ps.Has(domain.CodePlaintextSecret) {
		return ps
	}
	out := ps[:0:0]
	for _, p := range ps {
		if p.Code != domain.CodePlaintextSecret {
			out = append(out, p)
		}
	}
	return out
}

// peek reads the id and type of an event that did not parse, for problem
// reports and metric labels. Only well-formed, bounded strings are kept.
func peek(raw []byte) (id, typ string) {
	var p struct {
		ID   any `json:"id"`
		Type any `json:"type"`
	}
	_ = json.Unmarshal(raw, &p)
	id, _ = p.ID.(string)
	if len(id) > 64 || !utf8.ValidString(id) {
		id = ""
	}
	t, _ := p.Type.(string)
	return id, typeLabel(t)
}

func typeLabel(t string) string {
	if _, ok := domain.AggregateOf(t); ok {
		return t
	}
	return typeUnknown
}

// parseBatch decodes a JSON array of structured CloudEvents, streaming so
// that an oversized batch is refused without decoding it whole.
func (s *Server) parseBatch(body []byte, now time.Time) ([]item, *domain.Error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, domain.Errorf(domain.CodeMalformedJSON, "request body is empty; expected a JSON array of CloudEvents")
	}
	if trimmed[0] != '[' {
		return nil, domain.Errorf(domain.CodeMalformedJSON, "a batch must be a JSON array of CloudEvents")
	}
	if items, ok := s.parseBatchFast(trimmed, now); ok {
		return items, nil
	}
	return s.parseBatchStream(trimmed, now)
}

// parseBatchFast parses a well-formed batch of at most maxBatch events
// without the streaming decoder (which scans each element twice): it
// splits the array by its structure alone, parses each element, and
// checks that an element is valid JSON only when its parse found problems
// (one that parsed cleanly was read whole). ok false: anything else,
// which parseBatchStream then reads and refuses as it always has.
// The elements are slices of the body, which the handler wipes.
func (s *Server) parseBatchFast(trimmed []byte, now time.Time) ([]item, bool) {
	raws, ok := splitArray(trimmed, s.cfg.maxBatch)
	if !ok || len(raws) == 0 {
		return nil, false
	}
	items := make([]item, len(raws))
	for i, raw := range raws {
		items[i] = s.parseStructured(raw, now)
	}
	for i := range items {
		if len(items[i].problems) > 0 && !json.Valid(raws[i]) {
			return nil, false
		}
	}
	return items, true
}

// splitArray splits a JSON array into its elements by brackets, strings
// and commas alone, without checking the elements; ok false when the
// array's own structure is off or it has more than limit elements.
func splitArray(b []byte, limit int) ([][]byte, bool) {
	i := skipWS(b, 1)
	if i < len(b) && b[i] == ']' {
		return nil, skipWS(b, i+1) == len(b)
	}
	var out [][]byte
	for {
		if len(out) == limit {
			return nil, false
		}
		end, ok := skipValue(b, i)
		if !ok {
			return nil, false
		}
		out = append(out, b[i:end])
		i = skipWS(b, end)
		if i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case ']':
			return out, skipWS(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the value starting at b[i], found by
// brackets and strings (a scalar ends where the array's structure goes on).
func skipValue(b []byte, i int) (int, bool) {
	start, depth := i, 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if i >= len(b) {
				return 0, false
			}
			if depth == 0 {
				return i + 1, true
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i, i > start // a scalar's end, or a stray bracket
			}
			if depth--; depth == 0 {
				return i + 1, true
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i, i > start
			}
		}
	}
	return 0, false
}

// parseBatchStream is the streaming parse of a batch, which tells what is
// wrong with one parseBatchFast would not take.
func (s *Server) parseBatchStream(trimmed []byte, now time.Time) ([]item, *domain.Error) {
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	if _, err := dec.Token(); err != nil {
		return nil, domain.Errorf(domain.CodeMalformedJSON, "a batch must be a JSON array of CloudEvents")
	}
	var raws []json.RawMessage
	for dec.More() {
		if len(raws) == s.cfg.maxBatch {
			return nil, domain.Errorf(domain.CodeTooLarge, "a batch holds at most %d events", s.cfg.maxBatch)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, domain.Errorf(domain.CodeMalformedJSON, "batch element %d is not valid JSON", len(raws))
		}
		raws = append(raws, raw)
	}
	if _, err := dec.Token(); err != nil {
		return nil, domain.Errorf(domain.CodeMalformedJSON, "the batch array is not closed properly")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, domain.Errorf(domain.CodeMalformedJSON, "trailing data after the batch array")
	}
	if len(raws) == 0 {
		return nil, domain.Errorf(domain.CodeInvalid, "the batch is empty")
	}
	items := make([]item, len(raws))
	for i, raw := range raws {
		items[i] = s.parseStructured(raw, now)
		clear(raw)
	}
	return items, nil
}

// Binary mode: CloudEvents attributes in ce-* headers (percent-encoded per
// the HTTP binding), the data in the body.
var binaryHeaders = []struct{ header, attr string }{
	{"Ce-Specversion", "specversion"},
	{"Ce-Id", "id"},
	{"Ce-Type", "type"},
	{"Ce-Source", "source"},
	{"Ce-Time", "time"},
	{"Ce-Subject", "subject"},
	{"Ce-Dataschema", "dataschema"},
}

func (s *Server) parseBinary(h http.Header, body []byte, now time.Time) item {
	var ps domain.Problems
	ext := binaryExtensions(h, &ps)
	vals := map[string]string{}
	for _, b := range binaryHeaders {
		if v, ok := headerValue(h, b.header, &ps); ok {
			vals[b.attr] = v
		}
	}
	a := domain.Attributes{
		SpecVersion: vals["specversion"], ID: vals["id"], Type: vals["type"],
		Source: vals["source"], Time: vals["time"], Subject: vals["subject"],
		DataSchema: vals["dataschema"], Extensions: ext,
	}
	chk, eps := domain.FromAttributesChecked(a, body, now, s.seal, nil)
	eps = s.dropSealable(eps)
	// Name envelope problems after the headers the client sent.
	for _, p := range eps {
		for _, b := range binaryHeaders {
			if p.Field != b.attr {
				continue
			}
			p.Field = strings.ToLower(b.header)
			if p.Code == domain.CodeRequired {
				if slices.ContainsFunc(ps, func(q domain.Problem) bool { return q.Field == p.Field }) {
					p.Field = "" // already reported as malformed
				} else {
					p.Code = domain.CodeMissingHeader
					p.Message = "header " + p.Field + " is missing"
				}
			}
		}
		if p.Field != "" || p.Code != domain.CodeRequired {
			ps = append(ps, p)
		}
	}
	id, typ := a.ID, typeLabel(a.Type)
	if len(id) > 64 {
		id = ""
	}
	if len(ps) > 0 {
		return item{problems: ps, id: id, typ: typ}
	}
	return checkedItem(chk)
}

func checkedItem(chk domain.Checked) item {
	ev := chk.Event()
	return item{ev: ev, chk: chk, id: ev.ID, typ: ev.Type}
}

// binaryExtensions reads the extension attributes of a binary-mode
// request: every ce-* header that is not an attribute of the spec, named
// after it (ce-traceparent: traceparent), its value percent-decoded.
func binaryExtensions(h http.Header, ps *domain.Problems) map[string]string {
	var names []string
	for k := range h {
		if len(k) > 3 && strings.EqualFold(k[:3], "ce-") && !slices.ContainsFunc(binaryHeaders, func(b struct{ header, attr string }) bool {
			return strings.EqualFold(b.header, k)
		}) {
			names = append(names, k)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	ext := make(map[string]string, len(names))
	for _, k := range names {
		name := strings.ToLower(k[3:])
		if !domain.IsExtensionName(name) {
			ps.Add(strings.ToLower(k), domain.CodeUnknownField, "unknown CloudEvents attribute: an extension's name is 1 to 20 lower-case letters or digits")
			continue
		}
		if v, ok := headerValue(h, k, ps); ok {
			ext[name] = v
		}
	}
	return ext
}

// headerValue reads a binary-mode attribute header given at most once,
// percent-decoded as the HTTP binding says; a malformed one is a problem
// named after the header. ok is false when absent or malformed.
func headerValue(h http.Header, header string, ps *domain.Problems) (string, bool) {
	vs := h.Values(header)
	if len(vs) == 0 {
		return "", false
	}
	name := strings.ToLower(header)
	if len(vs) > 1 {
		ps.Add(name, domain.CodeMalformedHeader, "header %s must be given once", name)
		return "", false
	}
	v, err := url.PathUnescape(vs[0])
	if err != nil || !utf8.ValidString(v) {
		ps.Add(name, domain.CodeMalformedHeader, "header %s is not valid percent-encoded UTF-8", name)
		return "", false
	}
	return v, true
}

// markDuplicates refuses a second event with an id already in the request.
func markDuplicates(items []item) {
	if len(items) < 2 {
		return
	}
	first := make(map[string]int, len(items))
	for i := range items {
		id := items[i].id
		if id == "" {
			continue
		}
		if j, ok := first[id]; ok {
			items[i].problems = append(items[i].problems, domain.Problem{
				Field: "id", Code: domain.CodeConflict,
				Message: fmt.Sprintf("duplicate event id: event %d has the same id", j),
			})
			continue
		}
		first[id] = i
	}
}

// prepare encodes every valid event (checked by the domain when it was
// parsed, so the producer does not validate it again) and, when the server
// has one, runs the schema validator on the data exactly as it will be
// produced. Events with
// problems are skipped, but every valid event is checked, so the client
// learns of every problem in one round trip. The error is for failures
// that are not the client's (e.g. sealing failed).
func (s *Server) prepare(items []item) error {
	for i := range items {
		it := &items[i]
		if len(it.problems) > 0 {
			if it.problems.Has(domain.CodeInternal) {
				return errors.New("sealing credentials failed")
			}
			continue
		}
		if s.cfg.transport != nil {
			if ps := s.cfg.transport.CheckTransport(it.ev.Data); len(ps) > 0 {
				it.problems = ps.Prefixed("data")
				continue
			}
		}
		if it.chk.Event().Data == nil {
			return errors.New("an event without problems was not checked")
		}
		recs, err := s.prod.PrepareChecked([]domain.Checked{it.chk})
		var be *producer.BatchError
		switch {
		case errors.As(err, &be):
			for _, ep := range be.Events {
				it.problems = append(it.problems, ep.Problems...)
			}
			continue
		case err != nil:
			return err
		case len(recs) != 1 || recs[0] == nil:
			return errors.New("producer prepared no record")
		}
		it.rec = recs[0]
		if s.cfg.schema != nil {
			for _, p := range s.cfg.schema.Validate(it.ev.Type, it.rec.Value) {
				if p.Field != "data" && !strings.HasPrefix(p.Field, "data.") {
					p.Field = strings.TrimPrefix(strings.TrimPrefix(p.Field, "/"), ".")
					if p.Field == "" {
						p.Field = "data"
					} else {
						p.Field = "data." + strings.ReplaceAll(p.Field, "/", ".")
					}
				}
				if p.Code == "" {
					p.Code = domain.CodeSchema
				}
				it.problems = append(it.problems, p)
			}
			if len(it.problems) > 0 {
				it.rec = nil
			}
		}
	}
	return nil
}

// quoted matches quoted fragments of encoding/json messages, which can
// carry pieces of the input (a character of a password, say).
var quoted = regexp.MustCompile(`\s*('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")`)

func (s *Server) collectProblems(items []item) []Problem {
	var out []Problem
	for i, it := range items {
		for _, p := range it.problems {
			msg := p.Message
			if p.Code == domain.CodeMalformedJSON {
				msg = quoted.ReplaceAllString(msg, "")
			}
			out = append(out, Problem{Index: i, ID: it.id, Field: p.Field, Code: p.Code, Message: msg})
		}
	}
	return out
}

// topCode is the request's code: malformed_json or conflict when every
// problem is one, else invalid (the problems carry the specific codes).
func topCode(problems []Problem) domain.Code {
	for _, c := range []domain.Code{domain.CodeMalformedJSON, domain.CodeConflict} {
		if !slices.ContainsFunc(problems, func(p Problem) bool { return p.Code != c }) {
			return c
		}
	}
	return domain.CodeInvalid
}

func (s *Server) rejectEvents(w http.ResponseWriter, items []item, problems []Problem) {
	bad := 0
	codes := map[domain.Code]int{}
	for _, it := range items {
		if len(it.problems) == 0 {
			continue
		}
		bad++
		c := it.problems.Code()
		codes[c]++
		s.metrics.rejected.WithLabelValues(it.typ, string(c)).Inc()
	}
	code := topCode(problems)
	msg := fmt.Sprintf("%s of %d %s invalid; nothing was produced", summary(bad, "event"), len(items), isAre(bad))
	if len(items) == 1 {
		msg = "the event is invalid; nothing was produced"
	}
	s.log.Debug("ingest: events rejected", "events", len(items), "invalid", bad, "codes", codes)
	WriteJSON(w, http.StatusBadRequest, ErrorResponse{
		Error:    ErrorInfo{Code: code, Message: msg},
		Problems: problems,
	})
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

// produce sends every record and waits for acks=all. Producing is detached
// from the client's cancellation: once started, the request is carried
// through (bounded by the produce timeout), so a disconnecting client does
// not cut a batch short.
func (s *Server) produce(w http.ResponseWriter, r *http.Request, items []item) {
	events := make([]domain.Event, len(items))
	recs := make([]*kgo.Record, len(items))
	for i := range items {
		events[i] = items[i].ev
		recs[i] = items[i].rec
		// Offsets stay -1 unless the broker acknowledges the record, so a
		// failed produce tells which events landed.
		recs[i].Offset = -1
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.produceTimeout)
	defer cancel()
	_, err := s.prod.ProduceRecords(ctx, events, recs)

	// Where each event landed is read from its own record, which the
	// client fills in when the broker acknowledges it: the receipts of
	// producer.Client.ProduceRecords come in completion order, not in the
	// order of events (kgo.ProduceSync), so they cannot be zipped with
	// events.
	var landed []Receipt
	var failed []Failed
	for i, it := range items {
		rec := recs[i]
		if rec.Offset >= 0 {
			landed = append(landed, Receipt{Index: i, ID: it.ev.ID, Type: it.ev.Type, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset})
			s.metrics.accepted.WithLabelValues(it.ev.Type).Inc()
			continue
		}
		failed = append(failed, Failed{Index: i, ID: it.ev.ID, Type: it.ev.Type})
		s.metrics.rejected.WithLabelValues(it.ev.Type, string(domain.CodeUnavailable)).Inc()
	}
	if err == nil && len(failed) == 0 {
		WriteJSON(w, http.StatusAccepted, AcceptedResponse{Events: landed})
		return
	}
	if err == nil {
		err = errors.New("producer reported success, but some records carry no offset")
	}
	s.log.Warn("ingest: produce failed", "events", len(items), "landed", len(landed), "err", err)
	w.Header().Set("Retry-After", "1")
	WriteJSON(w, http.StatusServiceUnavailable, ErrorResponse{
		Error: ErrorInfo{Code: domain.CodeUnavailable, Message: fmt.Sprintf(
			"the log did not acknowledge %s of %d; events lists those that landed; retrying with the same event ids is safe",
			summary(len(failed), "event"), len(items))},
		Events: landed,
		Failed: failed,
	})
}

// Publish runs typed events through the pipeline of POST /v1/events
// (sealing, Go and schema validation, duplicate ids, all-or-nothing
// produce, metrics) and writes the same responses: 202 AcceptedResponse,
// 400 with problems, 503 with what landed. Routes that turn their own
// requests into events (worker heartbeats, billing webhooks) call it from
// handlers mounted with Handle. Events without a subject get their
// aggregate id; without an id, a new UUIDv7; without a time, the clock's.
func (s *Server) Publish(w http.ResponseWriter, r *http.Request, events ...domain.Event) {
	if len(events) == 0 {
		s.rejectRequest(w, domain.CodeInvalid, "no events")
		return
	}
	items := make([]item, len(events))
	for i, ev := range events {
		if ev.ID == "" {
			ev.ID = domain.NewEventID()
		}
		if ev.Time.IsZero() {
			ev.Time = s.cfg.now().UTC()
		}
		if ev.Subject == "" && ev.Data != nil {
			ev.Subject = ev.Data.AggregateID()
		}
		it := item{id: ev.ID, typ: typeLabel(ev.Type)}
		if ps := domain.SealData(ev.Data, s.seal); len(ps) > 0 {
			it.problems = ps.Prefixed("data")
		} else if chk, ps := ev.Check(s.cfg.now()); len(ps) > 0 {
			it.problems = ps
		} else {
			it = checkedItem(chk)
		}
		items[i] = it
	}
	s.finish(w, r, items)
}
