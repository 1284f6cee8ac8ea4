package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/promreg"
)

// typeUnknown labels events whose type could not be read or is not a
// domain event type, so the label set stays bounded.
const typeUnknown = "unknown"

type metrics struct {
	accepted *prometheus.CounterVec
	rejected *prometheus.CounterVec
	requests *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
	refused  *prometheus.CounterVec
	shed     *prometheus.CounterVec
	inflight *prometheus.GaugeVec
	budget   *prometheus.GaugeVec
	slow     *prometheus.CounterVec
	classes  map[Class]classMetrics
}

// classMetrics are the body metrics of one caller class.
type classMetrics struct {
	shed, slow prometheus.Counter
	inflight   prometheus.Gauge
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
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_ingest_forbidden_total",
			Help: "Requests refused with 403 at ingestion, by caller name (from the tokens file) and stable code.",
		}, []string{"caller", "code"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_http_shed_total",
			Help: "Requests refused with 503 before their body was read because the bodies in flight of their caller class were at its budget, by class.",
		}, []string{"class"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mailplane_http_inflight_body_bytes",
			Help: "Bytes of request bodies reserved by requests being served, by caller class.",
		}, []string{"class"}),
		budget: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mailplane_http_body_budget_bytes",
			Help: "In-flight body budget of each caller class.",
		}, []string{"class"}),
		slow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_http_slow_bodies_total",
			Help: "Requests cut with 408 because their body came slower than the minimum rate or not whole within its class deadline, by class.",
		}, []string{"class"}),
		classes: map[Class]classMetrics{},
	}
	var err error
	if m.refused, err = promreg.Register(reg, m.refused); err != nil {
		return nil, err
	}
	if m.shed, err = promreg.Register(reg, m.shed); err != nil {
		return nil, err
	}
	if m.inflight, err = promreg.Register(reg, m.inflight); err != nil {
		return nil, err
	}
	if m.budget, err = promreg.Register(reg, m.budget); err != nil {
		return nil, err
	}
	if m.slow, err = promreg.Register(reg, m.slow); err != nil {
		return nil, err
	}
	for _, c := range Classes() {
		l := string(c)
		m.classes[c] = classMetrics{shed: m.shed.WithLabelValues(l), slow: m.slow.WithLabelValues(l), inflight: m.inflight.WithLabelValues(l)}
	}
	m.accepted, err = promreg.Register(reg, m.accepted)
	if err != nil {
		return nil, err
	}
	m.rejected, err = promreg.Register(reg, m.rejected)
	if err != nil {
		return nil, err
	}
	m.requests, err = promreg.Register(reg, m.requests)
	if err != nil {
		return nil, err
	}
	m.seconds, err = promreg.Register(reg, m.seconds)
	if err != nil {
		return nil, err
	}
	for _, t := range domain.EventTypes() {
		m.accepted.WithLabelValues(t)
	}
	return m, nil
}

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

// requireAuth authenticates the bearer token before h runs and hands h
// the caller (CallerFrom).
func (s *Server) requireAuth(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, res := bearer(r)
		var caller *domain.Caller
		if res == authOK {
			var ok bool
			if caller, ok = s.cfg.auth.Authenticate(tok); !ok || caller == nil {
				res = authInvalid
			}
		}
		switch res {
		case authOK:
			h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, caller)))
		case authMissing:
			w.Header().Set("WWW-Authenticate", `Bearer realm="mailplane"`)
			WriteError(w, http.StatusUnauthorized, domain.CodeUnauthorized, "a bearer token is required")
		default:
			w.Header().Set("WWW-Authenticate", `Bearer realm="mailplane", error="invalid_token"`)
			WriteError(w, http.StatusUnauthorized, domain.CodeUnauthorized, "the bearer token is not valid")
		}
	})
}

type callerKey struct{}

// CallerFrom returns the authenticated caller of a request served behind
// the server's auth (routes mounted with authRequired), else nil.
func CallerFrom(ctx context.Context) *domain.Caller {
	c, _ := ctx.Value(callerKey{}).(*domain.Caller)
	return c
}

// WriteForbidden writes a 403 forbidden naming the scope missing.
func WriteForbidden(w http.ResponseWriter, message string) {
	WriteError(w, http.StatusForbidden, domain.CodeForbidden, message)
}

type authResult int

const (
	authOK authResult = iota
	authMissing
	authInvalid
)

// bearer reads the one bearer token of a request.
func bearer(r *http.Request) (string, authResult) {
	hs := r.Header.Values("Authorization")
	if len(hs) == 0 {
		return "", authMissing
	}
	if len(hs) > 1 {
		return "", authInvalid
	}
	scheme, tok, ok := strings.Cut(strings.TrimSpace(hs[0]), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", authInvalid
	}
	tok = strings.TrimSpace(tok)
	if tok == "" || len(tok) > maxTokenLen {
		return "", authInvalid
	}
	return tok, authOK
}

// maxTokenLen bounds what is hashed or MACed per request.
const maxTokenLen = 512

func slogLevel(status int) slog.Level {
	if status >= 500 {
		return slog.LevelWarn
	}
	return slog.LevelDebug
}
