package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/examples"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

var fixedNow = time.Date(2026, 5, 1, 12, 30, 0, 0, time.UTC)

// expectEvent parses a posted structured event the way the server does.
func (e *env) expectEvent(raw []byte) domain.Event {
	e.t.Helper()
	ev, ps := domain.ParseStructured(raw, fixedNow, e.keyring.Seal)
	if len(ps) > 0 {
		e.t.Fatalf("test event does not parse: %s", ps)
	}
	return ev
}

// checkLanded fetches the record a receipt points at, decodes it with
// topics.Decode and compares it with want (sealed credentials compared by
// opening them). It also checks that no plain secret is in the record.
func (e *env) checkLanded(rc Receipt, want domain.Event) *kgo.Record {
	e.t.Helper()
	wantTopic, err := topics.ForType(want.Type)
	if err != nil {
		e.t.Fatal(err)
	}
	wantTopic = e.ns.Topic(wantTopic)
	if rc.Topic != wantTopic || rc.ID != want.ID || rc.Type != want.Type || rc.Offset < 0 {
		e.t.Fatalf("receipt %+v for event %s (%s), want topic %s", rc, want.ID, want.Type, wantTopic)
	}
	rec := e.brk.Fetch(rc.Topic, rc.Partition, rc.Offset)
	if rec.ProducerID < 0 {
		e.t.Errorf("record was not produced idempotently (producer id %d)", rec.ProducerID)
	}
	recordHasNoSecret(e.t, rec)
	got, err := topics.Decode(rec)
	if err != nil {
		e.t.Fatalf("topics.Decode: %v", err)
	}
	if string(rec.Key) != want.Subject {
		e.t.Errorf("key %q, want subject %q", rec.Key, want.Subject)
	}
	// The record's time is the server's at ingest, not the event's.
	if got.Logged.IsZero() || !got.Logged.Equal(rec.Timestamp) {
		e.t.Errorf("decoded Logged %s, record timestamp %s", got.Logged, rec.Timestamp)
	}
	got.Logged = time.Time{}
	if gm, ok := got.Data.(*domain.MailboxAdded); ok {
		wm := want.Data.(*domain.MailboxAdded)
		if gm.SealedCredentials == nil || gm.Credentials != nil {
			e.t.Fatalf("mailbox.added on the log: sealed %v, plain %v", gm.SealedCredentials != nil, gm.Credentials != nil)
		}
		plain, err := e.keyring.Open(*gm.SealedCredentials, gm.AAD())
		if err != nil {
			e.t.Fatalf("sealed credentials do not open: %v", err)
		}
		wantPlain, _ := e.keyring.Open(*wm.SealedCredentials, wm.AAD())
		if !bytes.Equal(plain, wantPlain) {
			e.t.Errorf("sealed credentials open to something else")
		}
		g, w := *gm, *wm
		g.SealedCredentials, w.SealedCredentials = nil, nil
		got.Data, want.Data = &g, &w
	}
	if !reflect.DeepEqual(got, want) {
		e.t.Errorf("record decodes to\n%+v\nwant\n%+v", got, want)
	}
	return rec
}

func recordHasNoSecret(t testing.TB, rec *kgo.Record) {
	t.Helper()
	for _, b := range [][]byte{rec.Key, rec.Value} {
		if bytes.Contains(b, []byte(secretPassword)) || bytes.Contains(b, []byte("dev-password")) {
			t.Errorf("plaintext password in record key or value")
		}
	}
	for _, h := range rec.Headers {
		if bytes.Contains(h.Value, []byte(secretPassword)) || strings.Contains(h.Key, secretPassword) {
			t.Errorf("plaintext password in record header %s", h.Key)
		}
	}
	if bytes.Contains(rec.Value, []byte(`"credentials"`)) || bytes.Contains(rec.Value, []byte(`"password"`)) {
		t.Errorf("record value carries a plain credentials object: %s", rec.Value)
	}
}

func TestIngestStructuredMailboxAdded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithClock(func() time.Time { return fixedNow })}})
	raw := mailplanetest.MustJSON(t, mailboxAdded())
	resp, body := e.Do(req{ContentType: ContentTypeStructured + "; charset=UTF-8", Body: raw})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	ar := decodeAccepted(t, body)
	if len(ar.Events) != 1 || ar.Events[0].Index != 0 {
		t.Fatalf("receipts %+v", ar.Events)
	}
	rec := e.checkLanded(ar.Events[0], e.expectEvent(raw))
	if !bytes.Contains(rec.Value, []byte(`"sealed_credentials"`)) {
		t.Errorf("record value has no sealed_credentials: %s", rec.Value)
	}
	for _, h := range []string{topics.HeaderSpecVersion, topics.HeaderID, topics.HeaderType, topics.HeaderSource, topics.HeaderTime, topics.HeaderSubject} {
		if v, ok := topics.Header(rec, h); !ok || v == "" {
			t.Errorf("header %s missing", h)
		}
	}
}

func TestIngestStructuredDefaultsTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithClock(func() time.Time { return fixedNow })}})
	raw := mailplanetest.MustJSON(t, without(userActive(), "time"))
	resp, body := e.Do(req{ContentType: ContentTypeStructured, Body: raw})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	want := e.expectEvent(raw)
	if !want.Time.Equal(fixedNow) {
		t.Fatalf("expected time %v", want.Time)
	}
	e.checkLanded(decodeAccepted(t, body).Events[0], want)
}

// TestIngestExamples posts the shipped examples one by one (structured),
// and all together (batch).
func TestIngestExamples(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithClock(func() time.Time { return fixedNow })}})
	var raws []json.RawMessage
	for _, typ := range domain.EventTypes() {
		raw, err := examples.Event(typ)
		if err != nil {
			t.Fatal(err)
		}
		if domain.FromRolesOnly(typ) {
			// Written by mailplane's roles only: refused from any caller,
			// an all-scopes one included.
			resp, body := e.Do(req{ContentType: ContentTypeStructured, Body: raw, Token: tokenExamples})
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), string(domain.CodeSealedCredentialsRefused)) {
				t.Fatalf("%s: status %d: %s", typ, resp.StatusCode, body)
			}
			continue
		}
		raws = append(raws, raw)
		resp, body := e.Do(req{ContentType: ContentTypeStructured, Body: raw, Token: tokenExamples})
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("%s: status %d: %s", typ, resp.StatusCode, body)
		}
		e.checkLanded(decodeAccepted(t, body).Events[0], e.expectEvent(raw))
	}
	batch := mailplanetest.MustJSON(t, raws)
	resp, body := e.Do(req{ContentType: ContentTypeBatch, Body: batch, Token: tokenExamples})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("batch: status %d: %s", resp.StatusCode, body)
	}
	ar := decodeAccepted(t, body)
	if len(ar.Events) != len(raws) {
		t.Fatalf("%d receipts for %d events", len(ar.Events), len(raws))
	}
	for i, rc := range ar.Events {
		if rc.Index != i {
			t.Errorf("receipt %d has index %d", i, rc.Index)
		}
		e.checkLanded(rc, e.expectEvent(raws[i]))
	}
}

func TestIngestBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithClock(func() time.Time { return fixedNow })}})
	evs := allTypes()
	same := len(evs)
	// Three events about one mailbox keep their order on one partition.
	first := healthScored()
	mbID := first["subject"].(string)
	evs = append(evs, first,
		with(with(with(healthScored(), "subject", mbID), "data.mailbox_id", mbID), "data.state", "throttled"),
		with(with(with(healthScored(), "subject", mbID), "data.mailbox_id", mbID), "data.state", "healthy"))
	for range 40 {
		evs = append(evs, userActive())
	}
	raws := make([][]byte, len(evs))
	for i, ev := range evs {
		raws[i] = mailplanetest.MustJSON(t, ev)
	}
	resp, body := e.postBatch(evs...)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	ar := decodeAccepted(t, body)
	if len(ar.Events) != len(evs) {
		t.Fatalf("%d receipts for %d events", len(ar.Events), len(evs))
	}
	for i, rc := range ar.Events {
		if rc.Index != i {
			t.Errorf("receipt %d has index %d", i, rc.Index)
		}
		e.checkLanded(rc, e.expectEvent(raws[i]))
	}
	a, b, c := ar.Events[same], ar.Events[same+1], ar.Events[same+2]
	if a.Partition != b.Partition || b.Partition != c.Partition || !(a.Offset < b.Offset && b.Offset < c.Offset) {
		t.Errorf("same-key events out of order: %+v %+v %+v", a, b, c)
	}
}

