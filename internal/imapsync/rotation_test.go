package imapsync_test

import (
	"context"
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
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/topics"
)

// rotatingEndpoint rotates refresh tokens on use, as Microsoft does: rt-1
// works once and returns rt-2 with the access token; from then on only
// rt-2 works. Access tokens live one second, so runs exchange often.
type rotatingEndpoint struct {
	srv  *httptest.Server
	mu   sync.Mutex
	used map[string]int // refresh token → exchanges that presented it
}

func newRotatingEndpoint(t *testing.T, mem *memServer) *rotatingEndpoint {
	re := &rotatingEndpoint{used: map[string]int{}}
	n := 0
	re.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		rt := r.Form.Get("refresh_token")
		re.mu.Lock()
		re.used[rt]++
		spent := rt == "rt-1" && re.used["rt-1"] > 1
		n++
		tok := fmt.Sprintf("at-rot-%d", n)
		re.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if (rt != "rt-1" && rt != "rt-2") || spent {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]string{"error": "invalid_grant"})
			return
		}
		mem.mu.Lock()
		mem.tokens[tok] = user
		mem.mu.Unlock()
		resp := map[string]any{"access_token": tok, "expires_in": 1, "token_type": "Bearer"}
		if rt == "rt-1" {
			resp["refresh_token"] = "rt-2"
		}
		json.NewEncoder(w).Encode(resp)
	}))
	t.Cleanup(re.srv.Close)
	return re
}

func (re *rotatingEndpoint) uses(rt string) int {
	re.mu.Lock()
	defer re.mu.Unlock()
	return re.used[rt]
}

// TestOAuthRotationPersistedAcrossOwners: the provider rotates the refresh
// token on the first exchange. The runner uses the new one at once (the
// old one is spent), records it sealed as a credentials_rotated through the
// outbox in its fenced transaction, and a new owner of the partition, whose
// mailbox.state has that rotation folded in, logs in with it.
func TestOAuthRotationPersistedAcrossOwners(t *testing.T) {
	t.Parallel()
	mem := newMem(t).(*memServer)
	mem.addUser(t, user, password)
	mem.deliver(t, user, "INBOX", readMsg(t, "inbox1.eml"))
	re := newRotatingEndpoint(t, mem)
	h := setup(t, mem, domain.SyncTierWarm, func(c *imapsync.Config, j *mailsync.Job) {
		j.PollWarm = 200 * time.Millisecond
		c.OAuth = map[domain.Provider]imapsync.OAuthClient{domain.ProviderOutlook: {TokenURL: re.srv.URL, ClientID: "mailplane-test"}}
		j.Mailbox.Provider = domain.ProviderOutlook
		plain, _ := json.Marshal(domain.Credentials{OAuthRefreshToken: "rt-1"})
		sealed, err := c.Keyring.Seal(plain, domain.CredentialsAAD(j.Mailbox.MailboxID, j.Mailbox.Provider, j.Mailbox.IMAP))
		if err != nil {
			t.Fatal(err)
		}
		j.Mailbox.SealedCredentials = &sealed
	}, "")
	h.start()
	h.waitRows(1, 10*time.Second)
	// Access tokens expire every second: the run keeps exchanging, with rt-2.
	waitFor(t, 10*time.Second, "exchanges with the rotated token", func() (bool, string) {
		return re.uses("rt-2") >= 2, fmt.Sprint(re.uses("rt-1"), " rt-1, ", re.uses("rt-2"), " rt-2")
	})
	if n := re.uses("rt-1"); n != 1 {
		t.Errorf("the spent refresh token was presented %d times, want once", n)
	}
	if fs, _ := h.rep.snapshot(); len(fs) > 0 {
		t.Errorf("failures: %v", fs[0].Err)
	}

	// The rotation waits in the outbox, sealed, bound to the endpoint.
	recs, err := outbox.Pending(context.Background(), h.db.Pool, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var rot []domain.Event
	for _, r := range recs {
		if strings.Contains(string(r.Value), "rt-2") || strings.Contains(string(r.Value), "rt-1") {
			t.Errorf("a record carries a refresh token in plain text: %s", r.Value)
		}
		ev, err := topics.Decode(r)
		if err == nil && ev.Type == domain.TypeCredentialsRotated {
			if r.Topic != topics.MailboxEvents || string(r.Key) != mailboxID {
				t.Errorf("credentials_rotated on %s key %s", r.Topic, r.Key)
			}
			rot = append(rot, ev)
		}
	}
	if len(rot) != 1 {
		t.Fatalf("%d credentials_rotated in the outbox, want 1", len(rot))
	}
	cr := rot[0].Data.(*domain.CredentialsRotated)
	mb := h.job.Mailbox
	plain, err := h.cfg.Keyring.Open(*cr.SealedCredentials, domain.CredentialsAAD(mb.MailboxID, mb.Provider, mb.IMAP))
	if err != nil || !strings.Contains(string(plain), `"rt-2"`) || cr.Cause != domain.RotationOAuth {
		t.Fatalf("rotated credentials: %s %v (cause %s)", plain, err, cr.Cause)
	}

	// Owner change: another worker takes the partition (the first is
	// fenced) and runs the mailbox from mailbox.state with the rotation
	// folded in.
	epochs, err := h.fence.Acquire(context.Background(), "second-owner", []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.stop(); err != nil && !strings.Contains(err.Error(), "fenced") {
		t.Logf("first run ended: %v", err)
	}
	before := re.uses("rt-2")
	next, ok := mailboxstate.Rotated(mb, rot[0], cr)
	if !ok {
		t.Fatalf("the rotation does not apply to the registration it came from: added_at %s, state %s", cr.AddedAt, mb.AddedAt)
	}
	mem.deliver(t, user, "INBOX", readMsg(t, "inbox2.eml"))
	job, _ := mailsync.NewJob(next, 0, epochs[0], "second-owner", h.fence.Writer(0, epochs[0], "second-owner", mailboxID), domain.SyncTierWarm,
		func(time.Time, bool) {})
	job.PollWarm, job.PollCold = 200*time.Millisecond, time.Hour
	rep := &recReporter{}
	cfg := h.cfg
	cfg.Reporter = rep
	r, err := imapsync.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, job) }()
	t.Cleanup(func() { cancel(); <-done })
	h.waitRows(2, 10*time.Second)
	if re.uses("rt-2") <= before || re.uses("rt-1") != 1 {
		t.Errorf("the new owner presented rt-2 %d times, rt-1 %d times", re.uses("rt-2")-before, re.uses("rt-1"))
	}
	if fs, _ := rep.snapshot(); len(fs) > 0 {
		t.Errorf("new owner's failures: %v", fs[0].Err)
	}
}
