package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/apitest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

const (
	tokenA = "tok-a-3f9c1e7d0b2a4c6e8f1a3b5c7d9e0f21"
	tokenB = "tok-b-0a1b2c3d4e5f60718293a4b5c6d7e8f9"
	// tokenExamples speaks as any "/..." source, as the shipped examples do.
	tokenExamples = "tok-examples-5e6f708192a3b4c5d6e7f8091a2b"
	// secretPassword must never appear in a record, a response or a log line.
	secretPassword = "Pl@intext-S3cret-hunter2-XYZZY"
	eventTime      = "2026-05-01T12:00:00Z"
)

// env is a real server on loopback, backed by an in-process kfake broker
// with the topic catalog applied. Requests go through the embedded client:
// POST /v1/events as tokenA unless a request says otherwise.
type env struct {
	*apitest.Client
	t       testing.TB
	brk     *apitest.Broker // nil with noBroker
	brokers []string
	ns      topics.Namespace // the test's
	kc      *kgo.Client
	keyring *sealing.Keyring
	reg     *prometheus.Registry
	srv     *Server
	logs    *mailplanetest.Output
	start   apitest.Offsets
}

type envOpts struct {
	noBroker bool           // the server gets a stub producer and no broker
	fake     *kfake.Cluster // use this cluster (for its fault hooks)
	prod     Producer
	wrap     func(Producer) Producer // wraps the server's producer (OwnershipProducer)
	opts     []Option
}

