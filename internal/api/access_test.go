package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/mailplanetest"
)

// TestProducerTokenCannotPublishInternalTypes: a caller holding
// publish:public is refused (403 forbidden, naming the scope) for every
// internal type, alone or hidden in a batch of allowed events, and nothing
// reaches the log.
func TestProducerTokenCannotPublishInternalTypes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	internal := map[string]map[string]any{
		"publish:mailbox.health_scored":   healthScored(),
		"publish:org.plan_changed":        planChanged(),
		"publish:mailbox.disabled":        mailboxDisabled(),
		"publish:mailbox.warmup_observed": warmupObserved(),
		"publish:worker.heartbeat":        heartbeat(),
		"publish:worker.health_sampled":   healthSampled(),
	}
	for scope, ev := range internal {
		resp, body := e.Do(req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(t, ev), Token: tokenB})
		er := decodeErr(t, body)
		if resp.StatusCode != http.StatusForbidden || er.Error.Code != domain.CodeForbidden {
			t.Errorf("%s: %d %s", scope, resp.StatusCode, body)
			continue
		}
		if len(er.Problems) != 1 || !strings.Contains(er.Problems[0].Message, scope) {
			t.Errorf("%s: the refusal does not name the scope: %s", scope, body)
		}
		// The same event in a batch with allowed ones: refused whole.
		resp, body = e.postBatchAs(tokenB, userActive(), ev, mailboxRemoved())
		if er := decodeErr(t, body); resp.StatusCode != http.StatusForbidden || er.Error.Code != domain.CodeForbidden ||
			len(er.Problems) != 1 || er.Problems[0].Index != 1 {
			t.Errorf("%s in a batch: %d %s", scope, resp.StatusCode, body)
		}
	}
	// Binary mode too.
	hb := heartbeat()
	h := binaryHeadersOf(hb)
	h["Authorization"] = "Bearer " + tokenB
	resp, body := e.Do(req{ContentType: ContentTypeBinary, Body: mailplanetest.MustJSON(t, hb["data"]), NoAuth: true, Headers: h})
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("binary heartbeat: %d %s", resp.StatusCode, body)
	}
	e.assertNothingProduced()
	if m := e.metricsText(); !strings.Contains(m, `mailplane_ingest_forbidden_total{caller="product",code="forbidden"} 13`) {
		t.Errorf("forbidden requests not counted per caller")
	}
	// Positive control: the same caller publishes a public type.
	if resp, body := e.Do(req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(t, userActive()), Token: tokenB}); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("public type: %d %s", resp.StatusCode, body)
	}
}

