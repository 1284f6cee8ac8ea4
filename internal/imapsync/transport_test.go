package imapsync_test

import (
	"bytes"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/imapsync"
	"github.com/mailplane/mailplane/internal/mailsync"
)

// fakeIMAP is the attacker's server: it greets like IMAP, answers nothing
// else and records every connection and every byte it receives.
type fakeIMAP struct {
	ln    net.Listener
	mu    sync.Mutex
	conns int
	got   bytes.Buffer
}

func newFakeIMAP(t *testing.T, greeting string) *fakeIMAP {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeIMAP{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns++
			f.mu.Unlock()
			go func() {
				defer c.Close()
				_, _ = c.Write([]byte(greeting))
				buf := make([]byte, 4096)
				for {
					_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
					n, err := c.Read(buf)
					f.mu.Lock()
					f.got.Write(buf[:n])
					f.mu.Unlock()
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return f
}

func (f *fakeIMAP) port() int { return f.ln.Addr().(*net.TCPAddr).Port }

func (f *fakeIMAP) seen() (int, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conns, f.got.String()
}

// redirect points the job's mailbox at another endpoint, keeping its
// sealed credentials: what a mailbox.added written straight to the topic
// with copied sealed_credentials does.
func redirect(ep domain.IMAPEndpoint) func(*imapsync.Config, *mailsync.Job) {
	return func(c *imapsync.Config, j *mailsync.Job) {
		j.Mailbox.IMAP = ep
		j.PollWarm = 100 * time.Millisecond
	}
}

func waitFailure(t *testing.T, h *harness, kind imapsync.Kind) imapsync.Failure {
	t.Helper()
	var got imapsync.Failure
	waitFor(t, 10*time.Second, "a "+string(kind)+" failure", func() (bool, string) {
		fs, _ := h.rep.snapshot()
		for _, f := range fs {
			if f.Err.Kind == kind {
				got = f
				return true, ""
			}
		}
		return false, fmt.Sprint(fs)
	})
	return got
}

// TestRunnerNeverPresentsCredentialsElsewhere is the redirection attack
// written straight to the log: the mailbox's sealed credentials, copied
// onto an endpoint of the attacker's (allowlisted, so the transport
// policy does not stop it first). They do not open for that endpoint: the
// runner reports credentials_unbound and never connects, so the fake
// server receives no LOGIN or AUTHENTICATE (nothing at all).
func TestRunnerNeverPresentsCredentialsElsewhere(t *testing.T) {
	t.Parallel()
	fake := newFakeIMAP(t, "* OK IMAP4rev1 ready\r\n")
	for name, ep := range map[string]domain.IMAPEndpoint{
		"other port, plain text": {Host: "127.0.0.1", Port: fake.port(), TLS: domain.TLSNone, Username: user},
		"other username":         {Host: "127.0.0.1", Port: fake.port(), TLS: domain.TLSNone, Username: "eve"},
		"other host name":        {Host: "localhost", Port: fake.port(), TLS: domain.TLSNone, Username: user},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			mem := newMem(t).(*memServer)
			mem.addUser(t, user, password)
			h := setup(t, mem, domain.SyncTierWarm, redirect(ep), "")
			h.cfg.Transport = domain.MustTransportPolicy("127.0.0.0/8,localhost")
			h.start()
			f := waitFailure(t, h, imapsync.KindUnbound)
			if strings.Contains(f.Err.Error(), password) {
				t.Errorf("failure carries the password: %s", f.Err)
			}
		})
	}
	// Every subtest has seen its failure: the runners had their chance.
	t.Cleanup(func() {
		if n, got := fake.seen(); n != 0 || strings.Contains(strings.ToUpper(got), "LOGIN") || strings.Contains(strings.ToUpper(got), "AUTHENTICATE") {
			t.Errorf("the attacker's server saw %d connections and %q", n, got)
		}
	})
}

// TestRunnerTransportPolicyAtDialTime: with the mailbox's own sealed
// credentials (so the AAD does not stop it), a loopback server not on the
// allowlist is refused on the resolved address, a host name that resolves
// to loopback (as a rebinding name would) too, plain text to a
// non-allowlisted server too, and a server whose address or name is
// allowlisted on another port only: policy_refused, and the server sees
// no connection at all.
func TestRunnerTransportPolicyAtDialTime(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		host   string
		tls    domain.TLSMode
		policy string
	}{
		"loopback, no allowlist":             {"127.0.0.1", domain.TLSImplicit, ""},
		"name resolving to loopback":         {"localhost", domain.TLSImplicit, "10.0.0.0/8"},
		"plain text, allowlisted elsewhere":  {"127.0.0.1", domain.TLSNone, "192.168.0.0/16,imap.corp.internal"},
		"loopback by name, address unlisted": {"localhost", domain.TLSNone, "127.0.0.2/32"},
		"loopback, another port allowlisted": {"127.0.0.1", domain.TLSNone, "127.0.0.1:1,localhost:1"},
		"by name, another port allowlisted":  {"localhost", domain.TLSImplicit, "127.0.0.1:1,localhost:1"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fake := newFakeIMAP(t, "* OK IMAP4rev1 ready\r\n")
			mem := newMem(t).(*memServer)
			ep := domain.IMAPEndpoint{Host: c.host, Port: fake.port(), TLS: c.tls, Username: user}
			h := setup(t, mem, domain.SyncTierWarm, func(cfg *imapsync.Config, j *mailsync.Job) {
				j.PollWarm = 100 * time.Millisecond
			}, "")
			resealFor(t, h, ep)
			h.cfg.Transport = domain.MustTransportPolicy(c.policy)
			h.start()
			f := waitFailure(t, h, imapsync.KindPolicy)
			if f.Err.Op != "connect" {
				t.Errorf("failure %s", f.Err)
			}
			if n, got := fake.seen(); n != 0 {
				t.Errorf("the server saw %d connections (%q)", n, got)
			}
		})
	}
}

