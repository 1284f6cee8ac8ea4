package projections

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
)

// TestRegistryCredentialsRotated: a credentials_rotated replaces the
// registry's sealed credentials and nothing else, in the batch of the add
// or a later one; a later mailbox.added replaces it.
func TestRegistryCredentialsRotated(t *testing.T) {
	t.Parallel()
	pool := pgtest.Schema(t)
	ctx := context.Background()
	if err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	n := 0
	ev := func(d domain.Data) domain.Event {
		n++
		return domain.Event{ID: uuid.NewString(), Type: d.EventType(), Time: t0.Add(time.Duration(n) * time.Second), Data: d}
	}
	sealed := func(key string) *domain.SealedSecret {
		return &domain.SealedSecret{KeyID: key, Alg: domain.SealAlg, Nonce: "AAAA", Ciphertext: "AAAA"}
	}
	added := func(id, key string) domain.Event {
		return ev(&domain.MailboxAdded{MailboxID: id, OrgID: uuid.NewString(), UserID: uuid.NewString(), Address: "a@example.com",
			Provider: domain.ProviderSMTPIMAP, IMAP: domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: "implicit", Username: "a"},
			SealedCredentials: sealed(key)})
	}
	rotated := func(id, key string) domain.Event {
		return ev(&domain.CredentialsRotated{MailboxID: id, SealedCredentials: sealed(key), Cause: domain.RotationReseal, AddedAt: t0})
	}
	r := NewRegistry()
	apply := func(events ...domain.Event) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return r.Apply(ctx, tx, records(events)) }); err != nil {
			t.Fatal(err)
		}
	}
	keyOf := func(id string) (key, host string) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT sealed_credentials->>'key_id', imap_host FROM mailboxes WHERE mailbox_id = $1`, id).Scan(&key, &host); err != nil {
			t.Fatal(err)
		}
		return key, host
	}
	m1, m2 := uuid.NewString(), uuid.NewString()
	apply(added(m1, "k1"), added(m2, "k1"), rotated(m2, "k2"))
	if k, _ := keyOf(m2); k != "k2" {
		t.Errorf("rotated in the add's batch: key %s, want k2", k)
	}
	apply(rotated(m1, "k2"))
	if k, h := keyOf(m1); k != "k2" || h != "imap.example.com" {
		t.Errorf("rotated alone: key %s host %s, want k2 and the added host kept", k, h)
	}
	apply(added(m1, "k3"))
	if k, _ := keyOf(m1); k != "k3" {
		t.Errorf("added after a rotation: key %s, want k3", k)
	}
	apply(rotated(m2, "k4"), added(m2, "k5"))
	if k, _ := keyOf(m2); k != "k5" {
		t.Errorf("added after a rotation in one batch: key %s, want k5", k)
	}
}
