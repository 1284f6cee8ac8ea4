package imapsync_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/imapsync"
	"github.com/mailplane/mailplane/internal/mailsync"
)

// tokenEndpoint is a provider's OAuth token endpoint: refresh token
// rt-good gets a new access token each time, the others are refused.
type tokenEndpoint struct {
	srv   *httptest.Server
	mu    sync.Mutex
	calls int
}

func newTokenEndpoint(t *testing.T, mem *memServer) *tokenEndpoint {
	te := &tokenEndpoint{}
	te.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		te.mu.Lock()
		te.calls++
		n := te.calls
		te.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.Form.Get("grant_type") != "refresh_token" || r.Form.Get("client_id") != "mailplane-test" || r.Form.Get("client_secret") != "s3cret" {
			w.WriteHeader(http.StatusUnauthorized)
			json.NewEncoder(w).Encode(map[string]string{"error": "invalid_client"})
			return
		}
		if r.Form.Get("refresh_token") != "rt-good" {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]string{"error": "invalid_grant", "error_description": "Token has been expired or revoked."})
			return
		}
		tok := fmt.Sprintf("at-%d", n)
		mem.mu.Lock()
		mem.tokens[tok] = user
		mem.mu.Unlock()
		json.NewEncoder(w).Encode(map[string]any{"access_token": tok, "expires_in": 3600, "token_type": "Bearer"})
	}))
	t.Cleanup(te.srv.Close)
	return te
}

func (te *tokenEndpoint) count() int {
	te.mu.Lock()
	defer te.mu.Unlock()
	return te.calls
}

// oauthSetup is setup for a gmail mailbox whose sealed credentials hold
// refreshToken.
func oauthSetup(t *testing.T, mem *memServer, te *tokenEndpoint, refreshToken string, tune func(*imapsync.Config)) *harness {
	return setup(t, mem, domain.SyncTierWarm, func(c *imapsync.Config, j *mailsync.Job) {
		j.PollWarm = 200 * time.Millisecond
		c.OAuth = map[domain.Provider]imapsync.OAuthClient{domain.ProviderGmail: {TokenURL: te.srv.URL, ClientID: "mailplane-test", ClientSecret: "s3cret"}}
		plain, _ := json.Marshal(domain.Credentials{OAuthRefreshToken: refreshToken})
		j.Mailbox.Provider = domain.ProviderGmail
		sealed, err := c.Keyring.Seal(plain, domain.CredentialsAAD(j.Mailbox.MailboxID, j.Mailbox.Provider, j.Mailbox.IMAP))
		if err != nil {
			t.Fatal(err)
		}
		j.Mailbox.SealedCredentials = &sealed
		if tune != nil {
			tune(c)
		}
	}, "")
}