// TestRunnerFailuresCarryNoRemoteBytes: a server's banner and refusal
// texts never reach a failure, and a refused port reads exactly like an
// open port that is not IMAP (one category, one text).
func TestRunnerFailuresCarryNoRemoteBytes(t *testing.T) {
	t.Parallel()
	const banner = "SSH-2.0-OpenSSH_9.6 internal-db-7\r\n"
	notIMAP := newFakeIMAP(t, banner)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	var errs []string
	for _, port := range []int{notIMAP.port(), closedPort} {
		mem := newMem(t).(*memServer)
		ep := domain.IMAPEndpoint{Host: "127.0.0.1", Port: port, TLS: domain.TLSNone, Username: user}
		h := setup(t, mem, domain.SyncTierWarm, func(cfg *imapsync.Config, j *mailsync.Job) { j.PollWarm = 100 * time.Millisecond }, "")
		resealFor(t, h, ep)
		h.start()
		f := waitFailure(t, h, imapsync.KindNetwork)
		s := fmt.Sprintf("%s %+v", f.Err.Error(), f.Err.Reason)
		if strings.Contains(s, "SSH") || strings.Contains(s, "internal-db") || strings.Contains(s, strconv.Itoa(port)) {
			t.Errorf("port %d: failure carries remote bytes or the port: %s", port, s)
		}
		errs = append(errs, f.Err.Error())
		h.stop()
	}
	if errs[0] != errs[1] {
		t.Errorf("an open non-IMAP port and a closed one read differently:\n%s\n%s", errs[0], errs[1])
	}
}

// resealFor points the job's mailbox at ep with its password sealed for
// ep, as a legitimate registration of that endpoint would.
func resealFor(t *testing.T, h *harness, ep domain.IMAPEndpoint) {
	t.Helper()
	h.job.Mailbox.IMAP = ep
	sealed, err := h.cfg.Keyring.Seal([]byte(`{"password":"`+password+`"}`), domain.CredentialsAAD(h.job.Mailbox.MailboxID, h.job.Mailbox.Provider, ep))
	if err != nil {
		t.Fatal(err)
	}
	h.job.Mailbox.SealedCredentials = &sealed
}

// TestRunnerNoPlainLoginWithoutSTARTTLS: a starttls endpoint whose server
// does not upgrade (a stripping attacker, or a server without STARTTLS)
// never gets the password in plain text.
func TestRunnerNoPlainLoginWithoutSTARTTLS(t *testing.T) {
	t.Parallel()
	fake := newFakeIMAP(t, "* OK [CAPABILITY IMAP4rev1 AUTH=PLAIN] ready\r\n")
	mem := newMem(t).(*memServer)
	ep := domain.IMAPEndpoint{Host: "127.0.0.1", Port: fake.port(), TLS: domain.TLSStartTLS, Username: user}
	h := setup(t, mem, domain.SyncTierWarm, func(cfg *imapsync.Config, j *mailsync.Job) { j.PollWarm = 100 * time.Millisecond }, "")
	resealFor(t, h, ep)
	h.start()
	waitFor(t, 10*time.Second, "two failed attempts", func() (bool, string) {
		fs, _ := h.rep.snapshot()
		return len(fs) >= 2, fmt.Sprint(fs)
	})
	h.stop()
	n, got := fake.seen()
	if n == 0 {
		t.Fatal("the runner never connected: the test proves nothing")
	}
	if u := strings.ToUpper(got); strings.Contains(u, "LOGIN") || strings.Contains(u, "AUTHENTICATE") || strings.Contains(got, password) {
		t.Errorf("the server received credentials in plain text: %q", got)
	}
}
