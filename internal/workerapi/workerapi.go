// Package workerapi is the HTTP API sending workers talk to, mounted on an
// api.Server (which gives it bearer-token auth, metrics, logging and the
// all-or-nothing produce path of POST /v1/events).
//
// A worker authenticates with its own credential, bound to its worker id
// (access.WorkerToken: derived from the fleet secret and the id). It
// heartbeats only as itself and reads only its own assignments: any other
// id is 403 forbidden. Callers holding workers:read may read any worker's
// assignments; nobody but the worker heartbeats as it. Worker ids not yet
// known to placement are rate-limited (NewWorkerLimiter, installed as the
// api.Server's admission hook so /v1/events heartbeats count too): 429
// rate_limited with Retry-After, so no credential floods placement state
// with made-up ids. Heartbeats of a worker the limiter remembers need no
// database, so they are accepted while Postgres is down.
//
//   - POST /v1/workers/heartbeat: a worker says it is alive. The JSON body
//     is a worker.heartbeat event's data ({worker_id, tier, egress, address,
//     stopping}), decoded strictly and validated by domain.WorkerHeartbeat;
//     tier dedicated is refused with tier_not_allowed. The event is
//     produced through api.Server.Publish with the server clock as its time
//     and answered like POST /v1/events (202 with a receipt).
//   - GET /v1/workers/{id}/assignments[?since=<token>]: the mailboxes placed
//     on the worker, read from the placement projection (AssignmentStore),
//     with an opaque change token. Without a token the answer is the full
//     list; with one, only what was added and removed since, and a new
//     token. A token older than the retained changes is refused with 410
//     and code expired: the worker drops its state and asks for the full
//     list again.
//
// Errors carry the stable codes of package domain (plus CodeExpired) in
// api.ErrorResponse bodies; a request that fails never produces anything.
package workerapi

import (
	"errors"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
)

// Routes mounted by Register.
const (
	RouteHeartbeat   = "POST /v1/workers/heartbeat"
	RouteAssignments = "GET /v1/workers/{id}/assignments"
)

// Defaults.
const (
	// DefaultSource is the ce_source of heartbeat events.
	DefaultSource = "mailplane/workerapi"
	// DefaultMaxBodyBytes bounds a heartbeat body; a heartbeat is a few
	// hundred bytes.
	DefaultMaxBodyBytes = 16 << 10
	// DefaultQueryTimeout bounds one assignments query.
	DefaultQueryTimeout = 5 * time.Second
)

type config struct {
	store        AssignmentStore
	now          func() time.Time
	source       string
	maxBody      int64
	queryTimeout time.Duration
	logger       *slog.Logger
}

// Option configures the worker API.
type Option func(*config)

// WithAssignmentStore serves GET /v1/workers/{id}/assignments from store.
// Without one that route is not mounted (the heartbeat route still is).
func WithAssignmentStore(store AssignmentStore) Option {
	return func(c *config) { c.store = store }
}

// WithClock sets the clock giving heartbeat events their time (default
// time.Now). Heartbeat times are always the server's, never the worker's.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithSource sets the ce_source of heartbeat events (default
// DefaultSource).
func WithSource(source string) Option { return func(c *config) { c.source = source } }

// WithMaxBodyBytes bounds heartbeat bodies (default DefaultMaxBodyBytes);
// larger bodies get 413 too_large.
func WithMaxBodyBytes(n int64) Option { return func(c *config) { c.maxBody = n } }

// WithQueryTimeout bounds each assignments query (default
// DefaultQueryTimeout).
func WithQueryTimeout(d time.Duration) Option { return func(c *config) { c.queryTimeout = d } }

// WithLogger sets the logger (default: discard). Bodies are never logged.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

type handlers struct {
	cfg config
	srv *api.Server
	log *slog.Logger
}

