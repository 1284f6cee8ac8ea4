package roles

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/dbpools"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/opsaudit"
	"github.com/mailplane/mailplane/internal/opshttp"
)

// TestAPIAuditsTokensReload: the api role records a reload of its tokens
// file in the operator audit, once, by the process, with the caller names
// it added (never a token).
func TestAPIAuditsTokensReload(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 4)
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none") // dials lazily; nothing reads it
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	cl, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	tokens := filepath.Join(t.TempDir(), "tokens")
	product := access.Line("product", "tok-product-0123456789abcdef0123456789", []string{domain.ScopePublishPublic}, "/product-api") + "\n"
	if err := os.WriteFile(tokens, []byte(product), 0o600); err != nil {
		t.Fatal(err)
	}
	rc := &roleConfig{api: true, tokensFile: tokens, kafka: kcfg, log: slog.New(slog.DiscardHandler), reg: prometheus.NewRegistry(), statePartitions: 4,
		inflightBytes: api.DefaultMaxInflightBytes}
	p := newProcess(t.Context(), rc)
	p.pools = &dbpools.Pools{Serve: pool, Runners: pool, Work: pool}
	p.broker = cl
	p.health = opshttp.NewHealth(0, map[string]opshttp.Check{"broker": cl.Ping})
	if _, err := p.buildAPI(); err != nil {
		t.Fatal(err)
	}
	defer func() { p.cancel(); p.wg.Wait() }()
	billing := access.Line("billing", "tok-billing-0123456789abcdef0123456789", []string{domain.ScopeOps}, "/billing")
	if err := os.WriteFile(tokens+".new", []byte(product+billing+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(tokens+".new", later, later); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tokens+".new", tokens); err != nil {
		t.Fatal(err)
	}
	var recs []opsaudit.Record
	for deadline := time.Now().Add(30 * time.Second); len(recs) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no audit record of the reload")
		}
		if recs, err = opsaudit.Recent(t.Context(), kcfg, 10); err != nil {
			t.Fatal(err)
		}
	}
	r := recs[0]
	if len(recs) != 1 || r.Action != domain.OpsTokensReload || r.Outcome != domain.OpsOK || r.ActorKind != domain.OpsActorProcess ||
		r.Params == nil || r.Params.Added != "billing" || r.Params.Target != tokens || r.Source != "mailplane/api" {
		t.Fatalf("audit records %+v (params %+v)", recs, r.Params)
	}
}