func newKeyring(t testing.TB) *sealing.Keyring {
	t.Helper()
	key := make([]byte, sealing.KeySize)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	k, err := sealing.NewKeyring("test-1", map[string][]byte{"test-1": key})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newEnv(t testing.TB, eo envOpts) *env {
	t.Helper()
	e := &env{t: t, keyring: newKeyring(t), reg: prometheus.NewRegistry(), logs: &mailplanetest.Output{}}
	prod := eo.prod
	opts := []Option{
		WithAuthenticator(testAuth(t)),
		WithSealer(e.keyring),
		WithRegisterer(e.reg),
		WithLogger(slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		WithDatabaseCheck(func(context.Context) error { return nil }),
		WithHealthTimeout(time.Second),
	}
	if !eo.noBroker {
		if eo.fake != nil {
			e.brk = apitest.NewBrokerOn(t, eo.fake, "api-test")
		} else {
			e.brk = apitest.NewBroker(t, "api-test")
		}
		e.brokers, e.ns, e.kc = e.brk.Config.Brokers, e.brk.Config.Namespace, e.brk.Client
		if prod == nil {
			prod = e.brk.Producer(producer.WithSealer(e.keyring), producer.WithRegisterer(e.reg))
		}
		opts = append(opts, WithBrokerCheck(e.kc))
	}
	if eo.wrap != nil {
		prod = eo.wrap(prod)
	}
	srv, err := New(prod, append(opts, eo.opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.Client = &apitest.Client{
		T: t, Base: "http://" + ln.Addr().String(), HTTP: &http.Client{Timeout: 30 * time.Second},
		Method: http.MethodPost, Path: "/v1/events", Token: tokenA, Secrets: []string{secretPassword},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		if strings.Contains(e.logs.String(), secretPassword) {
			t.Errorf("the plaintext password appears in the server log")
		}
	})
	if e.brk != nil {
		e.start = e.watermarks()
	}
	return e
}

// req is a request to the server; its empty fields are the env's
// defaults (POST /v1/events as tokenA).
type req = apitest.Request

func (e *env) postStructured(ev map[string]any) (*http.Response, []byte) {
	e.t.Helper()
	return e.Do(req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(e.t, ev)})
}

func (e *env) postBatch(evs ...map[string]any) (*http.Response, []byte) {
	e.t.Helper()
	return e.Do(req{ContentType: ContentTypeBatch, Body: mailplanetest.MustJSON(e.t, evs)})
}

// eventTopics are the topics the server produces to: the domain topics and
// the observations topic (warmup_observed), which is not one of them.
func eventTopics() []string {
	ts := topics.DomainTopics()
	if !slices.Contains(ts, topics.MailboxObservations) {
		ts = append(ts, topics.MailboxObservations)
	}
	return ts
}

// watermarks returns the end offset of every partition of every topic
// the server produces to.
func (e *env) watermarks() apitest.Offsets {
	e.t.Helper()
	return e.brk.EndOffsets(eventTopics()...)
}

// assertNothingProduced checks that no topic the server produces to grew
// since the env started.
func (e *env) assertNothingProduced() {
	e.t.Helper()
	e.brk.AssertNothingProduced(e.start)
}

// metricsText reads GET /metrics from the ops handler.
func (e *env) metricsText() string {
	e.t.Helper()
	rr := httptest.NewRecorder()
	e.srv.OpsHandler().ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rr.Code != http.StatusOK {
		e.t.Fatalf("GET /metrics: %d %s", rr.Code, rr.Body)
	}
	return rr.Body.String()
}

// testAuth: tokenA may publish every type as any urn: source and read
// workers' assignments; tokenB publishes the public types as
// urn:mailplane:test only.
func testAuth(t testing.TB) *access.Authenticator {
	t.Helper()
	a, err := access.FromBytes([]byte(
		access.Line("all", tokenA, domain.AllScopes(), "urn:") + "\n" +
			access.Line("product", tokenB, []string{domain.ScopePublishPublic}, "urn:mailplane:test") + "\n" +
			access.Line("examples", tokenExamples, domain.AllScopes(), "/") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func decodeErr(t testing.TB, b []byte) ErrorResponse {
	t.Helper()
	var er ErrorResponse
	if err := json.Unmarshal(b, &er); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, b)
	}
	return er
}

func decodeAccepted(t testing.TB, b []byte) AcceptedResponse {
	t.Helper()
	var ar AcceptedResponse
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ar); err != nil {
		t.Fatalf("accepted body: %v: %s", err, b)
	}
	return ar
}

// Event builders: structured CloudEvents as maps, so cases can break them.

func newID() string   { return domain.NewEventID() }
func newUUID() string { return uuid.NewString() }

func envelope(typ, subject string, data map[string]any) map[string]any {
	return map[string]any{
		"specversion": "1.0", "id": newID(), "type": typ, "source": "urn:mailplane:test",
		"time": eventTime, "subject": subject, "datacontenttype": "application/json", "data": data,
	}
}

func mailboxAdded() map[string]any {
	id := newUUID()
	return envelope(domain.TypeMailboxAdded, id, map[string]any{
		"mailbox_id": id, "org_id": newUUID(), "user_id": newUUID(),
		"address": "ada@example.com", "provider": "smtp_imap", "warmup_enabled": true,
		"imap": map[string]any{
			"host": "imap.example.com", "port": 993, "tls": "implicit", "username": "ada@example.com",
		},
		"credentials": map[string]any{"password": secretPassword},
	})
}

func mailboxRemoved() map[string]any {
	id := newUUID()
	return envelope(domain.TypeMailboxRemoved, id, map[string]any{"mailbox_id": id, "reason": "user deleted it"})
}

func healthScored() map[string]any {
	id := newUUID()
	return envelope(domain.TypeMailboxHealthScored, id, map[string]any{
		"mailbox_id": id, "state": "watch", "score": 55.5, "reason": "bounce rate", "until": "2026-05-02T00:00:00Z",
		"evidence": map[string]any{"window_seconds": 604800, "window_end": "2026-04-25T00:00:00Z", "inbox": 18, "junk": 2,
			"min_observations": 20, "rate": 0.1, "rule": "level", "threshold": map[string]any{"rate": 0.1, "state": "watch"}},
	})
}

func mailboxDisabled() map[string]any {
	id := newUUID()
	return envelope(domain.TypeMailboxDisabled, id, map[string]any{
		"mailbox_id": id, "cause": "auth_failing", "reason": "AUTHENTICATIONFAILED Invalid credentials",
		"failing_since": "2026-04-30T12:00:00Z",
	})
}

// warmupObserved is about the sending mailbox; the recipient is another.
func warmupObserved() map[string]any {
	id := newUUID()
	return envelope(domain.TypeWarmupObserved, id, map[string]any{
		"mailbox_id": id, "warmup_id": "wu-" + id[:8] + ".1", "placement": "junk",
		"landed_at": "2026-05-01T11:59:58.5Z", "source": "imap_sync", "recipient_mailbox_id": newUUID(),
	})
}

func planChanged() map[string]any {
	id := newUUID()
	return envelope(domain.TypeOrgPlanChanged, id, map[string]any{
		"org_id": id, "plan": "dedicated", "dedicated_workers": 2, "paid": true, "source": "billing:evt_123",
	})
}

func userActive() map[string]any {
	id := newUUID()
	return envelope(domain.TypeUserActive, id, map[string]any{"user_id": id, "source": "login"})
}

func heartbeat() map[string]any {
	id := newUUID()
	return envelope(domain.TypeWorkerHeartbeat, id, map[string]any{
		"worker_id": id, "tier": "shared_free", "egress": "cold_smtp", "address": "10.0.0.7:2525", "stopping": false,
	})
}

func healthSampled() map[string]any {
	id := newUUID()
	return envelope(domain.TypeWorkerHealthSampled, id, map[string]any{
		"worker_id": id, "window_seconds": 300, "sends": 1000, "hard_bounces": 3, "complaints": 0,
	})
}

// allTypes returns one valid event of every type.
func allTypes() []map[string]any {
	return []map[string]any{
		mailboxAdded(), mailboxRemoved(), healthScored(), mailboxDisabled(), warmupObserved(),
		planChanged(), userActive(), heartbeat(), healthSampled(),
	}
}

// with returns a deep copy of ev with the dotted path set to v.
func with(ev map[string]any, path string, v any) map[string]any {
	c := deepCopy(ev)
	parts := strings.Split(path, ".")
	m := c
	for _, p := range parts[:len(parts)-1] {
		m = m[p].(map[string]any)
	}
	m[parts[len(parts)-1]] = v
	return c
}

// without returns a deep copy of ev with the dotted path removed.
func without(ev map[string]any, path string) map[string]any {
	c := deepCopy(ev)
	parts := strings.Split(path, ".")
	m := c
	for _, p := range parts[:len(parts)-1] {
		m = m[p].(map[string]any)
	}
	delete(m, parts[len(parts)-1])
	return c
}

func deepCopy(m map[string]any) map[string]any {
	c := make(map[string]any, len(m))
	for k, v := range m {
		if mm, ok := v.(map[string]any); ok {
			v = deepCopy(mm)
		}
		c[k] = v
	}
	return c
}

// binaryHeaders renders ev's attributes as binary-mode headers.
func binaryHeadersOf(ev map[string]any) map[string]string {
	h := map[string]string{}
	for _, a := range []string{"specversion", "id", "type", "source", "time", "subject"} {
		if v, ok := ev[a]; ok {
			h["ce-"+a] = fmt.Sprint(v)
		}
	}
	return h
}
