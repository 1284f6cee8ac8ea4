// Package api is mailplane's HTTP API: CloudEvents ingestion over HTTP
// (POST /v1/events, structured, batch and binary content modes) and a
// public health answer (GET /healthz: ok or unavailable per check, never
// internal error text). Metrics and the detailed health are served by
// OpsHandler, meant for an ops listener that is not public. Every event of
// a request is parsed, sealed and validated before anything is produced,
// and a request is all-or-nothing: one invalid or forbidden event rejects
// the request and nothing reaches the log. Errors carry stable codes (see
// domain.Code).
//
// Every caller has an identity (an Authenticator maps its bearer token to a
// domain.Caller): POST /v1/events refuses, with 403, events whose type the
// caller's scopes do not grant or whose source is not the caller's.
//
// The server is composable: later routes are mounted with WithRoute or
// Server.Handle and share its bearer-token auth (CallerFrom gives the
// handler the caller), metrics, logging and JSON error helpers
// (WriteError, WriteJSON, WriteDomainError, DecodeJSON). Request bodies
// are reserved from a budget per caller class only once the caller is
// known, each route reads at most its own cap, and every body is held to
// a minimum rate and a deadline (HandleLimited, limits.go).
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/opshttp"
	"github.com/mailplane/mailplane/producer"
)

// Limits and defaults.
const (
	DefaultAddr           = ":8080"
	DefaultMaxBodyBytes   = 1 << 20 // 1 MiB
	DefaultMaxBatch       = 1000
	DefaultProduceTimeout = 15 * time.Second
	DefaultHealthTimeout  = 2 * time.Second
	// DefaultMaxInflightBytes bounds the request bodies of producers
	// (ClassProducer) being read at once (WithMaxInflightBytes).
	DefaultMaxInflightBytes = 64 << 20
)

// Authenticator tells who presents a bearer token; *access.Authenticator
// is one. It must compare in constant time.
type Authenticator interface {
	Authenticate(token string) (*domain.Caller, bool)
}

// Producer validates, encodes and produces events; *producer.Client is one
// (built on a kgo client with kafka.ProducerOptions: idempotent, acks=all).
type Producer interface {
	// PrepareChecked encodes events the domain has checked, all or
	// nothing, without validating them again; problems (a schema
	// validator's, the endpoint rule of its sealer) are reported as a
	// *producer.BatchError.
	PrepareChecked(events []domain.Checked) ([]*kgo.Record, error)
	// ProduceRecords produces prepared records and waits for their acks.
	ProduceRecords(ctx context.Context, events []domain.Event, recs []*kgo.Record) ([]producer.Receipt, error)
}

// SchemaValidator checks an event's data (the sealed JSON exactly as it
// will be produced) against the JSON Schema of its type. Field paths in
// the problems are relative to the data object (a "data." prefix is added
// when missing).
type SchemaValidator interface {
	Validate(eventType string, data []byte) domain.Problems
}

// Pinger reports whether the broker is reachable; *kgo.Client is one.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Timeouts bound the HTTP server. Zero fields take the defaults.
type Timeouts struct {
	ReadHeader     time.Duration // default 5s
	Read           time.Duration // default 30s
	Write          time.Duration // default 30s (above the produce timeout)
	Idle           time.Duration // default 120s
	Shutdown       time.Duration // grace period for in-flight requests, default 20s
	MaxHeaderBytes int           // default 64 KiB
}

func (t Timeouts) withDefaults() Timeouts {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&t.ReadHeader, 5*time.Second)
	def(&t.Read, 30*time.Second)
	def(&t.Write, 30*time.Second)
	def(&t.Idle, 120*time.Second)
	def(&t.Shutdown, 20*time.Second)
	if t.MaxHeaderBytes <= 0 {
		t.MaxHeaderBytes = 64 << 10
	}
	return t
}

type route struct {
	pattern string
	handler http.Handler
	auth    bool
	limits  RouteLimits
}

type config struct {
	addr           string
	auth           Authenticator
	classes        map[Class]ClassLimits
	rate           BodyRate
	admit          Admission
	sealer         producer.Sealer
	transport      *domain.TransportPolicy
	schema         SchemaValidator
	broker         Pinger
	database       func(context.Context) error
	health         *opshttp.Health
	reg            prometheus.Registerer
	gatherer       prometheus.Gatherer
	logger         *slog.Logger
	now            func() time.Time
	routes         []route
	maxBody        int64
	maxBatch       int
	timeouts       Timeouts
	produceTimeout time.Duration
	healthTimeout  time.Duration
}

// Option configures a Server.
type Option func(*config)