// TestIngestWarmupObservedTopic: observations go to their own topic, keyed
// by the sending mailbox, not to mailbox.events; mailbox.disabled goes to
// mailbox.events with the mailbox's other events.
func TestIngestWarmupObservedTopic(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithClock(func() time.Time { return fixedNow })}})
	obs, dis := warmupObserved(), mailboxDisabled()
	resp, body := e.postBatch(obs, dis)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	ar := decodeAccepted(t, body)
	if len(ar.Events) != 2 {
		t.Fatalf("receipts %+v", ar.Events)
	}
	if got := ar.Events[0].Topic; got != e.ns.Topic(topics.MailboxObservations) {
		t.Errorf("warmup_observed landed on %s, want %s", got, topics.MailboxObservations)
	}
	if got := ar.Events[1].Topic; got != e.ns.Topic(topics.MailboxEvents) {
		t.Errorf("mailbox.disabled landed on %s, want %s", got, topics.MailboxEvents)
	}
	rec := e.checkLanded(ar.Events[0], e.expectEvent(mailplanetest.MustJSON(t, obs)))
	if sender := obs["data"].(map[string]any)["mailbox_id"].(string); string(rec.Key) != sender {
		t.Errorf("observation keyed %q, want the sender %s", rec.Key, sender)
	}
	e.checkLanded(ar.Events[1], e.expectEvent(mailplanetest.MustJSON(t, dis)))
}

func TestIngestBinary(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithClock(func() time.Time { return fixedNow })}})
	for _, ev := range []map[string]any{
		with(userActive(), "source", "urn:product%20api/%C3%BC"), // percent-encoded again on the wire
		without(heartbeat(), "time"),
		mailboxAdded(),
	} {
		h := binaryHeadersOf(ev)
		h["ce-source"] = url.PathEscape(ev["source"].(string))
		resp, body := e.Do(req{ContentType: ContentTypeBinary, Body: mailplanetest.MustJSON(t, ev["data"]), Headers: h})
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		// The binary event is the structured one without datacontenttype.
		e.checkLanded(decodeAccepted(t, body).Events[0], e.expectEvent(mailplanetest.MustJSON(t, without(ev, "datacontenttype"))))
	}
}

// stubProducer prepares with a real producer.Client and produces with fn.
type stubProducer struct {
	*producer.Client
	fn func(ctx context.Context, events []domain.Event, recs []*kgo.Record) ([]producer.Receipt, error)
}

func (s stubProducer) ProduceRecords(ctx context.Context, events []domain.Event, recs []*kgo.Record) ([]producer.Receipt, error) {
	return s.fn(ctx, events, recs)
}

