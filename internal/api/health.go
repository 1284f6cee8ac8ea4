package api

import (
	"net/http"

	"github.com/mailplane/mailplane/internal/opshttp"
)

// healthChecks returns the checks of the server: WithHealth's, else the broker
// and database checks of WithBrokerCheck and WithDatabaseCheck.
func (c *config) healthChecks() *opshttp.Health {
	if c.health != nil {
		return c.health
	}
	checks := map[string]opshttp.Check{"broker": nil, "database": c.database}
	if c.broker != nil {
		checks["broker"] = c.broker.Ping
	}
	return opshttp.NewHealth(c.healthTimeout, checks)
}

// OpsHandler serves GET /metrics (WithGatherer, or the registerer when it
// gathers) and the detailed GET /healthz (with error text and latencies),
// as opshttp.Handler does for every role. Serve it on a listener only
// operators reach (mailplane's --ops-http).
func (s *Server) OpsHandler() http.Handler {
	return s.recoverer(opshttp.Handler(s.health, s.cfg.gatherer, nil, s.log))
}
