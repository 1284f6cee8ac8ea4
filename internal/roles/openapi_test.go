package roles

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/billing"
	"github.com/mailplane/mailplane/internal/dbpools"
	"github.com/mailplane/mailplane/internal/opshttp"
)

// TestOpenAPIMatchesTheServer: every route the api role mounts (with the
// billing webhook on) is in the OpenAPI document with its method, and the
// document names no route the role does not mount. The console's HTML
// pages are not API routes and are left out. The query API's answers are
// checked against the document's schemas by the console's browser test
// (internal/console), on a running dev mode.
func TestOpenAPIMatchesTheServer(t *testing.T) {
	t.Parallel()
	// Nothing connects: pools and clients dial lazily, and no request is
	// served.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rc := &roleConfig{api: true, log: slog.New(slog.DiscardHandler), reg: prometheus.NewRegistry(), statePartitions: 4, inflightBytes: api.DefaultMaxInflightBytes,
		billing: &billing.Config{Secrets: []string{"whsec_test"}, Prices: map[string]billing.PlanSpec{"price_premium": {Plan: domain.PlanPremium}}}}
	p := newProcess(t.Context(), rc)
	p.pools = &dbpools.Pools{Serve: pool, Runners: pool, Work: pool}
	p.broker = cl
	p.health = opshttp.NewHealth(0, map[string]opshttp.Check{"broker": cl.Ping})
	srv, err := p.buildAPI()
	if err != nil {
		t.Fatal(err)
	}

	var served []string
	for _, r := range srv.Routes() {
		method, path, _ := strings.Cut(r, " ")
		if strings.HasPrefix(path, "/console") {
			continue
		}
		if method == "" {
			t.Errorf("route %q takes every method; the document cannot describe it", r)
		}
		served = append(served, strings.ToLower(method)+" "+path)
	}

	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Errorf("openapi %q, want 3.1.0", doc.OpenAPI)
	}
	var documented []string
	for path, ops := range doc.Paths {
		for method := range ops {
			switch method {
			case "get", "post", "put", "patch", "delete":
				documented = append(documented, method+" "+path)
			}
		}
	}
	slices.Sort(served)
	slices.Sort(documented)
	for _, r := range served {
		if !slices.Contains(documented, r) {
			t.Errorf("served but not in internal/api/openapi.json: %s", r)
		}
	}
	for _, r := range documented {
		if !slices.Contains(served, r) {
			t.Errorf("in internal/api/openapi.json but not served: %s", r)
		}
	}
	for _, want := range []string{"get /v1/mailboxes/{id}", "get /v1/orgs/{id}", "get /v1/workers", "get /v1/openapi.json", "post /v1/events"} {
		if !slices.Contains(served, want) {
			t.Errorf("the api role does not serve %s", want)
		}
	}
}
