// Package opshttp owns mailplane's health checks and its ops listener: one
// Health runs the dependency checks (broker, database) of a process and
// answers both /healthz shapes from them: the public one (status per
// check, never error text), which the API serves, and the detailed one
// (error text and latencies) that Handler serves, with /metrics, on the
// ops listener (--ops-http) of every role.
package opshttp

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"
)

// Health statuses.
const (
	HealthOK          = "ok"
	HealthError       = "error"
	HealthDisabled    = "disabled" // no check configured; does not fail health
	HealthUnavailable = "unavailable"
)

// DefaultTimeout bounds each check when NewHealth is given none.
const DefaultTimeout = 2 * time.Second

// HealthResponse is the body of the detailed GET /healthz: status is ok
// (200) when every configured check passes, unavailable (503) otherwise.
type HealthResponse struct {
	Status string                 `json:"status"`
	Checks map[string]CheckResult `json:"checks"`
}

// CheckResult is one dependency's health.
type CheckResult struct {
	Status    string  `json:"status"`
	Error     string  `json:"error,omitempty"`
	LatencyMS float64 `json:"latency_ms"`
}

// PublicHealthResponse is the body of the public GET /healthz: the overall
// status and ok, unavailable or disabled per check, nothing else, so that
// no internal error text (addresses, driver messages) reaches the public.
type PublicHealthResponse struct {
	Status string            `json:"status"`
	Checks map[string]string `json:"checks"`
}

// Check reports whether one dependency is usable; nil means not
// configured (reported as disabled).
type Check func(ctx context.Context) error

// Health runs a fixed set of named checks, concurrently, each bounded by
// the timeout.
type Health struct {
	checks  map[string]Check
	timeout time.Duration
}

// NewHealth returns the health of the named checks (a nil check is
// disabled); timeout <= 0 means DefaultTimeout.
func NewHealth(timeout time.Duration, checks map[string]Check) *Health {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	c := make(map[string]Check, len(checks))
	for name, check := range checks {
		c[name] = check
	}
	return &Health{checks: c, timeout: timeout}
}

// Check runs every check and returns the HTTP status and the detailed
// answer.
func (h *Health) Check(ctx context.Context) (int, HealthResponse) {
	resp := HealthResponse{Status: HealthOK, Checks: make(map[string]CheckResult, len(h.checks))}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, check := range h.checks {
		if check == nil {
			// Under the lock too: checks started earlier in this loop
			// are writing their results already.
			mu.Lock()
			resp.Checks[name] = CheckResult{Status: HealthDisabled}
			mu.Unlock()
			continue
		}
		wg.Go(func() {
			res := h.run(ctx, check)
			mu.Lock()
			resp.Checks[name] = res
			mu.Unlock()
		})
	}
	wg.Wait()
	status := http.StatusOK
	for _, c := range resp.Checks {
		if c.Status == HealthError {
			resp.Status = HealthUnavailable
			status = http.StatusServiceUnavailable
		}
	}
	return status, resp
}

// Public runs every check and returns the HTTP status and the answer
// without error text.
func (h *Health) Public(ctx context.Context) (int, PublicHealthResponse) {
	status, resp := h.Check(ctx)
	pub := PublicHealthResponse{Status: resp.Status, Checks: make(map[string]string, len(resp.Checks))}
	for name, c := range resp.Checks {
		switch c.Status {
		case HealthError:
			pub.Checks[name] = HealthUnavailable
		default:
			pub.Checks[name] = c.Status
		}
	}
	return status, pub
}

func (h *Health) run(ctx context.Context, check Check) CheckResult {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	start := time.Now()
	err := check(ctx)
	res := CheckResult{Status: HealthOK, LatencyMS: float64(time.Since(start).Microseconds()) / 1000}
	if err != nil {
		res.Status = HealthError
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			res.Error = "timed out after " + h.timeout.String()
		default:
			res.Error = truncate(err.Error(), 200)
		}
	}
	return res
}

// ServeHTTP answers the detailed GET /healthz.
func (h *Health) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	status, resp := h.Check(r.Context())
	writeJSON(w, status, resp)
}

// PublicHandler answers the public GET /healthz.
func (h *Health) PublicHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, resp := h.Public(r.Context())
		writeJSON(w, status, resp)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"status":"error"}`)
	}
	hd := w.Header()
	hd.Set("Content-Type", "application/json")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// truncate cuts s to n bytes on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}
