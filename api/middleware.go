package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mailplane/mailplane/domain"
)

// typeUnknown labels events whose type could not be read or is not a
// domain event type, so the label set stays bounded.
const typeUnknown = "unknown"

type metrics struct {
	accepted *prometheus.CounterVec
	rejected *prometheus.CounterVec
	requests *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		accepted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_ingest_events_accepted_total",
			Help: "Events acknowledged by the log after ingestion over HTTP, by event type.",
		}, []string{"type"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_ingest_events_rejected_total",
			Help: "Events refused at ingestion, by event type (unknown when unreadable) and stable error code. Requests refused as a whole count once with type unknown.",
		}, []string{"type", "code"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_http_requests_total",
			Help: "HTTP requests served, by route pattern and status code.",
		}, []string{"route", "code"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mailplane_http_request_seconds",
			Help:    "HTTP request duration, by route pattern.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"route"}),
	}
	var err error
	m.accepted, err = register(reg, m.accepted)
	if err != nil {
		return nil, err
	}
	m.rejected, err = register(reg, m.rejected)
	if err != nil {
		return nil, err
	}
	m.requests, err = register(reg, m.requests)
	if err != nil {
		return nil, err
	}
	m.seconds, err = register(reg, m.seconds)
	if err != nil {
		return nil, err
	}
	for _, t := range domain.EventTypes() {
		m.accepted.WithLabelValues(t)
	}
	return m, nil
}

// register registers c, or returns the collector already registered under
// the same description (two servers on one registry share series).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		var zero C
		return zero, fmt.Errorf("api: register metrics: %w", err)
	}
	return c, nil
}

func (s *Server) metricsHandler() http.Handler {
	return promhttp.HandlerFor(s.cfg.gatherer, promhttp.HandlerOpts{
		ErrorLog:      errLogger{s},
		ErrorHandling: promhttp.ContinueOnError,
	})
}

type errLogger struct{ s *Server }

func (e errLogger) Println(v ...any) { e.s.log.Warn("metrics: " + fmt.Sprint(v...)) }

// statusWriter records the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// instrument counts and times requests under a bounded route label (the
// mounted pattern, never the raw path) and logs them without bodies.
func (s *Server) instrument(route string, h http.Handler) http.Handler {
	seconds := s.metrics.seconds.WithLabelValues(route)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			status := sw.status
			if status == 0 {
				status = http.StatusOK
			}
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler { //nolint:errorlint // sentinel compared as net/http does
					panic(p)
				}
				s.log.Error("api handler panicked", "route", route, "panic", fmt.Sprintf("%T", p))
				if sw.status == 0 {
					WriteError(sw, http.StatusInternalServerError, domain.CodeInternal, "internal error")
				}
				status = http.StatusInternalServerError
			}
			d := time.Since(start)
			s.metrics.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
			seconds.Observe(d.Seconds())
			level := slogLevel(status)
			if s.log.Enabled(r.Context(), level) {
				s.log.Log(r.Context(), level, "http request",
					"method", r.Method, "route", route, "status", status,
					"duration", d, "remote", r.RemoteAddr)
			}
		}()
		h.ServeHTTP(sw, r)
	})
}

// recoverer turns a panic outside any route handler into a 500.
func (s *Server) recoverer(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler { //nolint:errorlint
					panic(p)
				}
				s.log.Error("api panicked", "panic", fmt.Sprintf("%T", p))
				WriteError(w, http.StatusInternalServerError, domain.CodeInternal, "internal error")
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// requireAuth checks the bearer token before h runs.
func (s *Server) requireAuth(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch s.authenticate(r) {
		case authOK:
			h.ServeHTTP(w, r)
		case authMissing:
			w.Header().Set("WWW-Authenticate", `Bearer realm="mailplane"`)
			WriteError(w, http.StatusUnauthorized, domain.CodeUnauthorized, "a bearer token is required")
		default:
			w.Header().Set("WWW-Authenticate", `Bearer realm="mailplane", error="invalid_token"`)
			WriteError(w, http.StatusUnauthorized, domain.CodeUnauthorized, "the bearer token is not valid")
		}
	})
}

type authResult int

const (
	authOK authResult = iota
	authMissing
	authInvalid
)

// authenticate compares the presented token with every configured token
// in constant time. Both sides are hashed first, so neither the length nor
// the content of a configured token leaks through timing, and the loop
// never stops early.
func (s *Server) authenticate(r *http.Request) authResult {
	hs := r.Header.Values("Authorization")
	if len(hs) == 0 {
		return authMissing
	}
	if len(hs) > 1 {
		return authInvalid
	}
	scheme, tok, ok := strings.Cut(strings.TrimSpace(hs[0]), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return authInvalid
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return authInvalid
	}
	sum := sha256.Sum256([]byte(tok))
	match := 0
	for i := range s.tokens {
		match |= subtle.ConstantTimeCompare(sum[:], s.tokens[i][:])
	}
	if match == 1 {
		return authOK
	}
	return authInvalid
}

func slogLevel(status int) slog.Level {
	if status >= 500 {
		return slog.LevelWarn
	}
	return slog.LevelDebug
}
