package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/opshttp"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

func getHealth(t *testing.T, e *env) (int, opshttp.HealthResponse) {
	t.Helper()
	rr := httptest.NewRecorder()
	e.srv.OpsHandler().ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	var hr opshttp.HealthResponse
	if err := json.Unmarshal(rr.Body.Bytes(), &hr); err != nil {
		t.Fatalf("healthz body: %v: %s", err, rr.Body)
	}
	return rr.Code, hr
}

func TestHealthzOK(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	status, hr := getHealth(t, e)
	if status != http.StatusOK || hr.Status != opshttp.HealthOK ||
		hr.Checks["broker"].Status != opshttp.HealthOK || hr.Checks["database"].Status != opshttp.HealthOK {
		t.Fatalf("%d %+v", status, hr)
	}
}

func TestHealthzDatabaseDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithDatabaseCheck(func(context.Context) error {
		return errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	})}})
	status, hr := getHealth(t, e)
	if status != http.StatusServiceUnavailable || hr.Status != opshttp.HealthUnavailable ||
		hr.Checks["broker"].Status != opshttp.HealthOK || hr.Checks["database"].Status != opshttp.HealthError ||
		!strings.Contains(hr.Checks["database"].Error, "connection refused") {
		t.Fatalf("%d %+v", status, hr)
	}
}

func TestHealthzDatabaseHangs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{
		WithHealthTimeout(100 * time.Millisecond),
		WithDatabaseCheck(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }),
	}})
	start := time.Now()
	status, hr := getHealth(t, e)
	if status != http.StatusServiceUnavailable || hr.Checks["database"].Status != opshttp.HealthError ||
		!strings.Contains(hr.Checks["database"].Error, "timed out") {
		t.Fatalf("%d %+v", status, hr)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("healthz took %v", d)
	}
}

func TestHealthzBrokerDown(t *testing.T) {
	t.Parallel()
	// A port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dead, err := kafka.NewClient(kafka.Config{Brokers: []string{addr}}, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	e := newEnv(t, envOpts{opts: []Option{WithBrokerCheck(dead), WithHealthTimeout(500 * time.Millisecond)}})
	status, hr := getHealth(t, e)
	if status != http.StatusServiceUnavailable || hr.Checks["broker"].Status != opshttp.HealthError ||
		hr.Checks["broker"].Error == "" || hr.Checks["database"].Status != opshttp.HealthOK {
		t.Fatalf("%d %+v", status, hr)
	}
}

func TestHealthzChecksDisabled(t *testing.T) {
	t.Parallel()
	srv, err := New(producer.New(nil), WithAuthenticator(testAuth(t)))
	if err != nil {
		t.Fatal(err)
	}
	rr := httptest.NewRecorder()
	srv.OpsHandler().ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	var hr opshttp.HealthResponse
	if err := json.Unmarshal(rr.Body.Bytes(), &hr); err != nil {
		t.Fatal(err)
	}
	if rr.Code != http.StatusOK || hr.Checks["broker"].Status != opshttp.HealthDisabled || hr.Checks["database"].Status != opshttp.HealthDisabled {
		t.Fatalf("%d %s", rr.Code, rr.Body)
	}
}

