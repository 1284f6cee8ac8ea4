package console_test

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/internal/console"
)

// loginFrom posts a login with token, as a browser behind forwarded (an
// X-Forwarded-For value; "" for none).
func loginFrom(t *testing.T, ts *httptest.Server, token, forwarded string) (*http.Response, string) {
	t.Helper()
	cl := browserish(t)
	_, page := fetch(t, cl, "GET", ts.URL+"/console/login", nil, nil)
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF field on the login form:\n%s", page)
	}
	hdr := map[string]string{"Origin": ts.URL, "Sec-Fetch-Site": "same-origin"}
	if forwarded != "" {
		hdr["X-Forwarded-For"] = forwarded
	}
	return fetch(t, cl, "POST", ts.URL+"/console/login", map[string][]string{"csrf": {m[1]}, "token": {token}}, hdr)
}

func assertLimited(t *testing.T, resp *http.Response, page, what string) {
	t.Helper()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "10" || !strings.Contains(page, "rate_limited") {
		t.Fatalf("%s: %d Retry-After %q; want 429 rate_limited, Retry-After 10", what, resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// TestLoginAttemptsLimitedPerAddress: a client address gets its burst of
// login attempts, then 429 rate_limited with Retry-After before its form
// is read (even with the right token), until its bucket refills; an
// X-Forwarded-For it sends changes nothing, since no proxy is trusted.
func TestLoginAttemptsLimitedPerAddress(t *testing.T) {
	t.Parallel()
	ts, clk, reg := unitConfig(t, func(c *console.Config) { c.LoginsPerMinute, c.LoginBurst = 6, 3 })
	for i := range 3 {
		if resp, _ := loginFrom(t, ts, "not-a-token-"+string(rune('a'+i)), ""); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("attempt %d: %d", i, resp.StatusCode)
		}
	}
	resp, page := loginFrom(t, ts, unitOps, "")
	assertLimited(t, resp, page, "the right token past the burst")
	resp, page = loginFrom(t, ts, unitOps, "198.51.100.9")
	assertLimited(t, resp, page, "a forged X-Forwarded-For")
	if got := logins(t, reg, "limited"); got != 2 {
		t.Errorf("limited logins %v, want 2", got)
	}
	if got := logins(t, reg, "ok"); got != 0 {
		t.Errorf("ok logins %v, want 0", got)
	}
	clk.add(10 * time.Second) // one attempt a 10 s
	if resp, _ := loginFrom(t, ts, unitOps, ""); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("after the refill: %d", resp.StatusCode)
	}
	resp, page = loginFrom(t, ts, unitOps, "")
	assertLimited(t, resp, page, "right after")
}

// TestLoginAttemptsBehindATrustedProxy: behind a trusted proxy each client
// has its own bucket (IPv6 per /64), and a client cannot name another
// address by prepending to X-Forwarded-For.
func TestLoginAttemptsBehindATrustedProxy(t *testing.T) {
	t.Parallel()
	ts, _, _ := unitConfig(t, func(c *console.Config) {
		c.LoginsPerMinute, c.LoginBurst = 6, 2
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")}
	})
	for range 2 {
		if resp, _ := loginFrom(t, ts, "wrong-token", "203.0.113.7"); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("203.0.113.7: %d", resp.StatusCode)
		}
	}
	resp, page := loginFrom(t, ts, unitOps, "203.0.113.7, 10.1.2.3")
	assertLimited(t, resp, page, "the client through two trusted proxies")
	resp, page = loginFrom(t, ts, unitOps, "198.51.100.1, 203.0.113.7")
	assertLimited(t, resp, page, "a client naming another address before its own")
	if resp, _ := loginFrom(t, ts, unitOps, "203.0.113.8"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("another client: %d", resp.StatusCode)
	}
	for range 2 {
		if resp, _ := loginFrom(t, ts, "wrong-token", "2001:db8:0:1::1"); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("2001:db8:0:1::1: %d", resp.StatusCode)
		}
	}
	resp, page = loginFrom(t, ts, unitOps, "2001:db8:0:1::ffff")
	assertLimited(t, resp, page, "the same IPv6 /64")
	if resp, _ := loginFrom(t, ts, unitOps, "2001:db8:0:2::1"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("another /64: %d", resp.StatusCode)
	}
}
