package api

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/producer"
)

// slowConn opens a connection to addr (over TLS when cfg is set) and
// sends a POST's headers with the body's first bytes.
func slowConn(t *testing.T, addr string, cfg *tls.Config, path, headers, first string) net.Conn {
	t.Helper()
	var conn net.Conn
	var err error
	if cfg != nil {
		conn, err = tls.Dial("tcp", addr, cfg)
	} else {
		conn, err = net.Dial("tcp", addr)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: mailplane\r\n%s\r\n%s", path, headers, first); err != nil {
		t.Fatal(err)
	}
	return conn
}

// answer reads the response on conn: its headers and its JSON body, not
// waiting for the end of the response (a refused body is drained before
// it ends).
func answer(t *testing.T, conn net.Conn) (*http.Response, string) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	var b json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
		t.Fatalf("answer %d: %v", resp.StatusCode, err)
	}
	return resp, string(b)
}

// trickle writes one byte every interval until the connection fails or
// stop is closed.
func trickle(conn net.Conn, interval time.Duration, stop <-chan struct{}) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if _, err := conn.Write([]byte(" ")); err != nil {
			return
		}
	}
}

func assertCut(t *testing.T, resp *http.Response, body string) {
	t.Helper()
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(body, `"code":"request_timeout"`) || !resp.Close {
		t.Fatalf("slow body: %d close=%v %s; want 408 request_timeout and the connection closed", resp.StatusCode, resp.Close, body)
	}
}

// TestSlowBodyIsCut: a body that stalls, one that trickles below the
// minimum rate, and one that keeps the rate but not its class deadline
// are each cut with 408 request_timeout and the connection closed; the
// reservation is released, nothing reaches the log, and the next request
// is served. Over TLS too: the deadline is the underlying connection's.
func TestSlowBodyIsCut(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{
		WithMaxInflightBytes(4096),
		WithBodyRate(BodyRate{Min: 1000, Grace: 200 * time.Millisecond}),
	}})
	addr := strings.TrimPrefix(e.Base, "http://")
	auth := "Authorization: Bearer " + tokenA + "\r\nContent-Type: " + ContentTypeStructured + "\r\nContent-Length: 4000\r\n"
	stop := make(chan struct{})
	defer close(stop)

	// Stalls after its first bytes.
	conn := slowConn(t, addr, nil, "/v1/events", auth, `{"specversion":`)
	e.waitMetric(`mailplane_http_inflight_body_bytes{class="producer"} 4000`)
	resp, body := answer(t, conn)
	assertCut(t, resp, body)
	e.waitMetric(`mailplane_http_inflight_body_bytes{class="producer"} 0`)

	// Trickles 20 bytes a second.
	conn = slowConn(t, addr, nil, "/v1/events", auth, `{"specversion":`)
	go trickle(conn, 50*time.Millisecond, stop)
	resp, body = answer(t, conn)
	assertCut(t, resp, body)
	e.waitMetric(`mailplane_http_slow_bodies_total{class="producer"} 2`)
	e.waitMetric(`mailplane_http_inflight_body_bytes{class="producer"} 0`)
	e.assertNothingProduced()
	if resp, body := e.postStructured(userActive()); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("after the slow bodies: %d %s", resp.StatusCode, body)
	}

	// The same over TLS (the server's handler behind httptest's TLS
	// listener).
	ts := httptest.NewUnstartedServer(e.srv.Handler())
	ts.StartTLS()
	t.Cleanup(ts.Close)
	cfg := ts.Client().Transport.(*http.Transport).TLSClientConfig
	conn = slowConn(t, ts.Listener.Addr().String(), cfg, "/v1/events", auth, `{"specversion":`)
	go trickle(conn, 50*time.Millisecond, stop)
	resp, body = answer(t, conn)
	assertCut(t, resp, body)
	e.waitMetric(`mailplane_http_inflight_body_bytes{class="producer"} 0`)
}

// TestBodyDeadline: a body that keeps up the minimum rate but is still
// arriving at its class deadline is cut there.
func TestBodyDeadline(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{noBroker: true, prod: producer.New(nil), opts: []Option{
		WithBodyRate(BodyRate{Min: 1, Grace: 50 * time.Millisecond}),
		WithClassLimits(map[Class]ClassLimits{ClassProducer: {Budget: 1 << 20, Deadline: 300 * time.Millisecond}}),
	}})
	addr := strings.TrimPrefix(e.Base, "http://")
	conn := slowConn(t, addr, nil, "/v1/events",
		"Authorization: Bearer "+tokenA+"\r\nContent-Type: "+ContentTypeStructured+"\r\nContent-Length: 100000\r\n", `{"specversion":`)
	stop := make(chan struct{})
	defer close(stop)
	go trickle(conn, 10*time.Millisecond, stop) // 100 bytes a second, 100 times the minimum
	resp, body := answer(t, conn)
	assertCut(t, resp, body)
	e.waitMetric(`mailplane_http_inflight_body_bytes{class="producer"} 0`)
}

