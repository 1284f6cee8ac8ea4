package api

import (
	"context"
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

// HealthResponse is the body of GET /healthz: status is ok (200) when every
// configured check passes, unavailable (503) otherwise. The public listener
// answers it without error text or latencies (PublicHealthResponse); the
// detailed one is on the ops listener (OpsHandler).
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

func (s *Server) handlePublicHealth(w http.ResponseWriter, r *http.Request) {
	status, resp := s.health(r.Context())
	pub := PublicHealthResponse{Status: resp.Status, Checks: make(map[string]string, len(resp.Checks))}
	for name, c := range resp.Checks {
		switch c.Status {
		case HealthError:
			pub.Checks[name] = HealthUnavailable
		default:
			pub.Checks[name] = c.Status
		}
	}
	WriteJSON(w, status, pub)
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	status, resp := s.health(r.Context())
	WriteJSON(w, status, resp)
}

// OpsHandler serves GET /metrics (WithGatherer, or the registerer when it
// gathers) and the detailed GET /healthz (with error text and latencies).
// Serve it on a listener only operators reach (mailplane's --ops-http).
func (s *Server) OpsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.handleHealth)
	if s.cfg.gatherer != nil {
		mux.Handle("GET /metrics", s.metricsHandler())
	}
	return s.recoverer(mux)
}

func (s *Server) health(ctx context.Context) (int, HealthResponse) {
	checks := map[string]func(context.Context) error{
		"broker":   nil,
		"database": s.cfg.database,
	}
	if s.cfg.broker != nil {
		checks["broker"] = s.cfg.broker.Ping
	}
	resp := HealthResponse{Status: HealthOK, Checks: make(map[string]CheckResult, len(checks))}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, check := range checks {
		if check == nil {
			resp.Checks[name] = CheckResult{Status: HealthDisabled}
			continue
		}
		wg.Go(func() {
			res := s.runCheck(ctx, check)
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

func (s *Server) runCheck(ctx context.Context, check func(context.Context) error) CheckResult {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.healthTimeout)
	defer cancel()
	start := time.Now()
	err := check(ctx)
	res := CheckResult{Status: HealthOK, LatencyMS: float64(time.Since(start).Microseconds()) / 1000}
	if err != nil {
		res.Status = HealthError
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			res.Error = "timed out after " + s.cfg.healthTimeout.String()
		default:
			res.Error = truncate(err.Error(), 200)
		}
	}
	return res
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}
