package sealing_test

import (
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/sealing"
)

// TestDuplicateKeyIDRefused: a second key under an id used to replace the
// first silently, so every blob sealed with the first stopped opening.
func TestDuplicateKeyIDRefused(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{
		"k1:" + testKey(1) + ",k1:" + testKey(2),
		"k1:" + testKey(1) + ", k2:" + testKey(2) + " ,k1:" + testKey(1),
	} {
		k, err := sealing.ParseKeys(spec, "")
		if domain.ErrorCode(err) != domain.CodeDuplicateKeyID || k != nil {
			t.Errorf("%s: keyring %v, err %v; want duplicate_key_id", spec, k, err)
		}
	}
	if _, err := sealing.ParseKeys("k1:"+testKey(1)+",k2:"+testKey(2), ""); err != nil {
		t.Fatalf("distinct ids: %v", err)
	}
}

// TestCredentialsBoundToEndpoint: sealed credentials open only for the
// mailbox, provider, host, port, TLS mode and username they were sealed
// for, and a blob sealed under the old mailbox-id-only binding (v1) opens
// for none.
func TestCredentialsBoundToEndpoint(t *testing.T) {
	t.Parallel()
	k, err := sealing.ParseKeys("k1:"+testKey(1), "")
	if err != nil {
		t.Fatal(err)
	}
	m := &domain.MailboxAdded{
		MailboxID: "0190a5b2-4c5e-7b1a-9c3d-00000000c001", Provider: domain.ProviderSMTPIMAP,
		IMAP:        domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit, Username: "ada@example.com"},
		Credentials: &domain.Credentials{Password: "dev-password"},
	}
	if err := m.SealWith(k.Seal); err != nil {
		t.Fatal(err)
	}
	if got, err := k.Open(*m.SealedCredentials, m.AAD()); err != nil || !strings.Contains(string(got), "dev-password") {
		t.Fatalf("open for its own endpoint: %q, %v", got, err)
	}
	moved := map[string]func(*domain.MailboxAdded){
		"mailbox":  func(c *domain.MailboxAdded) { c.MailboxID = "0190a5b2-4c5e-7b1a-9c3d-00000000c002" },
		"provider": func(c *domain.MailboxAdded) { c.Provider = domain.ProviderOutlook },
		"host":     func(c *domain.MailboxAdded) { c.IMAP.Host = "attacker.example" },
		"port":     func(c *domain.MailboxAdded) { c.IMAP.Port = 143 },
		"tls":      func(c *domain.MailboxAdded) { c.IMAP.TLS = domain.TLSNone },
		"username": func(c *domain.MailboxAdded) { c.IMAP.Username = "eve@example.com" },
		// Length prefixes: moving bytes between fields changes the data.
		"split": func(c *domain.MailboxAdded) {
			c.IMAP.Host, c.IMAP.Username = "imap.example.com;", "ada@example.com"[1:]
		},
	}
	for name, move := range moved {
		c := *m
		move(&c)
		if got, err := k.Open(*m.SealedCredentials, c.AAD()); err == nil {
			t.Errorf("%s changed: credentials opened (%d bytes)", name, len(got))
		}
	}
	// A v1 blob (bound to the mailbox id only) does not open under v2.
	v1, err := k.Seal([]byte(`{"password":"dev-password"}`), []byte("mailplane.mailbox.credentials.v1:"+m.MailboxID))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Open(v1, m.AAD()); err == nil {
		t.Fatal("a v1 (mailbox-id-only) sealed blob opened under the endpoint binding")
	}
}