// TestNoBudgetBeforeAuthentication: requests without a valid token are
// answered 401 at once, before their body is read (not after net/http
// reads it in search of the next request), and reserve nothing: while 50
// of them hold slow bodies, an authenticated request still gets the
// whole budget.
func TestNoBudgetBeforeAuthentication(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithMaxInflightBytes(4096)}})
	addr := strings.TrimPrefix(e.Base, "http://")
	for i := range 50 {
		token := ""
		if i%2 == 1 {
			token = "Authorization: Bearer not-a-token\r\n"
		}
		conn := slowConn(t, addr, nil, "/v1/events", token+"Content-Type: "+ContentTypeStructured+"\r\nContent-Length: 4000\r\n", `{"spec`)
		resp, body := answer(t, conn)
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, `"code":"unauthorized"`) {
			t.Fatalf("unauthenticated slow body %d: %d %s", i, resp.StatusCode, body)
		}
	}
	// Their bodies are still arriving (the drain of a refused body gives
	// them the grace of the minimum rate).
	if m := e.metricsText(); !strings.Contains(m, `mailplane_http_inflight_body_bytes{class="producer"} 0`) ||
		!strings.Contains(m, `mailplane_http_shed_total{class="producer"} 0`) {
		t.Fatalf("unauthenticated requests took budget:\n%s", m)
	}
	if resp, body := e.postStructured(userActive()); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("authenticated: %d %s", resp.StatusCode, body)
	}
}

// TestRouteBodyCap: a route reads at most its own cap: a body declared
// longer is refused 413 before it is read, one of unknown length is cut
// at the cap, and a body of unknown length reserves the route's cap, not
// the server's 1 MiB.
func TestRouteBodyCap(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{noBroker: true, prod: producer.New(nil), opts: []Option{
		WithClassLimits(map[Class]ClassLimits{ClassAnonymous: {Budget: 150, Deadline: time.Minute}}),
		WithBodyRate(BodyRate{Min: 1, Grace: time.Minute}),
	}})
	err := e.srv.HandleLimited("POST /small", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := ReadBody(w, r, 1<<20); err != nil {
			WriteDomainError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}), false, RouteLimits{MaxBody: 100})
	if err != nil {
		t.Fatal(err)
	}
	if resp, body := e.Do(req{Path: "/small", Body: make([]byte, 101), NoAuth: true}); resp.StatusCode != http.StatusRequestEntityTooLarge ||
		decodeErr(t, body).Error.Code != domain.CodeTooLarge {
		t.Fatalf("declared over the cap: %d %s", resp.StatusCode, body)
	}
	if resp, body := e.Do(req{Path: "/small", Body: make([]byte, 101), Chunked: true, NoAuth: true}); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked over the cap: %d %s", resp.StatusCode, body)
	}
	if resp, body := e.Do(req{Path: "/small", Body: make([]byte, 100), Chunked: true, NoAuth: true}); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("at the cap: %d %s", resp.StatusCode, body)
	}
	// A chunked body holds 100 of the class's 150 bytes; a second one does
	// not fit.
	addr := strings.TrimPrefix(e.Base, "http://")
	slowConn(t, addr, nil, "/small", "Transfer-Encoding: chunked\r\n", "1\r\nx\r\n")
	e.waitMetric(`mailplane_http_inflight_body_bytes{class="anonymous"} 100`)
	resp, body := answer(t, slowConn(t, addr, nil, "/small", "Transfer-Encoding: chunked\r\n", "1\r\nx\r\n"))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, `"code":"unavailable"`) {
		t.Fatalf("over the class budget: %d %s", resp.StatusCode, body)
	}
	if !strings.Contains(e.metricsText(), `mailplane_http_shed_total{class="anonymous"} 1`) {
		t.Errorf("shed request not counted by class")
	}
}

// TestCallerShareOfClassBudget: one authenticated caller trickling many
// bodies holds at most its share of its class's budget (a quarter, or 16
// bodies of the route's cap); its next bodies get 503 at once, and
// another caller of the class is still served. Before, one producer
// token (or one worker credential on the heartbeat class) held the whole
// class budget and every other caller of the class got 503.
func TestCallerShareOfClassBudget(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{
		WithMaxInflightBytes(8000),
		WithMaxBodyBytes(1000),
		WithBodyRate(BodyRate{Min: 1, Grace: time.Minute}),
	}})
	addr := strings.TrimPrefix(e.Base, "http://")
	headers := "Authorization: Bearer " + tokenA + "\r\nContent-Type: " + ContentTypeStructured + "\r\nContent-Length: 1000\r\n"
	held, refused := 0, 0
	for i := range 8 {
		conn := slowConn(t, addr, nil, "/v1/events", headers, `{"spec`)
		answered := make(chan *http.Response, 1)
		go func() {
			_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				resp = &http.Response{StatusCode: -1}
			}
			answered <- resp
		}()
		// Either its reservation shows or it is answered.
		want := fmt.Sprintf(`mailplane_http_inflight_body_bytes{class="producer"} %d`, (held+1)*1000)
		for {
			if strings.Contains(e.metricsText(), want+"\n") {
				held++
				break
			}
			select {
			case resp := <-answered:
				if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
					t.Fatalf("slow body %d: %d, want 503 with Retry-After", i, resp.StatusCode)
				}
				refused++
			case <-time.After(5 * time.Millisecond):
				continue
			}
			break
		}
	}
	if held != 2 || refused != 6 {
		t.Fatalf("one caller's 8 slow bodies of 1000 bytes: %d held, %d refused; want 2 held (a quarter of 8000), 6 refused", held, refused)
	}
	resp, body := e.Do(req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(t, userActive()), Token: tokenB})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("another producer beside them: %d %s", resp.StatusCode, body)
	}
}