// TestRunnerOAuth runs on imapmemserver only: Dovecot's OAuth needs an
// introspection service this suite does not run.
func TestRunnerOAuth(t *testing.T) {
	t.Parallel()
	t.Run("login with XOAUTH2, token cached", func(t *testing.T) {
		t.Parallel()
		mem := newMem(t).(*memServer)
		mem.addUser(t, user, password)
		mem.deliver(t, user, "INBOX", readMsg(t, "inbox1.eml"))
		te := newTokenEndpoint(t, mem)
		h := oauthSetup(t, mem, te, "rt-good", nil)
		h.start()
		h.waitRows(1, 10*time.Second)
		waitFor(t, 10*time.Second, "three polls", func() (bool, string) {
			_, _, total := h.proxy.Stats()
			return total >= 3, fmt.Sprint(total, " connections")
		})
		if n := te.count(); n != 1 {
			t.Errorf("token endpoint called %d times over several polls, want 1 (cached)", n)
		}
		if fs, _ := h.rep.snapshot(); len(fs) > 0 {
			t.Errorf("failures: %+v", fs[0].Err)
		}
	})
	t.Run("token refused by the server: exchanged again", func(t *testing.T) {
		t.Parallel()
		mem := newMem(t).(*memServer)
		mem.addUser(t, user, password)
		mem.deliver(t, user, "INBOX", readMsg(t, "inbox1.eml"))
		te := newTokenEndpoint(t, mem)
		h := oauthSetup(t, mem, te, "rt-good", nil)
		h.start()
		h.waitRows(1, 10*time.Second)
		mem.mu.Lock()
		clear(mem.tokens) // the provider revoked the access token
		mem.mu.Unlock()
		mem.deliver(t, user, "INBOX", readMsg(t, "inbox2.eml"))
		h.waitRows(2, 10*time.Second)
		if n := te.count(); n != 2 {
			t.Errorf("token endpoint called %d times, want 2", n)
		}
	})
	t.Run("refresh token revoked: auth failure, then disabled", func(t *testing.T) {
		t.Parallel()
		mem := newMem(t).(*memServer)
		mem.addUser(t, user, password)
		te := newTokenEndpoint(t, mem)
		h := oauthSetup(t, mem, te, "rt-revoked-42", func(c *imapsync.Config) { c.DisableAfter = 300 * time.Millisecond })
		h.start()
		waitFor(t, 10*time.Second, "a disable request", func() (bool, string) {
			fs, ds := h.rep.snapshot()
			return len(ds) > 0, fmt.Sprintf("%d failures", len(fs))
		})
		fs, _ := h.rep.snapshot()
		for _, f := range fs {
			// A category and the standard code; the endpoint's own words
			// (error_description) stay out of sync.audit.
			if f.Err.Kind != imapsync.KindAuth || f.Err.Code != "invalid_grant" || f.Err.Reason == "" || strings.Contains(f.Err.Error(), "revoked") {
				t.Errorf("failure %+v: want an auth failure with invalid_grant and our words only", f.Err)
			}
			if s := fmt.Sprintf("%+v %s", f, f.Err.Error()); strings.Contains(s, "rt-revoked-42") || strings.Contains(s, "s3cret") {
				t.Errorf("a failure carries a secret: %s", s)
			}
		}
		if _, _, total := h.proxy.Stats(); total != 0 {
			t.Errorf("%d IMAP connections without a token, want none", total)
		}
	})
	t.Run("no OAuth client for the provider", func(t *testing.T) {
		t.Parallel()
		mem := newMem(t).(*memServer)
		mem.addUser(t, user, password)
		te := newTokenEndpoint(t, mem)
		h := oauthSetup(t, mem, te, "rt-good", func(c *imapsync.Config) { c.OAuth = nil })
		h.start()
		waitFor(t, 10*time.Second, "a credentials failure", func() (bool, string) {
			fs, _ := h.rep.snapshot()
			return len(fs) > 0 && fs[0].Err.Kind == imapsync.KindCredentials, fmt.Sprint(fs)
		})
	})
}

// TestRunnerAuthFailuresBackOff: a refused grant is not exchanged again at
// the poll interval (or BackoffMax) for a day: the delay keeps doubling up
// to AuthBackoffMax, and exchanges are spaced accordingly.
func TestRunnerAuthFailuresBackOff(t *testing.T) {
	t.Parallel()
	mem := newMem(t).(*memServer)
	mem.addUser(t, user, password)
	te := newTokenEndpoint(t, mem)
	h := oauthSetup(t, mem, te, "rt-revoked-7", func(c *imapsync.Config) {
		c.AuthBackoffMax = 30 * time.Second
		c.DisableAfter = time.Hour
	})
	h.start()
	const n = 6
	waitFor(t, 20*time.Second, fmt.Sprintf("%d auth failures", n), func() (bool, string) {
		fs, _ := h.rep.snapshot()
		return len(fs) >= n, fmt.Sprint(len(fs))
	})
	fs, _ := h.rep.snapshot()
	for i, f := range fs[:n] {
		// BackoffMin 50 ms doubled: at least half of 50 ms × 2^(i).
		min := 25 * time.Millisecond << i
		if f.Err.Kind != imapsync.KindAuth || f.RetryIn < min {
			t.Errorf("failure %d: %s, retry in %s; want an auth failure retried in at least %s", i+1, f.Err, f.RetryIn, min)
		}
	}
	if last := fs[n-1].RetryIn; last <= h.cfg.BackoffMax || last <= h.job.PollWarm {
		t.Errorf("the %dth refusal is retried in %s: capped by BackoffMax %s or the poll interval %s", n, last, h.cfg.BackoffMax, h.job.PollWarm)
	}
	if c := te.count(); c > n+1 {
		t.Errorf("%d exchanges of a refused refresh token for %d failures", c, n)
	}
}
