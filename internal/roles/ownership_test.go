package roles

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/ownership"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/producer"
)

// TestAPIBackfillsOwnership: an api process on a database whose claims
// were never backfilled (an upgraded installation) backfills them from
// the log, mapping sources to the tokens file's tenants, and records it;
// on one already backfilled it reads nothing.
func TestAPIBackfillsOwnership(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `DELETE FROM ownership_backfills`); err != nil {
		t.Fatal(err)
	}
	kcfg := kafkatest.Config(t, 4)
	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	const mb, org = "0190a5b2-4c5e-7b1a-9c3d-00000000c0bb", "0190a5b2-4c5e-7b1a-9c3d-00000000a0bb"
	add := domain.Event{ID: domain.NewEventID(), Type: domain.TypeMailboxAdded, Source: "/product-api/sessions", Subject: mb, Time: time.Now().UTC(),
		Data: &domain.MailboxAdded{MailboxID: mb, OrgID: org, UserID: mb, Address: "a@example.com", Provider: domain.ProviderSMTPIMAP,
			IMAP:              domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit, Username: "a"},
			SealedCredentials: &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAA", Ciphertext: "c2VhbGVk"}}}
	if _, err := producer.New(kc, producer.WithNamespace(kcfg.Namespace)).Publish(ctx, add); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(access.Line("product", "tok-product-0123456789abcdef0123456789", []string{domain.ScopePublishPublic}, "/product-api")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := newProcess(ctx, &roleConfig{api: true, tokensFile: tokens, kafka: kcfg, log: slog.New(slog.DiscardHandler), reg: prometheus.NewRegistry()})
	store := ownership.NewStore(db.Pool)
	if err := p.backfillOwnershipOnce(ctx, store, p.log); err != nil {
		t.Fatal(err)
	}
	if ok, err := store.Backfilled(ctx); err != nil || !ok {
		t.Fatalf("backfilled: %v %v", ok, err)
	}
	k := ownership.Key{Kind: domain.OwnedMailbox, ID: mb}
	if cs, err := store.Claims(ctx, k); err != nil || cs[k].Owner != "/product-api" {
		t.Fatalf("claim %+v %v, want /product-api", cs, err)
	}
	// Backfilled: the next start reads no log (a broker it cannot reach
	// makes no difference).
	p.rc.kafka.Brokers = []string{"127.0.0.1:1"}
	if err := p.backfillOwnershipOnce(ctx, store, p.log); err != nil {
		t.Fatalf("second start: %v", err)
	}
}
