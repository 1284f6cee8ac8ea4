package billing_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/billing"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/producer"
)

// TestWebhookScreenedBeforeItsBody: a delivery without a usable
// Stripe-Signature header (none, or one outside the tolerance) is refused
// 400 invalid_signature at once, before a byte of its body is read and
// without taking budget, however slow its body; a fresh well-formed one
// takes the billing class's budget, at most the route's 256 KiB cap for a
// chunked body, and one declared over the cap is refused 413.
func TestWebhookScreenedBeforeItsBody(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	srv, err := api.New(producer.New(nil), api.WithAuthenticator(apiAuth(t)), api.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	// Nothing here reaches the database: no delivery is verified.
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := billing.Register(srv, testConfig(), billing.WithClock(func() time.Time { return now }), billing.WithDatabase(pool)); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	addr := ts.Listener.Addr().String()
	held := func() float64 {
		return mailplanetest.Metric(t, reg, "mailplane_http_inflight_body_bytes", "class", string(api.ClassBilling))
	}
	send := func(headers, first string) (net.Conn, *bufio.Reader) {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		fmt.Fprintf(conn, "POST /v1/webhooks/billing HTTP/1.1\r\nHost: mailplane\r\nContent-Type: application/json\r\n%s\r\n%s", headers, first)
		return conn, bufio.NewReader(conn)
	}
	answer := func(conn net.Conn, br *bufio.Reader) (int, api.ErrorResponse) {
		t.Helper()
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		var er api.ErrorResponse
		if err := json.NewDecoder(resp.Body).Decode(&er); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, er
	}
	sig := func(at time.Time) string {
		return billing.SignatureHeader + ": t=" + fmt.Sprint(at.Unix()) + ",v1=" + strings.Repeat("ab", 32) + "\r\n"
	}

	const chunk = "1\r\n{\r\n"
	for name, headers := range map[string]string{
		"no signature header": "Content-Length: 100000\r\n",
		"a stale timestamp":   sig(now.Add(-time.Hour)) + "Transfer-Encoding: chunked\r\n",
		"no v1 signature":     billing.SignatureHeader + ": t=" + fmt.Sprint(now.Unix()) + "\r\nContent-Length: 100000\r\n",
	} {
		first := "{"
		if strings.Contains(headers, "chunked") {
			first = chunk
		}
		status, er := answer(send(headers, first))
		if status != http.StatusBadRequest || er.Error.Code != billing.CodeInvalidSignature {
			t.Fatalf("%s: %d %+v", name, status, er)
		}
		if h := held(); h != 0 {
			t.Fatalf("%s: %v billing bytes held", name, h)
		}
	}
	status, er := answer(send(sig(now)+"Content-Length: 300000\r\n", "{"))
	if status != http.StatusRequestEntityTooLarge || er.Error.Code != "too_large" {
		t.Fatalf("declared over the cap: %d %+v", status, er)
	}
	send(sig(now)+"Transfer-Encoding: chunked\r\n", chunk)
	deadline := time.Now().Add(time.Minute)
	for held() != billing.DefaultMaxBodyBytes {
		if time.Now().After(deadline) {
			t.Fatalf("a fresh chunked delivery holds %v billing bytes, want the cap %d", held(), billing.DefaultMaxBodyBytes)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