// TestMetricsEndpoint: the counters are exposed, labelled by bounded
// values only (no ids, no secrets).
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	good := userActive()
	if resp, body := e.postStructured(good); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	bad := with(heartbeat(), "data.tier", "dedicated")
	if resp, _ := e.postBatch(bad, userActive()); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d", resp.StatusCode)
	}
	e.Do(req{ContentType: ContentTypeStructured, Body: []byte(`{"type":"mailplane.mailbox.added.v1",`)})
	e.Do(req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(t, with(userActive(), "type", "mailplane.evil."+newUUID()))})
	e.Do(req{ContentType: "text/plain", Body: []byte("hi")})
	e.Do(req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(t, mailboxAdded()), Token: "nope"})
	e.Do(req{Method: http.MethodGet})
	e.Do(req{Method: http.MethodGet, Path: "/v1/" + newUUID()})

	m := e.metricsText()
	for _, want := range []string{
		`mailplane_ingest_events_accepted_total{type="mailplane.user.active.v1"} 1`,
		`mailplane_ingest_events_accepted_total{type="mailplane.mailbox.added.v1"} 0`,
		`mailplane_ingest_events_rejected_total{code="tier_not_allowed",type="mailplane.worker.heartbeat.v1"} 1`,
		`mailplane_ingest_events_rejected_total{code="malformed_json",type="unknown"} 1`,
		`mailplane_ingest_events_rejected_total{code="unknown_type",type="unknown"} 1`,
		`mailplane_ingest_events_rejected_total{code="unsupported_media_type",type="unknown"} 1`,
		`mailplane_http_requests_total{code="202",route="POST /v1/events"} 1`,
		`mailplane_http_requests_total{code="400",route="POST /v1/events"} 3`,
		`mailplane_http_requests_total{code="401",route="POST /v1/events"} 1`,
		`mailplane_http_requests_total{code="415",route="POST /v1/events"} 1`,
		`mailplane_http_requests_total{code="405",route="/v1/events"} 1`,
		`mailplane_http_requests_total{code="404",route="unmatched"} 1`,
		`mailplane_http_request_seconds_bucket{route="POST /v1/events",le="+Inf"} 6`,
		`mailplane_produce_seconds_count 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	for _, line := range strings.Split(m, "\n") {
		if !strings.HasPrefix(line, "mailplane_") {
			continue
		}
		// Label values only: no UUID (event or aggregate id) anywhere.
		if i := strings.IndexByte(line, '{'); i >= 0 && uuidish(line[i:]) {
			t.Errorf("metric label carries an id: %s", line)
		}
		if strings.Contains(line, secretPassword) {
			t.Errorf("metric carries the secret: %s", line)
		}
	}
}

func uuidish(s string) bool {
	for i := 0; i+36 <= len(s); i++ {
		if domain.IsUUID(strings.ToLower(s[i : i+36])) {
			return true
		}
	}
	return false
}

func TestServerTimeouts(t *testing.T) {
	t.Parallel()
	srv, err := New(producer.New(nil), WithAuthenticator(testAuth(t)), WithAddr("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	hs := srv.HTTPServer()
	if hs.ReadHeaderTimeout <= 0 || hs.ReadTimeout <= 0 || hs.WriteTimeout <= 0 || hs.IdleTimeout <= 0 || hs.MaxHeaderBytes <= 0 {
		t.Fatalf("unset limits: %+v", hs)
	}
	if hs.WriteTimeout <= DefaultProduceTimeout {
		t.Errorf("write timeout %v does not cover the produce timeout %v", hs.WriteTimeout, DefaultProduceTimeout)
	}
	srv2, err := New(producer.New(nil), WithAuthenticator(testAuth(t)), WithTimeouts(Timeouts{ReadHeader: time.Second, MaxHeaderBytes: 4096}))
	if err != nil {
		t.Fatal(err)
	}
	if hs := srv2.HTTPServer(); hs.ReadHeaderTimeout != time.Second || hs.MaxHeaderBytes != 4096 || hs.ReadTimeout <= 0 {
		t.Fatalf("custom timeouts: %+v", hs)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	p := producer.New(nil)
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for name, tc := range map[string]struct {
		p    Producer
		opts []Option
	}{
		"no producer":        {nil, []Option{WithAuthenticator(testAuth(t))}},
		"no authenticator":   {p, nil},
		"zero in-flight cap": {p, []Option{WithAuthenticator(testAuth(t)), WithMaxInflightBytes(-1)}},
		"zero body limit":    {p, []Option{WithAuthenticator(testAuth(t)), WithMaxBodyBytes(0)}},
		"route conflict":     {p, []Option{WithAuthenticator(testAuth(t)), WithRoute("POST /v1/events", h, true)}},
		"bad pattern":        {p, []Option{WithAuthenticator(testAuth(t)), WithRoute("GET /x/{bad", h, true)}},
		"nil handler":        {p, []Option{WithAuthenticator(testAuth(t)), WithRoute("GET /x", nil, true)}},
		"mixed method and any-method": {p, []Option{WithAuthenticator(testAuth(t)),
			WithRoute("GET /x", h, true), WithRoute("/x", h, true)}},
	} {
		if _, err := New(tc.p, tc.opts...); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

// TestExtraRoutes: routes mounted by later features share auth, JSON
// errors (405 with Allow, 404) and per-pattern metrics.
func TestExtraRoutes(t *testing.T) {
	t.Parallel()
	heartbeat := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			WorkerID string `json:"worker_id"`
		}
		if err := DecodeJSON(w, r, 1024, &in); err != nil {
			WriteDomainError(w, err)
			return
		}
		WriteJSON(w, http.StatusAccepted, map[string]string{"worker_id": in.WorkerID})
	})
	assignments := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]any{"worker_id": r.PathValue("id"), "mailboxes": []string{}})
	})
	webhook := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, http.StatusUnauthorized, domain.CodeUnauthorized, "bad signature")
	})
	e := newEnv(t, envOpts{opts: []Option{
		WithRoute("POST /v1/workers/heartbeat", heartbeat, true),
		WithRoute("GET /v1/workers/{id}/assignments", assignments, true),
		WithRoute("POST /v1/webhooks/billing", webhook, false),
	}})
	wid := newUUID()

	for _, tc := range []struct {
		name   string
		r      req
		status int
		code   domain.Code
		body   string
	}{
		{"heartbeat ok", req{Path: "/v1/workers/heartbeat", ContentType: "application/json", Body: []byte(`{"worker_id":"` + wid + `"}`)}, 202, "", wid},
		{"heartbeat token B", req{Path: "/v1/workers/heartbeat", ContentType: "application/json", Body: []byte(`{"worker_id":"x"}`), Token: tokenB}, 202, "", `"x"`},
		{"heartbeat no token", req{Path: "/v1/workers/heartbeat", ContentType: "application/json", Body: []byte(`{}`), NoAuth: true}, 401, domain.CodeUnauthorized, ""},
		{"heartbeat unknown field", req{Path: "/v1/workers/heartbeat", ContentType: "application/json", Body: []byte(`{"tier":"dedicated"}`)}, 400, domain.CodeInvalid, `"field":"tier"`},
		{"heartbeat wrong type", req{Path: "/v1/workers/heartbeat", ContentType: "application/json", Body: []byte(`{"worker_id":5}`)}, 400, domain.CodeInvalid, `"invalid_type"`},
		{"heartbeat malformed", req{Path: "/v1/workers/heartbeat", ContentType: "application/json", Body: []byte(`{"worker_id":`)}, 400, domain.CodeMalformedJSON, ""},
		{"heartbeat trailing", req{Path: "/v1/workers/heartbeat", ContentType: "application/json", Body: []byte(`{} {}`)}, 400, domain.CodeMalformedJSON, ""},
		{"heartbeat too large", req{Path: "/v1/workers/heartbeat", ContentType: "application/json", Body: []byte(`{"worker_id":"` + strings.Repeat("x", 2000) + `"}`)}, 413, domain.CodeTooLarge, ""},
		{"heartbeat wrong media type", req{Path: "/v1/workers/heartbeat", ContentType: "text/plain", Body: []byte(`{}`)}, 415, domain.CodeUnsupportedMediaType, ""},
		{"heartbeat GET", req{Method: http.MethodGet, Path: "/v1/workers/heartbeat"}, 405, CodeMethodNotAllowed, ""},
		{"assignments", req{Method: http.MethodGet, Path: "/v1/workers/" + wid + "/assignments"}, 200, "", wid},
		{"assignments lower-case bearer", req{Method: http.MethodGet, Path: "/v1/workers/w/assignments", NoAuth: true, Headers: map[string]string{"Authorization": "bearer " + tokenA}}, 200, "", ""},
		{"assignments no token", req{Method: http.MethodGet, Path: "/v1/workers/w/assignments", NoAuth: true}, 401, domain.CodeUnauthorized, ""},
		{"assignments DELETE", req{Method: http.MethodDelete, Path: "/v1/workers/w/assignments"}, 405, CodeMethodNotAllowed, ""},
		{"webhook without token", req{Path: "/v1/webhooks/billing", ContentType: "application/json", Body: []byte(`{}`), NoAuth: true}, 401, domain.CodeUnauthorized, "bad signature"},
		{"unknown path", req{Method: http.MethodGet, Path: "/v2/events"}, 404, domain.CodeNotFound, ""},
	} {
		resp, body := e.Do(tc.r)
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d, want %d: %s", tc.name, resp.StatusCode, tc.status, body)
			continue
		}
		if tc.code != "" {
			if er := decodeErr(t, body); er.Error.Code != tc.code {
				t.Errorf("%s: code %q, want %q: %s", tc.name, er.Error.Code, tc.code, body)
			}
		}
		if !strings.Contains(string(body), tc.body) {
			t.Errorf("%s: body %s lacks %s", tc.name, body, tc.body)
		}
		if tc.status == 405 {
			if allow := resp.Header.Get("Allow"); allow == "" {
				t.Errorf("%s: no Allow header", tc.name)
			}
		}
	}
	m := e.metricsText()
	for _, want := range []string{
		`mailplane_http_requests_total{code="200",route="GET /v1/workers/{id}/assignments"} 2`,
		`mailplane_http_requests_total{code="405",route="/v1/workers/{id}/assignments"} 1`,
		`mailplane_http_requests_total{code="202",route="POST /v1/workers/heartbeat"} 2`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if uuidish(m) {
		t.Errorf("metrics carry an id")
	}
}

// TestServeGracefulShutdown: cancelling Serve's context lets an in-flight
// request finish, then Serve returns nil.
func TestServeGracefulShutdown(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		WriteJSON(w, http.StatusOK, map[string]bool{"done": true})
	})
	srv, err := New(producer.New(nil), WithAuthenticator(testAuth(t)), WithRoute("GET /slow", slow, false))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()

	got := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String() + "/slow")
		if err != nil {
			got <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got <- resp.Status + " " + string(b)
	}()
	<-started
	cancel()
	select {
	case err := <-served:
		t.Fatalf("Serve returned with a request in flight: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Errorf("new connections still accepted while shutting down")
	}
	close(release)
	if r := <-got; !strings.HasPrefix(r, "200") || !strings.Contains(r, `"done":true`) {
		t.Errorf("in-flight request: %s", r)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

func TestRun(t *testing.T) {
	t.Parallel()
	srv, err := New(producer.New(nil), WithAuthenticator(testAuth(t)), WithAddr("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	bad, err := New(producer.New(nil), WithAuthenticator(testAuth(t)), WithAddr("127.0.0.1:99999"))
	if err != nil {
		t.Fatal(err)
	}
	if err := bad.Run(context.Background()); err == nil {
		t.Fatal("Run on a bad address succeeded")
	}
}

// TestSharedRegistry: two servers can register on one registry.
func TestSharedRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	for range 2 {
		if _, err := New(producer.New(nil), WithAuthenticator(testAuth(t)), WithRegisterer(reg)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWriteDomainError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err    error
		status int
		code   domain.Code
		leaks  string
	}{
		{domain.Errorf(domain.CodeNotFound, "no worker w"), 404, domain.CodeNotFound, ""},
		{domain.Errorf(domain.CodeConflict, "stale"), 409, domain.CodeConflict, ""},
		{domain.Problems{{Field: "tier", Code: domain.CodeTierNotAllowed, Message: "no"}}.Err(), 400, domain.CodeTierNotAllowed, ""},
		{domain.Errorf(domain.CodeUnavailable, "later"), 503, domain.CodeUnavailable, ""},
		{errors.New("pq: password authentication failed for user x"), 500, domain.CodeInternal, "password"},
	} {
		rr := httptest.NewRecorder()
		WriteDomainError(rr, tc.err)
		er := decodeErr(t, rr.Body.Bytes())
		if rr.Code != tc.status || er.Error.Code != tc.code {
			t.Errorf("%v: %d %s", tc.err, rr.Code, rr.Body)
		}
		if tc.leaks != "" && strings.Contains(rr.Body.String(), tc.leaks) {
			t.Errorf("%v: internal error leaked: %s", tc.err, rr.Body)
		}
	}
}

// TestWriteProblems: the 400 refusing one input answers with the
// problems' shared code (else invalid) and every problem at index 0; no
// problems leave the member out.
func TestWriteProblems(t *testing.T) {
	t.Parallel()
	tier := domain.Problem{Field: "tier", Code: domain.CodeTierNotAllowed, Message: "dedicated is allocated"}
	other := domain.Problem{Field: "worker_id", Code: domain.CodeUnknownField, Message: "not a field"}
	for _, tc := range []struct {
		ps   domain.Problems
		code domain.Code
	}{
		{domain.Problems{tier}, domain.CodeTierNotAllowed},
		{domain.Problems{tier, tier}, domain.CodeTierNotAllowed},
		{domain.Problems{tier, other}, domain.CodeInvalid},
		{nil, domain.CodeInvalid},
	} {
		rr := httptest.NewRecorder()
		WriteProblems(rr, http.StatusBadRequest, "the heartbeat is invalid", tc.ps)
		er := decodeErr(t, rr.Body.Bytes())
		if rr.Code != http.StatusBadRequest || er.Error.Code != tc.code || er.Error.Message != "the heartbeat is invalid" {
			t.Errorf("%v: %d %s", tc.ps, rr.Code, rr.Body)
		}
		if len(er.Problems) != len(tc.ps) {
			t.Fatalf("%v: %d problems in %s", tc.ps, len(er.Problems), rr.Body)
		}
		for i, p := range er.Problems {
			want := Problem{Index: 0, Field: tc.ps[i].Field, Code: tc.ps[i].Code, Message: tc.ps[i].Message}
			if p != want {
				t.Errorf("problem %d: %+v, want %+v", i, p, want)
			}
		}
		if len(tc.ps) == 0 && strings.Contains(rr.Body.String(), `"problems"`) {
			t.Errorf("no problems, yet the member: %s", rr.Body)
		}
	}
}

// TestPanicIsJSON500: a panicking route answers 500 internal and the
// server keeps serving.
func TestPanicIsJSON500(t *testing.T) {
	t.Parallel()
	boom := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom " + secretPassword) })
	e := newEnv(t, envOpts{noBroker: true, prod: producer.New(nil), opts: []Option{WithRoute("GET /boom", boom, false)}})
	resp, body := e.Do(req{Method: http.MethodGet, Path: "/boom"})
	if resp.StatusCode != 500 || decodeErr(t, body).Error.Code != domain.CodeInternal {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if resp, _ := e.Do(req{Method: http.MethodGet, Path: "/healthz"}); resp.StatusCode != 200 {
		t.Fatalf("healthz after panic: %d", resp.StatusCode)
	}
}

// TestPublishFromRoute: a route mounted after New turns its own request
// into an event and publishes it through the server's pipeline.
func TestPublishFromRoute(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithClock(func() time.Time { return fixedNow })}})
	err := e.srv.Handle("POST /v1/workers/heartbeat", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var hb domain.WorkerHeartbeat
		if err := DecodeJSON(w, r, 4096, &hb); err != nil {
			WriteDomainError(w, err)
			return
		}
		e.srv.Publish(w, r, domain.Event{Type: domain.TypeWorkerHeartbeat, Source: "/v1/workers/heartbeat", Data: &hb})
	}), true)
	if err != nil {
		t.Fatal(err)
	}
	wid := newUUID()
	resp, body := e.Do(req{Path: "/v1/workers/heartbeat", ContentType: "application/json",
		Body: []byte(`{"worker_id":"` + wid + `","tier":"dedicated","egress":"cold_smtp","address":"10.0.0.1:25"}`)})
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	er := decodeErr(t, body)
	if len(er.Problems) != 1 || er.Problems[0].Field != "data.tier" || er.Problems[0].Code != domain.CodeTierNotAllowed {
		t.Fatalf("body %s", body)
	}
	e.assertNothingProduced()

	resp, body = e.Do(req{Path: "/v1/workers/heartbeat", ContentType: "application/json",
		Body: []byte(`{"worker_id":"` + wid + `","tier":"shared_free","egress":"cold_smtp","address":"10.0.0.1:25"}`)})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	rc := decodeAccepted(t, body).Events[0]
	got, err := topics.Decode(e.brk.Fetch(rc.Topic, rc.Partition, rc.Offset))
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != rc.ID || got.Subject != wid || !got.Time.Equal(fixedNow) || got.Source != "/v1/workers/heartbeat" {
		t.Errorf("published %+v", got)
	}
}
