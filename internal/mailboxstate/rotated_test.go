package mailboxstate_test

import (
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailboxstate"
)

// TestRotatedAppliesToItsRegistration: a rotation replaces the credentials
// of the registration it was computed from, and of no later one (a
// mailbox.added in between brought another endpoint and fresh credentials).
func TestRotatedAppliesToItsRegistration(t *testing.T) {
	t.Parallel()
	added := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	old := &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAA", Ciphertext: "AAAA"}
	fresh := &domain.SealedSecret{KeyID: "k2", Alg: domain.SealAlg, Nonce: "BBBB", Ciphertext: "BBBB"}
	m := domain.MailboxStateRecord{MailboxID: "0190a5b2-4c5e-7b1a-9c3d-00000000c001", SealedCredentials: old, Enabled: true, AddedAt: added, SourceEventID: "a"}
	e := domain.Event{ID: "r"}
	got, ok := mailboxstate.Rotated(m, e, &domain.CredentialsRotated{MailboxID: m.MailboxID, SealedCredentials: fresh, Cause: domain.RotationReseal, AddedAt: added})
	if !ok || got.SealedCredentials != fresh || got.SourceEventID != e.Key() || !got.Enabled || !got.AddedAt.Equal(added) {
		t.Errorf("rotation of its registration: %+v, %v", got, ok)
	}
	readded := m
	readded.AddedAt = added.Add(time.Minute)
	got, ok = mailboxstate.Rotated(readded, e, &domain.CredentialsRotated{MailboxID: m.MailboxID, SealedCredentials: fresh, Cause: domain.RotationOAuth, AddedAt: added})
	if ok || got.SealedCredentials != old || got.SourceEventID != "a" {
		t.Errorf("stale rotation applied: %+v, %v", got, ok)
	}
}
