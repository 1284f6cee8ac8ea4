package console_test

import (
	"context"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/apitest"
	"github.com/mailplane/mailplane/internal/console"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/query"
)

const (
	unitOps    = "unit-ops-token-0123456789"
	unitReader = "unit-reader-token-0123456789"
	unitOther  = "unit-workers-token-0123456789"
)

// clock is a settable clock for session expiry.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// unit serves the console on an api.Server over an empty migrated schema
// (the real read model), with one ops caller and one without ops, and a
// DLQ holding entries whose headers and error text are hostile.
func unit(t *testing.T) (*httptest.Server, *clock, *prometheus.Registry) {
	t.Helper()
	return unitWith(t, nil)
}

// unitWith is unit with a console that redrives through redrive.
func unitWith(t *testing.T, redrive console.Redriver) (*httptest.Server, *clock, *prometheus.Registry) {
	t.Helper()
	return unitConfig(t, func(c *console.Config) { c.Redrive = redrive })
}

// unitConfig is unit with the console's configuration changed by set.
func unitConfig(t *testing.T, set func(*console.Config)) (*httptest.Server, *clock, *prometheus.Registry) {
	t.Helper()
	return unitConfigAPI(t, set)
}

// unitConfigAPI is unitConfig with options for the api server.
func unitConfigAPI(t *testing.T, set func(*console.Config), apiOpts ...api.Option) (*httptest.Server, *clock, *prometheus.Registry) {
	t.Helper()
	db := pgtest.New(t)
	if err := migrations.Apply(t.Context(), db.Pool); err != nil {
		t.Fatal(err)
	}
	auth, err := access.FromBytes([]byte(
		access.Line("ops-person", unitOps, []string{domain.ScopeOps}, "/ops") + "\n" +
			access.Line("product", unitReader, []string{domain.ScopeFleetRead, domain.ScopePublishPublic}, "/product") + "\n" +
			access.Line("assignments", unitOther, []string{domain.ScopeWorkersRead, domain.ScopeAuditRead}, "/w") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	entries := []dlq.Entry{{
		Partition: 0, Offset: 7, Time: clk.t, SourceTopic: "mailplane.mailbox.events.v1", Consumer: "registry",
		ErrorCode: "missing_header", Error: `<img src=x onerror=alert(1)>`, Attempts: 1,
		ValueWithheld: dlq.WithheldPossibleSecret,
		Key:           []byte(`"><script>alert(3)</script>`),
		Headers:       []kgo.RecordHeader{{Key: "x-evil<b>", Value: []byte(`<script>alert("dlq")</script>`)}},
	}, {
		Partition: 0, Offset: 8, Time: clk.t, SourceTopic: "mailplane.user.events.v1", Consumer: "health",
		ErrorCode: "invalid", Error: "bad", Value: []byte(`{"html":"</pre><script>alert(4)</script>"}`),
	}}
	reader := query.NewReader(db.Pool, 4)
	reg := prometheus.NewRegistry()
	srv, err := api.New(apitest.NopProducer{}, append([]api.Option{api.WithAuthenticator(auth)}, apiOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := query.Register(srv, reader, nil); err != nil {
		t.Fatal(err)
	}
	cfg := console.Config{
		Auth: auth, Facts: reader, Consumers: query.NewConsumerReader(db.Pool, nil, nil),
		DLQ: func(context.Context, int) ([]dlq.Entry, error) { return entries, nil },
		Now: clk.now, SessionTTL: time.Hour, Registerer: reg,
	}
	set(&cfg)
	if err := console.Register(srv, cfg); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts, clk, reg
}

// logins reads mailplane_console_logins_total{result}.
func logins(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	return mailplanetest.Metric(t, reg, "mailplane_console_logins_total", "result", result)
}

// browserish is a client that keeps cookies, does not follow redirects
// and sends what a same-origin form post from the console sends.
func browserish(t *testing.T) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// fetch sends a request as the console's pages do: a form post when form
// is given; it returns the answer and its body.
func fetch(t *testing.T, cl *http.Client, method, u string, form url.Values, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	body := strings.NewReader("")
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(t.Context(), method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, b := (&apitest.Client{T: t, HTTP: cl}).Send(req)
	return resp, string(b)
}

// login loads the form and posts token from the same origin; it returns
// the answer to the post.
func login(t *testing.T, ts *httptest.Server, cl *http.Client, token string) (*http.Response, string) {
	t.Helper()
	_, page := fetch(t, cl, "GET", ts.URL+"/console/login", nil, nil)
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF field on the login form:\n%s", page)
	}
	return fetch(t, cl, "POST", ts.URL+"/console/login", url.Values{"csrf": {m[1]}, "token": {token}},
		map[string]string{"Origin": ts.URL, "Sec-Fetch-Site": "same-origin"})
}

func TestConsoleLoginAndSessionCookie(t *testing.T) {
	t.Parallel()
	ts, _, _ := unit(t)
	cl := browserish(t)
	resp, _ := login(t, ts, cl, unitOps)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/" {
		t.Fatalf("login: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	var sess *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "mailplane_console" {
			sess = c
		}
	}
	if sess == nil || !sess.HttpOnly || sess.SameSite != http.SameSiteStrictMode || sess.MaxAge != 3600 || sess.Path != "/console/" {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Max-Age 3600, Path /console/", sess)
	}
	if strings.Contains(sess.Value, unitOps) || len(sess.Value) < 40 {
		t.Errorf("the cookie %q is not opaque", sess.Value)
	}
	resp, page := fetch(t, cl, "GET", ts.URL+"/console/", nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, `id="workers"`) || !strings.Contains(page, "ops-person") {
		t.Fatalf("fleet page after login: %d\n%s", resp.StatusCode, page)
	}
	csp := resp.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "script-src") || strings.Contains(csp, "unsafe") {
		t.Errorf("CSP %q: want no script source at all", csp)
	}
	if resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Error("the console may be framed")
	}
	if resp, _ := fetch(t, cl, "GET", ts.URL+"/console", nil, nil); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/" {
		t.Errorf("GET /console: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	// The stylesheet is what the CSP allows as style: served from here.
	if resp, css := fetch(t, cl, "GET", ts.URL+"/console/static/console.css", nil, nil); resp.StatusCode != http.StatusOK ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/css") || !strings.Contains(css, "body") {
		t.Errorf("stylesheet: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

func TestConsoleSecureCookieOverTLS(t *testing.T) {
	t.Parallel()
	ts, _, _ := unit(t)
	cl := browserish(t)
	_, page := fetch(t, cl, "GET", ts.URL+"/console/login", nil, map[string]string{"X-Forwarded-Proto": "https"})
	m := csrfField.FindStringSubmatch(page)
	resp, _ := fetch(t, cl, "POST", ts.URL+"/console/login", url.Values{"csrf": {m[1]}, "token": {unitOps}},
		map[string]string{"Origin": ts.URL, "X-Forwarded-Proto": "https"})
	for _, c := range resp.Cookies() {
		if c.Name == "mailplane_console" && !c.Secure {
			t.Errorf("session cookie over TLS is not Secure: %+v", c)
		}
	}
}

// Refused: no session, no token, a token without ops, a forged or
// expired cookie.
func TestConsoleRefusesWithoutOps(t *testing.T) {
	t.Parallel()
	ts, clk, reg := unit(t)
	pages := []string{"/console/", "/console/consumers", "/console/dlq", "/console/dlq/0/7",
		"/console/mailboxes/0190a5b2-4c5e-7b1a-9c3d-00000000c001", "/console/orgs/0190a5b2-4c5e-7b1a-9c3d-00000000a001"}
	sentToLogin := func(what string, cl *http.Client) {
		t.Helper()
		for _, p := range pages {
			resp, page := fetch(t, cl, "GET", ts.URL+p, nil, nil)
			if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/login" {
				t.Errorf("%s: GET %s: %d to %q, want 303 to the login form", what, p, resp.StatusCode, resp.Header.Get("Location"))
			}
			if strings.Contains(page, "registry") || strings.Contains(page, "workers") {
				t.Errorf("%s: GET %s shows content", what, p)
			}
		}
	}
	sentToLogin("no session", browserish(t))

	// A bearer token does not open the console (it is cookie-only), nor
	// does an unknown token or one without ops at the form.
	bearer := browserish(t)
	resp, _ := fetch(t, bearer, "GET", ts.URL+"/console/", nil, map[string]string{"Authorization": "Bearer " + unitOps})
	if resp.StatusCode != http.StatusSeeOther {
		t.Errorf("bearer token on the console: %d", resp.StatusCode)
	}
	for _, tc := range []struct {
		token  string
		status int
		says   string
	}{
		{"", http.StatusUnauthorized, "not a token"},
		{"no-such-token", http.StatusUnauthorized, "not valid"},
		{unitReader, http.StatusForbidden, "ops scope"},
		{unitOther, http.StatusForbidden, "ops scope"},
		{unitOps + "\x1b[2J", http.StatusUnauthorized, "not a token"},
		{strings.Repeat("a", 600), http.StatusUnauthorized, "not a token"},
	} {
		cl := browserish(t)
		resp, page := login(t, ts, cl, tc.token)
		if resp.StatusCode != tc.status || !strings.Contains(page, tc.says) {
			t.Errorf("login with %.20q: %d, want %d saying %q", tc.token, resp.StatusCode, tc.status, tc.says)
		}
		for _, c := range resp.Cookies() {
			if c.Name == "mailplane_console" && c.Value != "" {
				t.Errorf("login with %.20q set a session", tc.token)
			}
		}
		sentToLogin("refused login", cl)
	}

	if ok, bad, no := logins(t, reg, "ok"), logins(t, reg, "invalid"), logins(t, reg, "forbidden"); ok != 0 || bad != 4 || no != 2 {
		t.Errorf("logins: ok %v, invalid %v, forbidden %v; want 0, 4, 2", ok, bad, no)
	}

	// A forged cookie is no session.
	forged := browserish(t)
	u, _ := url.Parse(ts.URL + "/console/")
	forged.Jar.SetCookies(u, []*http.Cookie{{Name: "mailplane_console", Value: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", Path: "/console/"}})
	sentToLogin("forged cookie", forged)

	// A session expires.
	cl := browserish(t)
	login(t, ts, cl, unitOps)
	if resp, _ := fetch(t, cl, "GET", ts.URL+"/console/", nil, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("fresh session: %d", resp.StatusCode)
	}
	clk.add(time.Hour)
	sentToLogin("expired session", cl)
}

// Refused: cross-site posts, posts without the form's CSRF token.
func TestConsoleRefusesCrossSitePosts(t *testing.T) {
	t.Parallel()
	ts, _, reg := unit(t)
	cl := browserish(t)
	_, page := fetch(t, cl, "GET", ts.URL+"/console/login", nil, nil)
	tok := csrfField.FindStringSubmatch(page)[1]
	for _, tc := range []struct {
		what string
		form url.Values
		hdr  map[string]string
	}{
		{"cross-site fetch metadata", url.Values{"csrf": {tok}, "token": {unitOps}}, map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": ts.URL}},
		{"foreign origin", url.Values{"csrf": {tok}, "token": {unitOps}}, map[string]string{"Origin": "https://evil.example"}},
		{"no origin at all", url.Values{"csrf": {tok}, "token": {unitOps}}, nil},
		{"null origin", url.Values{"csrf": {tok}, "token": {unitOps}}, map[string]string{"Origin": "null"}},
		{"no CSRF token", url.Values{"token": {unitOps}}, map[string]string{"Origin": ts.URL}},
		{"wrong CSRF token", url.Values{"csrf": {"x" + tok}, "token": {unitOps}}, map[string]string{"Origin": ts.URL}},
	} {
		resp, _ := fetch(t, cl, "POST", ts.URL+"/console/login", tc.form, tc.hdr)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("login, %s: %d, want 403", tc.what, resp.StatusCode)
		}
		for _, c := range resp.Cookies() {
			if c.Name == "mailplane_console" && c.Value != "" {
				t.Errorf("login, %s: a session was set", tc.what)
			}
		}
	}

	if n := logins(t, reg, "refused"); n != 6 {
		t.Errorf("mailplane_console_logins_total{result=\"refused\"} = %v, want 6", n)
	}

	// Logout needs the session's own CSRF token, from the same origin.
	login(t, ts, cl, unitOps)
	_, page = fetch(t, cl, "GET", ts.URL+"/console/", nil, nil)
	sessTok := csrfField.FindStringSubmatch(page)[1]
	for _, tc := range []struct {
		what string
		form url.Values
		hdr  map[string]string
	}{
		{"foreign origin", url.Values{"csrf": {sessTok}}, map[string]string{"Origin": "https://evil.example"}},
		{"login form's token", url.Values{"csrf": {tok}}, map[string]string{"Origin": ts.URL}},
		{"no token", url.Values{}, map[string]string{"Origin": ts.URL}},
	} {
		if resp, _ := fetch(t, cl, "POST", ts.URL+"/console/logout", tc.form, tc.hdr); resp.StatusCode != http.StatusForbidden {
			t.Errorf("logout, %s: %d, want 403", tc.what, resp.StatusCode)
		}
	}
	if resp, _ := fetch(t, cl, "GET", ts.URL+"/console/", nil, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("a refused logout ended the session: %d", resp.StatusCode)
	}
	resp, _ := fetch(t, cl, "POST", ts.URL+"/console/logout", url.Values{"csrf": {sessTok}}, map[string]string{"Origin": ts.URL})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	if resp, _ := fetch(t, cl, "GET", ts.URL+"/console/", nil, nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("after logout the fleet page answers %d", resp.StatusCode)
	}
}

// Refused: script injection through a mailbox id, a DLQ filter, a DLQ
// header, key, error text and value. Everything is text.
func TestConsoleEscapesHostileText(t *testing.T) {
	t.Parallel()
	ts, _, _ := unit(t)
	cl := browserish(t)
	login(t, ts, cl, unitOps)
	for _, tc := range []struct {
		path   string
		status int
	}{
		{"/console/mailboxes/%3Cscript%3Ealert(1)%3C%2Fscript%3E", http.StatusBadRequest},
		{"/console/orgs/%22%3E%3Cscript%3Ealert(1)%3C%2Fscript%3E", http.StatusBadRequest},
		{"/console/mailboxes?id=%3Cscript%3Ealert(1)%3C/script%3E", http.StatusBadRequest},
		{"/console/dlq?consumer=%3Cscript%3Ealert(1)%3C/script%3E", http.StatusOK},
		{"/console/dlq?code=%1b%5b2J", http.StatusBadRequest},
		{"/console/dlq", http.StatusOK},
		{"/console/dlq/0/7", http.StatusOK},
		{"/console/dlq/0/8", http.StatusOK},
		{"/console/dlq/0/-1", http.StatusBadRequest},
		{"/console/dlq/0/99", http.StatusNotFound},
		{"/console/mailboxes/0190a5b2-4c5e-7b1a-9c3d-0000000000ff", http.StatusNotFound},
	} {
		resp, page := fetch(t, cl, "GET", ts.URL+tc.path, nil, nil)
		if resp.StatusCode != tc.status {
			t.Errorf("GET %s: %d, want %d", tc.path, resp.StatusCode, tc.status)
		}
		if strings.Contains(strings.ToLower(page), "<script") || strings.Contains(page, "<img") || strings.Contains(page, "<b>") {
			t.Errorf("GET %s: markup from input reached the page:\n%s", tc.path, page)
		}
	}
	_, page := fetch(t, cl, "GET", ts.URL+"/console/dlq/0/7", nil, nil)
	for _, want := range []string{"withheld: possible_secret", "x-evil&lt;b&gt;", "&lt;script&gt;alert(&#34;dlq&#34;)&lt;/script&gt;", `id="redrive"`} {
		if !strings.Contains(page, want) {
			t.Errorf("dead letter 0/7 does not show %q", want)
		}
	}
	_, page = fetch(t, cl, "GET", ts.URL+"/console/dlq/0/8", nil, nil)
	if !strings.Contains(page, "&lt;/pre&gt;&lt;script&gt;") {
		t.Errorf("dead letter 0/8's value is not shown as text:\n%s", page)
	}
}

// The query API: fleet:read or ops, ids checked, unknown ids not_found.
func TestQueryAPIScopesAndIDs(t *testing.T) {
	t.Parallel()
	ts, _, _ := unit(t)
	cl := &http.Client{Timeout: 10 * time.Second}
	for _, tc := range []struct {
		path, token string
		status      int
		code        string
	}{
		{"/v1/workers", unitReader, 200, ""},
		{"/v1/workers", unitOps, 200, ""},
		{"/v1/workers", "", 401, "unauthorized"},
		{"/v1/workers", unitOther, 403, "forbidden"},
		{"/v1/mailboxes/0190a5b2-4c5e-7b1a-9c3d-0000000000ff", unitOther, 403, "forbidden"},
		{"/v1/orgs/0190a5b2-4c5e-7b1a-9c3d-0000000000ff", unitOther, 403, "forbidden"},
		{"/v1/mailboxes/0190a5b2-4c5e-7b1a-9c3d-0000000000ff", unitReader, 404, "not_found"},
		{"/v1/orgs/0190a5b2-4c5e-7b1a-9c3d-0000000000ff", unitOps, 404, "not_found"},
		{"/v1/mailboxes/0190A5B2-4C5E-7B1A-9C3D-0000000000FF", unitReader, 400, "invalid"},
		{"/v1/mailboxes/%00%1b", unitReader, 400, "invalid"},
		{"/v1/orgs/" + strings.Repeat("a", 5000), unitReader, 400, "invalid"},
	} {
		resp, body := fetch(t, cl, "GET", ts.URL+tc.path, nil, map[string]string{"Authorization": "Bearer " + tc.token})
		if resp.StatusCode != tc.status || (tc.code != "" && !strings.Contains(body, `"code":"`+tc.code+`"`)) {
			t.Errorf("GET %.60s: %d %s, want %d %s", tc.path, resp.StatusCode, body, tc.status, tc.code)
		}
	}
}

// TestConsoleRedrive: the DLQ entry page's button redrives that one dead
// letter to its consumer as the logged-in operator, with the form's
// options, and shows what the redrive did; a withheld value offers no
// button; a post without the session's CSRF token, from another site or
// without a session redrives nothing; a console without a redriver says
// to use the CLI.
func TestConsoleRedrive(t *testing.T) {
	t.Parallel()
	type call struct {
		caller string
		sel    dlq.Selection
	}
	var mu sync.Mutex
	var calls []call
	ts, _, _ := unitWith(t, func(_ context.Context, caller *domain.Caller, sel dlq.Selection) (dlq.Report, error) {
		mu.Lock()
		calls = append(calls, call{caller.Name, sel})
		mu.Unlock()
		return dlq.Report{RedriveID: "0190a5b2-4c5e-7b1a-9c3d-0000000000r1", Items: []dlq.Item{{Outcome: dlq.OutcomeRedriven, Offset: 42}}}, nil
	})
	called := func() int { mu.Lock(); defer mu.Unlock(); return len(calls) }
	cl := browserish(t)
	if resp, _ := login(t, ts, cl, unitOps); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	same := map[string]string{"Origin": ts.URL, "Sec-Fetch-Site": "same-origin"}

	_, withheld := fetch(t, cl, "GET", ts.URL+"/console/dlq/0/7", nil, nil)
	if strings.Contains(withheld, `id="redrive-button"`) || !strings.Contains(withheld, "cannot be redriven") {
		t.Fatalf("a withheld dead letter offers a redrive:\n%s", withheld)
	}
	_, page := fetch(t, cl, "GET", ts.URL+"/console/dlq/0/8", nil, nil)
	m := csrfField.FindStringSubmatch(page)
	if m == nil || !strings.Contains(page, `id="redrive-button"`) || !strings.Contains(page, `action="/console/dlq/0/8/redrive"`) {
		t.Fatalf("no redrive form on the entry page:\n%s", page)
	}
	csrf := m[1]
	post := func(cl *http.Client, form url.Values, hdr map[string]string) (*http.Response, string) {
		return fetch(t, cl, "POST", ts.URL+"/console/dlq/0/8/redrive", form, hdr)
	}
	for name, tc := range map[string]struct {
		cl   *http.Client
		form url.Values
		hdr  map[string]string
	}{
		"no csrf":      {cl, url.Values{}, same},
		"wrong csrf":   {cl, url.Values{"csrf": {"x" + csrf}}, same},
		"cross-site":   {cl, url.Values{"csrf": {csrf}}, map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}},
		"no session":   {browserish(t), url.Values{"csrf": {csrf}}, same},
		"bad location": {cl, url.Values{"csrf": {csrf}}, same},
	} {
		u := "/console/dlq/0/8/redrive"
		if name == "bad location" {
			u = "/console/dlq/0/-1/redrive"
		}
		resp, _ := fetch(t, tc.cl, "POST", ts.URL+u, tc.form, tc.hdr)
		if resp.StatusCode < 400 || called() != 0 {
			t.Fatalf("%s: %d, %d redrives", name, resp.StatusCode, called())
		}
	}

	resp, body := post(cl, url.Values{"csrf": {csrf}, "out_of_order": {"on"}}, same)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="redrive-report"`) || !strings.Contains(body, "redriven, appended at offset 42") {
		t.Fatalf("redrive: %d\n%s", resp.StatusCode, body)
	}
	mu.Lock()
	got := calls
	mu.Unlock()
	if len(got) != 1 {
		t.Fatalf("%d redrives, want 1", len(got))
	}
	c := got[0]
	if c.caller != "ops-person" || c.sel.Consumer != "health" || c.sel.FromOffset == nil || *c.sel.FromOffset != 8 ||
		c.sel.ToOffset == nil || *c.sel.ToOffset != 8 || !c.sel.OutOfOrder || c.sel.Again || c.sel.DryRun {
		t.Fatalf("redrive call %+v (from %v to %v)", c, c.sel.FromOffset, c.sel.ToOffset)
	}

	// A console without a redriver points to the CLI.
	plain, _, _ := unit(t)
	pc := browserish(t)
	login(t, plain, pc, unitOps)
	if _, page := fetch(t, pc, "GET", plain.URL+"/console/dlq/0/8", nil, nil); strings.Contains(page, `id="redrive-button"`) || !strings.Contains(page, "does not redrive") {
		t.Fatalf("a console without a redriver:\n%s", page)
	}
}
