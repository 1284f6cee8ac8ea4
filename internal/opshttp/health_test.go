package opshttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/internal/opshttp"
)

func get(t *testing.T, h http.Handler, path string) *httptest.ResponseRecorder {
	t.Helper()
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, path, nil))
	return rr
}

// decode reads body strictly into v: a field the shape does not have
// fails.
func decode(t *testing.T, body string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
}

// TestHealthStatuses: a passing check is ok, a failing one error with its
// text, a missing one disabled (not failing health); any error makes the
// whole unavailable with 503.
func TestHealthStatuses(t *testing.T) {
	t.Parallel()
	h := opshttp.NewHealth(time.Second, map[string]opshttp.Check{
		"broker":   func(context.Context) error { return nil },
		"database": func(context.Context) error { return errors.New("connection refused") },
		"cache":    nil,
	})
	rr := get(t, h, "/healthz")
	var hr opshttp.HealthResponse
	decode(t, rr.Body.String(), &hr)
	if rr.Code != http.StatusServiceUnavailable || hr.Status != opshttp.HealthUnavailable ||
		hr.Checks["broker"].Status != opshttp.HealthOK || hr.Checks["database"].Status != opshttp.HealthError ||
		hr.Checks["database"].Error != "connection refused" || hr.Checks["cache"].Status != opshttp.HealthDisabled {
		t.Fatalf("%d %+v", rr.Code, hr)
	}
	if rr.Header().Get("Content-Type") != "application/json" || rr.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("headers %v", rr.Header())
	}

	ok := opshttp.NewHealth(0, map[string]opshttp.Check{"broker": nil, "database": func(context.Context) error { return nil }})
	if rr := get(t, ok, "/healthz"); rr.Code != http.StatusOK {
		t.Fatalf("all ok: %d %s", rr.Code, rr.Body)
	}
}

// TestHealthTimeout: a check that does not return is cut at the timeout
// and reported as timed out.
func TestHealthTimeout(t *testing.T) {
	t.Parallel()
	h := opshttp.NewHealth(100*time.Millisecond, map[string]opshttp.Check{
		"database": func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() },
	})
	start := time.Now()
	status, hr := h.Check(context.Background())
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("check took %v", d)
	}
	if status != http.StatusServiceUnavailable || hr.Checks["database"].Error != "timed out after 100ms" {
		t.Fatalf("%d %+v", status, hr)
	}
}

// TestPublicHealthHasNoErrorText: the public answer says which check is
// unavailable, never why.
func TestPublicHealthHasNoErrorText(t *testing.T) {
	t.Parallel()
	const secret = "dial tcp 10.9.8.7:5432: password authentication failed"
	h := opshttp.NewHealth(0, map[string]opshttp.Check{
		"broker":   func(context.Context) error { return nil },
		"database": func(context.Context) error { return errors.New(secret) },
	})
	rr := get(t, h.PublicHandler(), "/healthz")
	if rr.Code != http.StatusServiceUnavailable ||
		rr.Body.String() != `{"status":"unavailable","checks":{"broker":"ok","database":"unavailable"}}`+"\n" {
		t.Fatalf("%d %s", rr.Code, rr.Body)
	}
}

// TestHandler: the ops mux serves the detailed health and the gatherer's
// metrics, and nothing else.
func TestHandler(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "mailplane_test_things_total", Help: "things"})
	reg.MustRegister(c)
	c.Inc()
	h := opshttp.Handler(opshttp.NewHealth(0, map[string]opshttp.Check{"broker": nil}), reg, reg, slog.New(slog.DiscardHandler))
	if rr := get(t, h, "/metrics"); rr.Code != http.StatusOK || !strings.Contains(rr.Body.String(), "mailplane_test_things_total 1") {
		t.Fatalf("metrics: %d %s", rr.Code, rr.Body)
	}
	var hr opshttp.HealthResponse
	rr := get(t, h, "/healthz")
	decode(t, rr.Body.String(), &hr)
	if rr.Code != http.StatusOK || hr.Status != opshttp.HealthOK {
		t.Fatalf("healthz: %d %s", rr.Code, rr.Body)
	}
	if rr := get(t, h, "/other"); rr.Code != http.StatusNotFound {
		t.Errorf("/other: %d", rr.Code)
	}
}

// TestServeStopsWithContext: Serve answers on its address until its
// context is done, then returns.
func TestServeStopsWithContext(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	h := opshttp.Handler(opshttp.NewHealth(0, nil), nil, nil, nil)
	go func() { done <- opshttp.Serve(ctx, addr, h, slog.New(slog.DiscardHandler)) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("healthz %d", resp.StatusCode)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not serving: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
}

// TestHealthDisabledBesideRunningChecks: a disabled check's result is
// recorded while the others' goroutines record theirs (a concurrent map
// write crashed the process in CI before).
func TestHealthDisabledBesideRunningChecks(t *testing.T) {
	t.Parallel()
	checks := map[string]opshttp.Check{}
	for i := range 32 {
		name := string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		if i%2 == 0 {
			checks[name] = nil
			continue
		}
		checks[name] = func(context.Context) error { return nil }
	}
	h := opshttp.NewHealth(time.Second, checks)
	for range 50 {
		status, resp := h.Check(context.Background())
		if status != http.StatusOK || len(resp.Checks) != len(checks) {
			t.Fatalf("status %d, %d results of %d checks", status, len(resp.Checks), len(checks))
		}
	}
}