// TestSourceSpoofingRefused: a caller may only speak as its own source (or
// a path below it); another source is 403 source_forbidden, in any mode,
// and nothing reaches the log.
func TestSourceSpoofingRefused(t *testing.T) {
	t.Parallel()
	const tokenProduct = "tok-product-api-5e6f7a8b9c0d1e2f3a4b"
	auth, err := access.FromBytes([]byte(
		access.Line("product", tokenB, []string{domain.ScopePublishPublic}, "urn:mailplane:test") + "\n" +
			access.Line("product-api", tokenProduct, []string{domain.ScopePublishPublic}, "/product-api") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOpts{opts: []Option{WithAuthenticator(auth)}})
	for _, c := range []struct{ token, src string }{
		{tokenB, "/billing"}, {tokenB, "mailplane/health"}, {tokenB, "urn:mailplane:test2"},
		{tokenB, "urn:mailplane:tes"}, {tokenB, "urn:mailplane"},
		// Below the caller's source by string prefix only: dot segments
		// (raw or percent-encoded), empty segments, a sibling with a longer
		// name.
		{tokenB, "urn:mailplane:test/../../billing"},
		{tokenB, "urn:mailplane:test/%2e%2e/%2E%2E/billing"},
		{tokenB, "urn:mailplane:test//billing"},
		{tokenProduct, "/product-api/../../billing"},
		{tokenProduct, "/product-api/%2e%2e/%2e%2e/billing"},
		{tokenProduct, "/product-api/x%2f..%2f..%2fbilling"},
		{tokenProduct, "/product-api/./../billing"},
		{tokenProduct, "/product-api//billing"},
		{tokenProduct, "/product-api-evil"},
		{tokenProduct, "/product-api-evil/sessions"},
	} {
		src := c.src
		ev := with(userActive(), "source", src)
		resp, body := e.Do(req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(t, ev), Token: c.token})
		if er := decodeErr(t, body); resp.StatusCode != http.StatusForbidden || er.Error.Code != domain.CodeSourceForbidden {
			t.Errorf("structured %q: %d %s", src, resp.StatusCode, body)
		}
		h := binaryHeadersOf(ev)
		h["Authorization"] = "Bearer " + c.token
		resp, body = e.Do(req{ContentType: ContentTypeBinary, Body: mailplanetest.MustJSON(t, ev["data"]), NoAuth: true, Headers: h})
		if er := decodeErr(t, body); resp.StatusCode != http.StatusForbidden || er.Error.Code != domain.CodeSourceForbidden {
			t.Errorf("binary %q: %d %s", src, resp.StatusCode, body)
		}
		resp, body = e.postBatchAs(c.token, userActive(), ev)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("batch %q: %d %s", src, resp.StatusCode, body)
		}
	}
	e.assertNothingProduced()
	// A path below the caller's source is its own.
	for _, c := range []struct{ token, src string }{
		{tokenB, "urn:mailplane:test/sessions"},
		{tokenProduct, "/product-api"},
		{tokenProduct, "/product-api/sessions/v2"},
	} {
		ok := with(userActive(), "source", c.src)
		if resp, body := e.Do(req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(t, ok), Token: c.token}); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("own sub-source %q: %d %s", c.src, resp.StatusCode, body)
		}
	}
}

// TestPublicHealthHasNoErrorText: the public /healthz says which check is
// unavailable, never why; the ops handler's detailed one does.
func TestPublicHealthHasNoErrorText(t *testing.T) {
	t.Parallel()
	const secret = "dial tcp 10.9.8.7:5432: password authentication failed for user mailplane_rw"
	e := newEnv(t, envOpts{opts: []Option{WithDatabaseCheck(func(context.Context) error { return errors.New(secret) })}})
	resp, body := e.Do(req{Method: http.MethodGet, Path: "/healthz", NoAuth: true})
	if resp.StatusCode != http.StatusServiceUnavailable ||
		string(body) != `{"status":"unavailable","checks":{"broker":"ok","database":"unavailable"}}`+"\n" {
		t.Fatalf("public healthz: %d %s", resp.StatusCode, body)
	}
	for _, leak := range []string{"10.9.8.7", "password", "mailplane_rw", "latency"} {
		if strings.Contains(string(body), leak) {
			t.Errorf("public healthz carries %q", leak)
		}
	}
	if resp, _ := e.Do(req{Method: http.MethodGet, Path: "/metrics", NoAuth: true}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("public /metrics: %d, want 404", resp.StatusCode)
	}
	rr := httptest.NewRecorder()
	e.srv.OpsHandler().ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rr.Code != http.StatusServiceUnavailable || !strings.Contains(rr.Body.String(), "password authentication failed") {
		t.Fatalf("ops healthz: %d %s", rr.Code, rr.Body)
	}
}