// failProduce makes the broker answer every produce request with code
// while failing is set.
func failProduce(fake *kfake.Cluster, failing *atomic.Bool, code int16) {
	fake.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		if !failing.Load() {
			return nil, nil, false
		}
		req := kr.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// TestIngestProduceFailure fails every produce request on the broker,
// with a retriable error (the produce timeout ends the wait) and with a
// fatal one: the client gets 503 unavailable with nothing listed as
// landed; once the broker recovers, the same request (same ids) is
// accepted.
func TestIngestProduceFailure(t *testing.T) {
	t.Parallel()
	for _, code := range []int16{kerr.NotEnoughReplicas.Code, kerr.InvalidRecord.Code} {
		t.Run(kerr.ErrorForCode(code).Error()[:20], func(t *testing.T) {
			t.Parallel()
			fake := kafkatest.Fake(t)
			var failing atomic.Bool
			failing.Store(true)
			failProduce(fake, &failing, code)
			e := newEnv(t, envOpts{fake: fake, opts: []Option{WithProduceTimeout(time.Second)}})
			batch := mailplanetest.MustJSON(t, []map[string]any{userActive(), mailboxAdded()})
			resp, body := e.Do(req{ContentType: ContentTypeBatch, Body: batch})
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			er := decodeErr(t, body)
			if er.Error.Code != domain.CodeUnavailable || len(er.Events) != 0 || len(er.Failed) != 2 ||
				er.Failed[1].Index != 1 || er.Failed[1].Type != domain.TypeMailboxAdded {
				t.Fatalf("body %s", body)
			}
			if resp.Header.Get("Retry-After") == "" {
				t.Errorf("no Retry-After")
			}
			e.assertNothingProduced()
			m := e.metricsText()
			for _, want := range []string{
				`mailplane_ingest_events_rejected_total{code="unavailable",type="mailplane.user.active.v1"} 1`,
				`mailplane_ingest_events_rejected_total{code="unavailable",type="mailplane.mailbox.added.v1"} 1`,
			} {
				if !strings.Contains(m, want) {
					t.Errorf("metrics lack %s", want)
				}
			}

			failing.Store(false)
			resp, body = e.Do(req{ContentType: ContentTypeBatch, Body: batch})
			if resp.StatusCode != http.StatusAccepted {
				t.Fatalf("after recovery: status %d: %s", resp.StatusCode, body)
			}
			if n := len(decodeAccepted(t, body).Events); n != 2 {
				t.Fatalf("%d receipts", n)
			}
		})
	}
}

// TestIngestPartialProduce: when some records land and others do not, the
// 503 lists both.
func TestIngestPartialProduce(t *testing.T) {
	t.Parallel()
	k := newKeyring(t)
	prod := stubProducer{Client: producer.New(nil, producer.WithSealer(k)), fn: func(_ context.Context, events []domain.Event, recs []*kgo.Record) ([]producer.Receipt, error) {
		out := make([]producer.Receipt, len(events))
		for i, r := range recs {
			if r.Offset != -1 {
				return nil, fmt.Errorf("record %d offset %d before producing, want -1", i, r.Offset)
			}
			// As kgo does: acknowledged records get their partition and
			// offset; failed ones keep offset -1.
			if i%2 == 0 {
				r.Partition, r.Offset = 3, int64(100+i)
			}
			out[i] = producer.Receipt{ID: events[i].ID, Type: events[i].Type, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}
		}
		return out, &domain.Error{Code: domain.CodeUnavailable, Message: "produce: NOT_ENOUGH_REPLICAS"}
	}}
	e := newEnv(t, envOpts{noBroker: true, prod: prod})
	evs := []map[string]any{userActive(), heartbeat(), mailboxAdded()}
	resp, body := e.postBatch(evs...)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	er := decodeErr(t, body)
	if er.Error.Code != domain.CodeUnavailable {
		t.Fatalf("code %s", er.Error.Code)
	}
	if len(er.Events) != 2 || er.Events[0].Index != 0 || er.Events[1].Index != 2 || er.Events[1].Offset != 102 || er.Events[1].Partition != 3 ||
		er.Events[0].ID != evs[0]["id"] || er.Events[0].Topic != topics.UserEvents {
		t.Errorf("landed %+v", er.Events)
	}
	if len(er.Failed) != 1 || er.Failed[0].Index != 1 || er.Failed[0].ID != evs[1]["id"] || er.Failed[0].Type != domain.TypeWorkerHeartbeat {
		t.Errorf("failed %+v", er.Failed)
	}
	m := e.metricsText()
	for _, want := range []string{
		`mailplane_ingest_events_accepted_total{type="mailplane.user.active.v1"} 1`,
		`mailplane_ingest_events_accepted_total{type="mailplane.mailbox.added.v1"} 1`,
		`mailplane_ingest_events_rejected_total{code="unavailable",type="mailplane.worker.heartbeat.v1"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

type schemaFunc func(string, []byte) domain.Problems

func (f schemaFunc) Validate(t string, d []byte) domain.Problems { return f(t, d) }

// TestIngestSchemaValidator: the injected validator sees the sealed data
// exactly as produced, and its problems reject the request.
func TestIngestSchemaValidator(t *testing.T) {
	t.Parallel()
	var sawSealed atomic.Bool
	v := schemaFunc(func(typ string, data []byte) domain.Problems {
		if bytes.Contains(data, []byte(secretPassword)) {
			t.Errorf("schema validator got plain credentials")
		}
		if typ == domain.TypeMailboxAdded && bytes.Contains(data, []byte(`"sealed_credentials"`)) {
			sawSealed.Store(true)
		}
		if typ == domain.TypeWorkerHeartbeat && bytes.Contains(data, []byte(`"10.0.0.99:1"`)) {
			return domain.Problems{
				{Field: "data.address", Code: domain.CodeSchema, Message: "does not match pattern"},
				{Field: "/egress", Message: "JSON pointer paths are normalised"},
			}
		}
		return eventschema.Default().Validate(typ, data)
	})
	e := newEnv(t, envOpts{opts: []Option{WithSchemaValidator(v)}})
	resp, body := e.postBatch(mailboxAdded(), with(heartbeat(), "data.address", "10.0.0.99:1"), userActive())
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	er := decodeErr(t, body)
	if er.Error.Code != domain.CodeInvalid || len(er.Problems) != 2 ||
		er.Problems[0] != (Problem{Index: 1, ID: er.Problems[0].ID, Field: "data.address", Code: domain.CodeSchema, Message: "does not match pattern"}) ||
		er.Problems[1].Field != "data.egress" || er.Problems[1].Code != domain.CodeSchema {
		t.Fatalf("body %s", body)
	}
	if !sawSealed.Load() {
		t.Errorf("validator never saw the sealed mailbox.added data")
	}
	e.assertNothingProduced()

	resp, body = e.postBatch(mailboxAdded(), heartbeat(), userActive())
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
}

// TestIngestRealSchemas wires eventschema's validator (what cmd should
// pass): events of every type, sealed, conform to the published schemas.
func TestIngestRealSchemas(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithSchemaValidator(eventschema.Default())}})
	resp, body := e.postBatch(allTypes()...)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
}

type failingSealer struct{}

func (failingSealer) Seal([]byte, []byte) (domain.SealedSecret, error) {
	return domain.SealedSecret{}, errors.New("entropy ran out")
}

func TestIngestSealingFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithSealer(failingSealer{})}})
	resp, body := e.postBatch(userActive(), mailboxAdded())
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if er := decodeErr(t, body); er.Error.Code != domain.CodeInternal || strings.Contains(string(body), "entropy") {
		t.Errorf("body %s", body)
	}
	e.assertNothingProduced()
}

// TestIngestNoSealer: without a sealer, plain credentials are refused.
func TestIngestNoSealer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithSealer(nil)}})
	resp, body := e.postStructured(mailboxAdded())
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	er := decodeErr(t, body)
	if len(er.Problems) != 1 || er.Problems[0].Code != domain.CodePlaintextSecret || er.Problems[0].Field != "data.credentials" {
		t.Errorf("body %s", body)
	}
	e.assertNothingProduced()
}

// TestIngestCloudEventsSDKShapes: what the CloudEvents SDKs send by
// default is accepted, in both modes, and kept on the log: a UUIDv4 id,
// the dataschema attribute, and extension attributes (traceparent,
// partitionkey) as ce_<name> headers, which Decode reads back.
func TestIngestCloudEventsSDKShapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithClock(func() time.Time { return fixedNow })}})
	const (
		schema = "https://schemas.example.org/mailplane/user.active/v1"
		trace  = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	)
	ev := with(with(with(with(userActive(), "id", "2c5ea4c0-4067-4f5a-9a31-1c9b6f4e8d21"), "dataschema", schema),
		"traceparent", trace), "partitionkey", "user-7")
	structured := func() (*http.Response, []byte) {
		return e.Do(req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(t, ev)})
	}
	binary := func() (*http.Response, []byte) {
		h := binaryHeadersOf(without(without(without(ev, "dataschema"), "traceparent"), "partitionkey"))
		h["ce-id"] = "9b2f4c1e-7d3a-4e8b-b6c5-0a1f2e3d4c5b"
		h["ce-dataschema"] = url.PathEscape(schema)
		h["ce-traceparent"] = trace
		h["ce-partitionkey"] = "user-7"
		return e.Do(req{ContentType: ContentTypeBinary + "; charset=utf-8", Body: mailplanetest.MustJSON(t, ev["data"]), Headers: h})
	}
	for name, send := range map[string]func() (*http.Response, []byte){"structured": structured, "binary": binary} {
		resp, body := send()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("%s: status %d: %s", name, resp.StatusCode, body)
		}
		rc := decodeAccepted(t, body).Events[0]
		rec := e.brk.Fetch(rc.Topic, rc.Partition, rc.Offset)
		for h, want := range map[string]string{topics.HeaderDataSchema: schema, "ce_traceparent": trace, "ce_partitionkey": "user-7"} {
			if got, _ := topics.Header(rec, h); got != want {
				t.Errorf("%s: header %s = %q, want %q", name, h, got, want)
			}
		}
		got, err := topics.Decode(rec)
		if err != nil {
			t.Fatalf("%s: the record does not decode: %v", name, err)
		}
		if got.ID != rc.ID || got.DataSchema != schema || got.Extensions["traceparent"] != trace || got.Extensions["partitionkey"] != "user-7" {
			t.Errorf("%s: decoded %+v", name, got)
		}
	}
}

// TestIngestAnyIDTheSpecAllows: an id that is not a UUID (a producer's
// own order number) is accepted and kept on the record as the producer
// sent it; consumers dedupe the event by its key, derived from source
// and id.
func TestIngestAnyIDTheSpecAllows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithClock(func() time.Time { return fixedNow })}})
	ev := with(userActive(), "id", "order-4711")
	resp, body := e.Do(req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(t, ev)})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	rc := decodeAccepted(t, body).Events[0]
	if rc.ID != "order-4711" {
		t.Errorf("receipt id %q", rc.ID)
	}
	rec := e.brk.Fetch(rc.Topic, rc.Partition, rc.Offset)
	if id, _ := topics.Header(rec, topics.HeaderID); id != "order-4711" {
		t.Errorf("ce_id on the record %q, want the producer's", id)
	}
	got, err := topics.Decode(rec)
	if err != nil {
		t.Fatal(err)
	}
	if k := got.Key(); k != domain.EventKey(ev["source"].(string), "order-4711") || !domain.IsUUIDv7(k) {
		t.Errorf("key %q", k)
	}
}