// WithAddr sets the listen address of Run (default ":8080").
func WithAddr(addr string) Option { return func(c *config) { c.addr = addr } }

// WithAuthenticator sets who the bearer tokens belong to; it is required.
func WithAuthenticator(a Authenticator) Option { return func(c *config) { c.auth = a } }

// Admission decides whether valid events may be produced now (a rate limit
// on new worker ids, say). It runs after validation, before producing, for
// POST /v1/events and Publish alike. A *domain.Error refuses the request
// with the status of its code (rate_limited: 429 with Retry-After, from a
// RetryAfter() time.Duration method when the error has one); any other
// error is a 500.
type Admission func(ctx context.Context, events []domain.Event) error

// WithAdmission sets the admission hook (default: none).
func WithAdmission(a Admission) Option { return func(c *config) { c.admit = a } }

// WithMaxInflightBytes bounds the bytes of producers' request bodies
// (ClassProducer) being read at once (default DefaultMaxInflightBytes): a
// request whose body would go beyond it gets 503 unavailable with
// Retry-After before its body is read. A body of unknown length counts as
// the body limit. The other classes have budgets of their own
// (WithClassLimits).
func WithMaxInflightBytes(n int64) Option {
	return func(c *config) {
		l := c.classes[ClassProducer]
		l.Budget = n
		c.classes[ClassProducer] = l
	}
}

// WithSealer seals plain mailbox credentials at ingest. Without one,
// events carrying plain credentials are refused (plaintext_secret).
func WithSealer(s producer.Sealer) Option { return func(c *config) { c.sealer = s } }

// WithTransportPolicy refuses mailbox endpoints the policy does not allow
// (internal IP addresses not allowlisted, tls none to a host that is
// neither loopback nor allowlisted) before anything is produced. Sync
// workers check the same policy again when they dial.
func WithTransportPolicy(p domain.TransportPolicy) Option {
	return func(c *config) { c.transport = &p }
}

// WithSchemaValidator adds JSON Schema validation of every event's data,
// after Go validation and sealing: a second opinion, which the api role
// does not wire. The domain's Go validation is the authority at ingest and
// the schemas are held to agree with it by tests (internal/eventschema:
// the agreement tests and FuzzSchemaAgreement; FuzzIngestSchemaAgrees
// here, on the records ingest produces), so it would refuse nothing the
// Go validation accepts, at a third of the ingest's CPU for mailbox.added
// (BENCHMARKS.md, "Ingest").
func WithSchemaValidator(v SchemaValidator) Option { return func(c *config) { c.schema = v } }

// WithBrokerCheck sets the broker health check (a *kgo.Client).
func WithBrokerCheck(p Pinger) Option { return func(c *config) { c.broker = p } }

// WithDatabaseCheck sets the database health check (e.g. pgxpool.Pool.Ping).
func WithDatabaseCheck(check func(ctx context.Context) error) Option {
	return func(c *config) { c.database = check }
}

// WithHealth sets the checks of GET /healthz (public and ops), shared
// with the process's ops listener; it overrides WithBrokerCheck,
// WithDatabaseCheck and WithHealthTimeout.
func WithHealth(h *opshttp.Health) Option { return func(c *config) { c.health = h } }

// WithRegisterer registers the server's metrics on reg. When reg is also a
// prometheus.Gatherer and WithGatherer is not given, /metrics serves it.
func WithRegisterer(reg prometheus.Registerer) Option { return func(c *config) { c.reg = reg } }

// WithGatherer sets what OpsHandler's GET /metrics serves.
func WithGatherer(g prometheus.Gatherer) Option { return func(c *config) { c.gatherer = g } }

// WithLogger sets the logger (default: discard). Request bodies, tokens
// and secrets are never logged.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithClock sets the clock giving events without a time their time.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithRoute mounts an extra handler on a net/http ServeMux pattern such as
// "POST /v1/workers/heartbeat" or "GET /v1/workers/{id}/assignments". With
// authRequired the bearer-token check runs first. Patterns with a method
// get JSON 405 responses for other methods on the same path. Its bodies
// take the default RouteLimits (HandleLimited).
func WithRoute(pattern string, h http.Handler, authRequired bool) Option {
	return func(c *config) { c.routes = append(c.routes, route{pattern, h, authRequired, RouteLimits{}}) }
}

// WithMaxBodyBytes bounds request bodies (default 1 MiB).
func WithMaxBodyBytes(n int64) Option { return func(c *config) { c.maxBody = n } }

// WithMaxBatch bounds the events of one batch (default 1000).
func WithMaxBatch(n int) Option { return func(c *config) { c.maxBatch = n } }

