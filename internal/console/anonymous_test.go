package console_test

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/console"
)

// TestSessionlessPostsReserveNothing: a console post without a live
// session (a logout, a redrive) is refused 403 from its headers, before
// any budget is reserved or a byte of its form is read, so one client
// address trickling such posts (they are not login attempts, so the
// per-address login limit never sees them) cannot hold the anonymous
// budget and lock operators out of the login form. Before, the handler
// read the form first and checked the session after: two slow posts held
// this test's 8 KiB anonymous budget and the operator's login got 503.
func TestSessionlessPostsReserveNothing(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ts, _, _ := unitConfigAPI(t, func(*console.Config) {}, api.WithRegisterer(reg),
		api.WithClassLimits(map[api.Class]api.ClassLimits{api.ClassAnonymous: {Budget: 8 << 10, Deadline: 10 * time.Second}}))

	paths := []string{"/console/logout", "/console/dlq/0/7/redrive"}
	answers := make(chan *http.Response, len(paths))
	for _, p := range paths {
		conn, err := net.Dial("tcp", ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		// A same-origin form of 4 KiB declared, of which 10 bytes come.
		if _, err := conn.Write([]byte("POST " + p + " HTTP/1.1\r\nHost: " + ts.Listener.Addr().String() +
			"\r\nOrigin: " + ts.URL + "\r\nSec-Fetch-Site: same-origin\r\nContent-Type: application/x-www-form-urlencoded" +
			"\r\nContent-Length: 4096\r\n\r\ncsrf=abcde")); err != nil {
			t.Fatal(err)
		}
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				resp = &http.Response{StatusCode: -1}
			}
			answers <- resp
		}()
	}
	// Wait until the slow posts either hold the whole anonymous budget
	// or have been answered.
	var got []*http.Response
	for len(got) < len(paths) && inflightAnonymous(t, reg) < 8<<10 {
		select {
		case r := <-answers:
			got = append(got, r)
		case <-time.After(10 * time.Millisecond):
		}
	}
	resp, page := loginFrom(t, ts, unitOps, "")
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the operator's login beside two slow session-less posts: %d\n%s", resp.StatusCode, page)
	}
	for len(got) < len(paths) {
		got = append(got, <-answers)
	}
	for i, r := range got {
		if r.StatusCode != http.StatusForbidden {
			t.Errorf("slow session-less post %d: %d, want 403 before its form is read", i, r.StatusCode)
		}
	}
}

// inflightAnonymous reads mailplane_http_inflight_body_bytes{class="anonymous"}.
func inflightAnonymous(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "mailplane_http_inflight_body_bytes" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabel(m, "class", "anonymous") {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && strings.EqualFold(l.GetValue(), value) {
			return true
		}
	}
	return false
}