// TestInflightBodyCap: while one request holds most of the in-flight cap
// with a body it is slow to send, another is refused with 503 unavailable
// and Retry-After before its body is read; nothing reaches the log; once
// the first is gone, requests are served again.
func TestInflightBodyCap(t *testing.T) {
	t.Parallel()
	// The slow body is never cut by the minimum rate here (its own test).
	e := newEnv(t, envOpts{opts: []Option{WithMaxInflightBytes(4096), WithBodyRate(BodyRate{Min: 1, Grace: time.Hour})}})
	pr, pw := io.Pipe()
	slow, err := http.NewRequest(http.MethodPost, e.Base+"/v1/events", pr)
	if err != nil {
		t.Fatal(err)
	}
	slow.ContentLength = 4000
	slow.Header.Set("Content-Type", ContentTypeStructured)
	slow.Header.Set("Authorization", "Bearer "+tokenA)
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := e.HTTP.Do(slow)
		if err == nil {
			resp.Body.Close()
		}
	}()
	if _, err := pw.Write([]byte(`{"specversion":`)); err != nil {
		t.Fatal(err)
	}
	e.waitMetric(`mailplane_http_inflight_body_bytes{class="producer"} 4000`)

	resp, body := e.postStructured(userActive())
	if er := decodeErr(t, body); resp.StatusCode != http.StatusServiceUnavailable || er.Error.Code != domain.CodeUnavailable ||
		resp.Header.Get("Retry-After") == "" {
		t.Fatalf("over the cap: %d %s", resp.StatusCode, body)
	}
	_ = pw.CloseWithError(errors.New("client gave up"))
	<-done
	e.assertNothingProduced()
	e.waitMetric(`mailplane_http_inflight_body_bytes{class="producer"} 0`)
	if resp, body := e.postStructured(userActive()); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("after the slow request: %d %s", resp.StatusCode, body)
	}
	if m := e.metricsText(); !strings.Contains(m, `mailplane_http_shed_total{class="producer"} 1`) {
		t.Errorf("shed request not counted")
	}
}

func (e *env) postBatchAs(token string, evs ...map[string]any) (*http.Response, []byte) {
	return e.Do(req{ContentType: ContentTypeBatch, Body: mailplanetest.MustJSON(e.t, evs), Token: token})
}

// waitMetric waits until the ops metrics carry line.
func (e *env) waitMetric(line string) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(e.metricsText(), line) {
		if time.Now().After(deadline) {
			e.t.Fatalf("metrics never showed %s", line)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTokensFileReloadedWithoutRestart: a running server takes a caller
// added to its tokens file and refuses one revoked from it, with no
// restart; the revoked token's request reaches nothing.
func TestTokensFileReloadedWithoutRestart(t *testing.T) {
	t.Parallel()
	const tokenC = "tok-c-added-later-0b1c2d3e4f5a6b7c8d9e"
	path := filepath.Join(t.TempDir(), "tokens")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	writeFile := func(content string, at time.Time) {
		t.Helper()
		// Replaced atomically, as operators are told to.
		if err := os.WriteFile(path+".new", []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path+".new", at, at); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	product := access.Line("product", tokenB, []string{domain.ScopePublishPublic}, "urn:mailplane:test") + "\n"
	writeFile(product, t0)
	auth, err := access.New(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go auth.Watch(ctx, 10*time.Millisecond)
	e := newEnv(t, envOpts{opts: []Option{WithAuthenticator(auth)}})
	post := func(tok string) int {
		resp, _ := e.Do(req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(t, userActive()), Token: tok})
		return resp.StatusCode
	}
	if code := post(tokenC); code != http.StatusUnauthorized {
		t.Fatalf("before it was added: %d", code)
	}
	e.assertNothingProduced()

	writeFile(product+access.Line("later", tokenC, []string{domain.ScopePublishPublic}, "urn:mailplane:test")+"\n", t0.Add(time.Second))
	waitCond(t, "the added caller accepted", func() bool { _, ok := auth.Authenticate(tokenC); return ok })
	if code := post(tokenC); code != http.StatusAccepted {
		t.Fatalf("added: %d", code)
	}

	writeFile(product, t0.Add(2*time.Second))
	waitCond(t, "the revoked caller refused", func() bool { _, ok := auth.Authenticate(tokenC); return !ok })
	e.start = e.watermarks()
	if code := post(tokenC); code != http.StatusUnauthorized {
		t.Fatalf("revoked: %d", code)
	}
	e.assertNothingProduced()
	if code := post(tokenB); code != http.StatusAccepted {
		t.Fatalf("the other caller after the reload: %d", code)
	}
}

func waitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