// WithTimeouts sets the HTTP server's timeouts.
func WithTimeouts(t Timeouts) Option { return func(c *config) { c.timeouts = t } }

// WithProduceTimeout bounds how long a request waits for acks (default
// 15s). Producing is not cancelled when the client goes away: once a
// request is accepted for producing, it is carried through.
func WithProduceTimeout(d time.Duration) Option { return func(c *config) { c.produceTimeout = d } }

// WithHealthTimeout bounds each health check (default 2s).
func WithHealthTimeout(d time.Duration) Option { return func(c *config) { c.healthTimeout = d } }

// Server is mailplane's HTTP API server.
type Server struct {
	cfg     config
	log     *slog.Logger
	prod    Producer
	seal    domain.SealFunc
	metrics *metrics
	health  *opshttp.Health
	budgets map[Class]*budget
	mux     *http.ServeMux
	handler http.Handler
	srv     *http.Server

	mu      sync.Mutex
	methods map[string]map[string]bool // path → methods with a handler
	plain   map[string]bool            // paths mounted without a method
	routes  []string                   // every pattern mounted, as given
}

// New builds a server producing through p.
func New(p Producer, opts ...Option) (*Server, error) {
	c := config{
		addr:           DefaultAddr,
		maxBody:        DefaultMaxBodyBytes,
		maxBatch:       DefaultMaxBatch,
		produceTimeout: DefaultProduceTimeout,
		healthTimeout:  DefaultHealthTimeout,
		classes:        DefaultClassLimits(),
		rate:           BodyRate{Min: DefaultMinBodyRate, Grace: DefaultBodyRateGrace},
		now:            time.Now,
	}
	for _, o := range opts {
		o(&c)
	}
	if p == nil {
		return nil, errors.New("api: a producer is required")
	}
	if c.auth == nil {
		return nil, errors.New("api: an authenticator is required")
	}
	if err := c.validLimits(); err != nil {
		return nil, err
	}
	if c.maxBody <= 0 || c.maxBatch <= 0 || c.produceTimeout <= 0 || c.healthTimeout <= 0 {
		return nil, errors.New("api: limits and timeouts must be positive")
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	if c.reg == nil {
		r := prometheus.NewRegistry()
		c.reg = r
		if c.gatherer == nil {
			c.gatherer = r
		}
	}
	if c.gatherer == nil {
		if g, ok := c.reg.(prometheus.Gatherer); ok {
			c.gatherer = g
		}
	}
	c.timeouts = c.timeouts.withDefaults()

	s := &Server{
		cfg:     c,
		log:     c.logger,
		prod:    p,
		mux:     http.NewServeMux(),
		methods: map[string]map[string]bool{},
		plain:   map[string]bool{},
		health:  c.healthChecks(),
	}
	if c.sealer != nil {
		s.seal = c.sealer.Seal
	}
	m, err := newMetrics(c.reg)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.budgets = map[Class]*budget{}
	for k, l := range c.classes {
		s.budgets[k] = &budget{max: l.Budget}
		m.budget.WithLabelValues(string(k)).Set(float64(l.Budget))
	}

	builtin := []route{
		{"POST /v1/events", http.HandlerFunc(s.handleEvents), true, RouteLimits{Class: ClassProducer}},
		{"GET /healthz", s.health.PublicHandler(), false, RouteLimits{}},
		{RouteOpenAPI, openAPIHandler(), false, RouteLimits{}},
	}
	for _, r := range append(builtin, c.routes...) {
		if err := s.HandleLimited(r.pattern, r.handler, r.auth, r.limits); err != nil {
			return nil, err
		}
	}
	if !s.plain["/"] && s.methods["/"] == nil {
		s.mux.Handle("/", s.instrument("unmatched", http.HandlerFunc(notFound)))
	}
	s.handler = s.recoverer(s.drainRefused(s.mux))
	s.srv = &http.Server{
		Addr:              c.addr,
		Handler:           s.handler,
		ReadHeaderTimeout: c.timeouts.ReadHeader,
		ReadTimeout:       c.timeouts.Read,
		WriteTimeout:      c.timeouts.Write,
		IdleTimeout:       c.timeouts.Idle,
		MaxHeaderBytes:    c.timeouts.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(c.logger.Handler(), slog.LevelWarn),
		// Requests are not cancelled by Run's context: in-flight requests
		// finish during the shutdown grace period.
		BaseContext: func(net.Listener) context.Context { return context.Background() },
	}
	return s, nil
}

// Handle mounts h on pattern, like WithRoute, with the default
// RouteLimits. Call it before serving. It returns an error when the
// pattern is invalid or conflicts with one already mounted.
func (s *Server) Handle(pattern string, h http.Handler, authRequired bool) error {
	return s.HandleLimited(pattern, h, authRequired, RouteLimits{})
}

// HandleLimited is Handle with the route's body limits: its caller class,
// its body cap, its classification before any budget is reserved. With
// authRequired the bearer token is checked before anything else, so an
// unauthenticated request reserves nothing.
func (s *Server) HandleLimited(pattern string, h http.Handler, authRequired bool, lim RouteLimits) (err error) {
	if h == nil {
		return fmt.Errorf("api: nil handler for %q", pattern)
	}
	if lim.Class == "" {
		lim.Class = ClassAnonymous
		if authRequired {
			lim.Class = ClassProducer
		}
	}
	if s.budgets[lim.Class] == nil {
		return fmt.Errorf("api: route %q: unknown caller class %q", pattern, lim.Class)
	}
	if lim.MaxBody <= 0 {
		lim.MaxBody = s.cfg.maxBody
	}
	if classify := lim.Classify; classify != nil {
		// A class Classify makes up is charged as anonymous.
		lim.Classify = func(w http.ResponseWriter, r *http.Request) (Class, bool) {
			c, ok := classify(w, r)
			if ok && s.budgets[c] == nil {
				c = ClassAnonymous
			}
			return c, ok
		}
	}
	method, path := splitPattern(pattern)
	if method != http.MethodGet && method != http.MethodHead {
		// GET handlers read no body: nothing to reserve for them.
		h = s.admitBody(lim, h)
	}
	if authRequired {
		h = s.requireAuth(h)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("api: route %q: %v", pattern, r)
		}
		if err == nil {
			s.routes = append(s.routes, method+" "+path)
		}
	}()
	if method == "" {
		if s.methods[path] != nil {
			return fmt.Errorf("api: route %q: path already has method routes", pattern)
		}
		s.mux.Handle(pattern, s.instrument(pattern, h))
		s.plain[path] = true
		return nil
	}
	if s.plain[path] {
		return fmt.Errorf("api: route %q: path already has a route for every method", pattern)
	}
	s.mux.Handle(pattern, s.instrument(pattern, h))
	ms := s.methods[path]
	if ms == nil {
		ms = map[string]bool{}
		s.methods[path] = ms
		s.mux.Handle(path, s.instrument(path, s.methodNotAllowed(path)))
	}
	ms[method] = true
	if method == http.MethodGet {
		ms[http.MethodHead] = true
	}
	return nil
}