// Register mounts the worker routes on s, both behind s's bearer-token
// auth. Call it before s serves. Workers authenticate with their own
// credential (the server's api.Authenticator must accept worker
// credentials, e.g. access.WithFleetSecret).
func Register(s *api.Server, opts ...Option) error {
	if s == nil {
		return errors.New("workerapi: nil server")
	}
	c := config{
		now:          time.Now,
		source:       DefaultSource,
		maxBody:      DefaultMaxBodyBytes,
		queryTimeout: DefaultQueryTimeout,
	}
	for _, o := range opts {
		o(&c)
	}
	if c.now == nil || c.source == "" || c.maxBody <= 0 || c.queryTimeout <= 0 {
		return errors.New("workerapi: clock, source, body limit and query timeout must be set and positive")
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	h := &handlers{cfg: c, srv: s, log: c.logger}
	// Heartbeats have a body budget of their own, taken only once the
	// worker's credential is checked: no other caller can crowd them out.
	if err := s.HandleLimited(RouteHeartbeat, http.HandlerFunc(h.heartbeat), true,
		api.RouteLimits{Class: api.ClassHeartbeat, MaxBody: c.maxBody}); err != nil {
		return err
	}
	if c.store != nil {
		if err := s.Handle(RouteAssignments, http.HandlerFunc(h.assignments), true); err != nil {
			return err
		}
	}
	return nil
}

// heartbeat is POST /v1/workers/heartbeat.
func (h *handlers) heartbeat(w http.ResponseWriter, r *http.Request) {
	caller := api.CallerFrom(r.Context())
	if caller == nil || caller.WorkerID == "" {
		api.WriteForbidden(w, "heartbeats need the worker's own credential")
		return
	}
	if !isJSON(r.Header.Get("Content-Type")) {
		api.WriteError(w, http.StatusUnsupportedMediaType, domain.CodeUnsupportedMediaType,
			"Content-Type must be application/json")
		return
	}
	body, err := api.ReadBody(w, r, h.cfg.maxBody)
	if err != nil {
		api.WriteDomainError(w, err)
		return
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		api.WriteError(w, http.StatusBadRequest, domain.CodeMalformedJSON,
			"request body is empty; expected a JSON object {worker_id, tier, egress, address, stopping}")
		return
	}
	// Strict: exact field names, no unknown or repeated fields, no nulls,
	// the types of the event's JSON Schema.
	data, ps := domain.DecodeData(domain.TypeWorkerHeartbeat, body, true)
	if len(ps) > 0 {
		api.WriteProblems(w, http.StatusBadRequest, "the heartbeat is invalid; nothing was produced", relativeTo("data", ps))
		return
	}
	hb := data.(*domain.WorkerHeartbeat)
	if ps := hb.Validate(); len(ps) > 0 {
		api.WriteProblems(w, http.StatusBadRequest, "the heartbeat is invalid; nothing was produced", ps)
		return
	}
	if !caller.MayHeartbeatAs(hb.WorkerID) {
		h.log.Info("heartbeat refused: the credential is another worker's", "credential_worker", caller.WorkerID)
		api.WriteForbidden(w, "a worker heartbeats only under its own worker id")
		return
	}
	h.srv.Publish(w, r, domain.Event{
		Type:    domain.TypeWorkerHeartbeat,
		Source:  h.cfg.source,
		Time:    h.cfg.now().UTC(),
		Subject: hb.WorkerID,
		Data:    hb,
	})
}

// relativeTo strips prefix from the problems' field paths: the request
// body is the event's data, so "data.tier" is "tier" to the client and
// "data" (the whole object) is "".
func relativeTo(prefix string, ps domain.Problems) domain.Problems {
	out := make(domain.Problems, len(ps))
	for i, p := range ps {
		switch {
		case p.Field == prefix:
			p.Field = ""
		case strings.HasPrefix(p.Field, prefix+"."):
			p.Field = p.Field[len(prefix)+1:]
		}
		out[i] = p
	}
	return out
}

// isJSON reports whether a Content-Type is application/json, with no
// charset other than UTF-8.
func isJSON(ct string) bool {
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return false
	}
	cs, ok := params["charset"]
	return !ok || strings.EqualFold(cs, "utf-8")
}
