package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

// TestIngestRefusesCopiedSealedCredentials is the credential redirection
// attack of issue 9: copy a mailbox's sealed_credentials from the log and
// post a mailbox.added for the same mailbox id with a host of your own and
// tls none. It is refused, in structured, binary and batch mode, and
// nothing reaches the log.
func TestIngestRefusesCopiedSealedCredentials(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	// The victim registers; its record on the log has the sealed form.
	victim := mailboxAdded()
	resp, body := e.postStructured(victim)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("victim: %d %s", resp.StatusCode, body)
	}
	ar := decodeAccepted(t, body)
	rec := e.brk.Fetch(ar.Events[0].Topic, ar.Events[0].Partition, ar.Events[0].Offset)
	ev, err := topics.Decode(rec)
	if err != nil {
		t.Fatal(err)
	}
	sealed := ev.Data.(*domain.MailboxAdded).SealedCredentials
	var copied map[string]any
	b, _ := json.Marshal(sealed)
	_ = json.Unmarshal(b, &copied)

	e.start = e.watermarks()
	attack := without(victim, "data.credentials")
	attack = with(attack, "id", newUUID())
	attack = with(attack, "data.imap", map[string]any{"host": "attacker.example", "port": 143, "tls": "none", "username": "ada@example.com"})
	attack = with(attack, "data.sealed_credentials", copied)
	sameEndpoint := with(without(victim, "data.credentials"), "id", newUUID())
	sameEndpoint = with(sameEndpoint, "data.sealed_credentials", copied)
	for name, ev := range map[string]map[string]any{"redirected": attack, "same endpoint": sameEndpoint} {
		resp, body := e.postStructured(ev)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), string(domain.CodeSealedCredentialsRefused)) {
			t.Errorf("%s, structured: %d %s", name, resp.StatusCode, body)
		}
		resp, body = e.postBatch(mailboxRemoved(), ev)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), string(domain.CodeSealedCredentialsRefused)) {
			t.Errorf("%s, batch: %d %s", name, resp.StatusCode, body)
		}
		data, _ := json.Marshal(ev["data"])
		resp, body = e.Do(req{ContentType: "application/json", Body: data, Headers: map[string]string{
			"ce-specversion": "1.0", "ce-id": newUUID(), "ce-type": domain.TypeMailboxAdded, "ce-source": "attacker",
		}})
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), string(domain.CodeSealedCredentialsRefused)) {
			t.Errorf("%s, binary: %d %s", name, resp.StatusCode, body)
		}
	}
	// Without any credentials: credentials_required.
	resp, body = e.postStructured(with(without(attack, "data.sealed_credentials"), "id", newUUID()))
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), string(domain.CodeCredentialsRequired)) {
		t.Errorf("no credentials: %d %s", resp.StatusCode, body)
	}
	e.assertNothingProduced()
}

// TestIngestTransportPolicy: with a transport policy, plain text to a
// non-loopback host, internal IP literals outside the allowlist and a
// gmail mailbox at a foreign host are refused (and an allowlisted host on
// a port its entry does not name), nothing reaches the log; allowlisted
// endpoints pass. (IPv6 literals are not host names at ingest; their
// internal forms are refused on the resolved address, TestTransportPolicyDial
// in domain.)
func TestIngestTransportPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{opts: []Option{WithTransportPolicy(domain.MustTransportPolicy("10.20.0.0/16,imap.corp.internal:143"))}})
	refused := map[string]struct {
		imap map[string]any
		prov string
		code domain.Code
	}{
		"plain text to a public host":  {map[string]any{"host": "attacker.example", "port": 143, "tls": "none", "username": "a"}, "smtp_imap", domain.CodePlaintextRefused},
		"metadata address":             {map[string]any{"host": "169.254.169.254", "port": 80, "tls": "implicit", "username": "a"}, "smtp_imap", domain.CodeEndpointRefused},
		"private, not allowlisted":     {map[string]any{"host": "10.30.0.1", "port": 993, "tls": "implicit", "username": "a"}, "smtp_imap", domain.CodeEndpointRefused},
		"loopback, not allowlisted":    {map[string]any{"host": "127.0.0.1", "port": 1143, "tls": "none", "username": "a"}, "smtp_imap", domain.CodeEndpointRefused},
		"gmail at a foreign host":      {map[string]any{"host": "attacker.example", "port": 993, "tls": "implicit", "username": "a"}, "gmail", domain.CodeProviderEndpoint},
		"outlook in plain text":        {map[string]any{"host": "outlook.office365.com", "port": 143, "tls": "none", "username": "a"}, "outlook", domain.CodeProviderEndpoint},
		"allowlisted host, other port": {map[string]any{"host": "imap.corp.internal", "port": 144, "tls": "none", "username": "a"}, "smtp_imap", domain.CodePlaintextRefused},
	}
	for name, c := range refused {
		ev := with(with(mailboxAdded(), "data.imap", c.imap), "data.provider", c.prov)
		resp, body := e.postStructured(ev)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), string(c.code)) {
			t.Errorf("%s: %d %s; want %s", name, resp.StatusCode, body, c.code)
		}
	}
	e.assertNothingProduced()
	for name, ep := range map[string]map[string]any{
		"allowlisted network": {"host": "10.20.3.4", "port": 143, "tls": "none", "username": "a"},
		"allowlisted host":    {"host": "imap.corp.internal", "port": 143, "tls": "none", "username": "a"},
		"public with TLS":     {"host": "imap.example.com", "port": 993, "tls": "implicit", "username": "a"},
	} {
		resp, body := e.postStructured(with(mailboxAdded(), "data.imap", ep))
		if resp.StatusCode != http.StatusAccepted {
			t.Errorf("%s: %d %s", name, resp.StatusCode, body)
		}
	}
}