// splitPattern splits a ServeMux pattern into its method and the rest.
func splitPattern(p string) (method, rest string) {
	p = strings.TrimSpace(p)
	if i := strings.IndexAny(p, " \t"); i >= 0 && !strings.Contains(p[:i], "/") {
		return p[:i], strings.TrimSpace(p[i:])
	}
	return "", p
}

// Routes returns every route mounted ("METHOD /path", or " /path" for a
// route of every method), sorted: what the OpenAPI document must describe.
func (s *Server) Routes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.routes)
	slices.Sort(out)
	return out
}

// Handler returns the server's root handler (for tests and embedding).
func (s *Server) Handler() http.Handler { return s.handler }

// HTTPServer returns the underlying *http.Server (timeouts, address).
func (s *Server) HTTPServer() *http.Server { return s.srv }

// Run listens on the configured address and serves until ctx is done,
// then shuts down gracefully (in-flight requests get the shutdown grace
// period). It returns nil after a clean shutdown.
func (s *Server) Run(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.cfg.addr)
	if err != nil {
		return fmt.Errorf("api: listen: %w", err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx is done, then shuts down gracefully. Serve
// may be called once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.log.Info("api listening", "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(ln) }()
	select {
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("api: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.timeouts.Shutdown)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	if err != nil {
		s.log.Warn("api shutdown grace period over; closing connections", "err", err)
		_ = s.srv.Close()
	}
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return fmt.Errorf("api: serve: %w", serr)
	}
	s.log.Info("api stopped")
	if err != nil {
		return fmt.Errorf("api: shutdown: %w", err)
	}
	return nil
}

func notFound(w http.ResponseWriter, _ *http.Request) {
	WriteError(w, http.StatusNotFound, domain.CodeNotFound, "no such route")
}

func (s *Server) methodNotAllowed(path string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		allow := make([]string, 0, len(s.methods[path]))
		for m := range s.methods[path] {
			allow = append(allow, m)
		}
		s.mu.Unlock()
		slices.Sort(allow)
		w.Header().Set("Allow", strings.Join(allow, ", "))
		WriteError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed,
			"method not allowed; allowed: "+strings.Join(allow, ", "))
	})
}
