package query

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
)

// Routes mounted by Register: the query API. Each needs a caller holding
// fleet:read or ops.
const (
	RouteMailbox = "GET /v1/mailboxes/{id}"
	RouteOrg     = "GET /v1/orgs/{id}"
	RouteWorkers = "GET /v1/workers"
)

// readTimeout bounds one answer's reads.
const readTimeout = 10 * time.Second

// Register mounts the query API on s, reading through r.
func Register(s *api.Server, r *Reader, log *slog.Logger) error {
	if r == nil {
		return errors.New("query: a reader is required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := handlers{r: r, log: log}
	for pattern, fn := range map[string]http.HandlerFunc{
		RouteMailbox: h.mailbox,
		RouteOrg:     h.org,
		RouteWorkers: h.workers,
	} {
		if err := s.Handle(pattern, h.scoped(fn), true); err != nil {
			return err
		}
	}
	return nil
}

type handlers struct {
	r   *Reader
	log *slog.Logger
}

// MayRead reports whether c may read the fleet's facts.
func MayRead(c *domain.Caller) bool { return c.Has(domain.ScopeFleetRead) || c.Has(domain.ScopeOps) }

func (h handlers) scoped(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !MayRead(api.CallerFrom(r.Context())) {
			api.WriteForbidden(w, "the query API needs the fleet:read or ops scope")
			return
		}
		next(w, r)
	}
}

func (h handlers) mailbox(w http.ResponseWriter, r *http.Request) {
	answer(w, r, h.log, func(ctx context.Context) (any, error) { return h.r.Mailbox(ctx, r.PathValue("id")) })
}

func (h handlers) org(w http.ResponseWriter, r *http.Request) {
	answer(w, r, h.log, func(ctx context.Context) (any, error) { return h.r.Org(ctx, r.PathValue("id")) })
}

func (h handlers) workers(w http.ResponseWriter, r *http.Request) {
	answer(w, r, h.log, func(ctx context.Context) (any, error) { return h.r.Workers(ctx) })
}

// answer writes what read returns: domain errors with their status, any
// other as 503 (the database is what can fail), never its text.
func answer(w http.ResponseWriter, r *http.Request, log *slog.Logger, read func(context.Context) (any, error)) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	v, err := read(ctx)
	var de *domain.Error
	switch {
	case err == nil:
		api.WriteJSON(w, http.StatusOK, v)
	case errors.As(err, &de):
		api.WriteDomainError(w, err)
	default:
		log.Warn("query API read failed", "err", err)
		api.WriteError(w, http.StatusServiceUnavailable, domain.CodeUnavailable, "the read model is unavailable right now; retry")
	}
}
