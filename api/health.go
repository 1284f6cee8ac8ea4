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
// configured check passes, unavailable (503) otherwise.
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

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
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
			res := s.runCheck(r.Context(), check)
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
	WriteJSON(w, status, resp)
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
