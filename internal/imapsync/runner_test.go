package imapsync_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/imapsync"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/topics"
)

const (
	mailboxID = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
	user      = "alice"
	password  = "correct horse battery"
	owner     = "test-worker"
)

// recReporter records what the runner reports.
type recReporter struct {
	mu       sync.Mutex
	failures []imapsync.Failure
	disables []imapsync.DisableRequest
}

func (r *recReporter) SyncFailed(_ context.Context, f imapsync.Failure) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, f)
}

func (r *recReporter) DisableRequested(_ context.Context, d imapsync.DisableRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.disables = append(r.disables, d)
}

func (r *recReporter) snapshot() ([]imapsync.Failure, []imapsync.DisableRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.failures), slices.Clone(r.disables)
}

type harness struct {
	t       *testing.T
	srv     testServer
	proxy   *proxy
	db      *pgtest.DB
	fence   *mailsync.Fence
	cfg     imapsync.Config
	rep     *recReporter
	job     *mailsync.Job
	setTier func(domain.SyncTier)

	mu        sync.Mutex
	newest    time.Time
	noMail    bool
	onNoMail  func() // called (outside mu) on a "no mail" report
	cancel    context.CancelFunc
	done      chan error
	startedAt time.Time
}

// setup starts a runner's world: a server with user alice, a proxy in
// front of it, a migrated schema with partition 0's epoch taken, and a job
// for the mailbox. The runner is not started.
func setup(t *testing.T, srv testServer, tier domain.SyncTier, tune func(*imapsync.Config, *mailsync.Job), sealPassword string) *harness {
	t.Helper()
	h := &harness{t: t, srv: srv, proxy: newProxy(t, srv.addr()), db: pgtest.New(t), rep: &recReporter{}}
	ctx := t.Context()
	if err := migrations.Apply(ctx, h.db.Pool); err != nil {
		t.Fatal(err)
	}
	h.fence = mailsync.NewFence(h.db.Pool, nil, 0)
	epochs, err := h.fence.Acquire(ctx, owner, []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, sealing.KeySize)
	for i := range key {
		key[i] = byte(i)
	}
	kr, err := sealing.NewKeyring("test-1", map[string][]byte{"test-1": key})
	if err != nil {
		t.Fatal(err)
	}
	if sealPassword == "" {
		sealPassword = password
	}
	mb := domain.MailboxStateRecord{
		MailboxID: mailboxID, OrgID: "0190a1b2-0000-7000-8000-000000000001", UserID: "0190a1b2-0000-7000-8000-000000000002",
		Address: user + "@example.org", Provider: domain.ProviderSMTPIMAP,
		IMAP:    domain.IMAPEndpoint{Host: h.proxy.Host(), Port: h.proxy.Port(), TLS: srv.tls(), Username: user},
		Enabled: true, AddedAt: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC),
	}
	plain, _ := json.Marshal(domain.Credentials{Password: sealPassword})
	sealed, err := kr.Seal(plain, domain.CredentialsAAD(mb.MailboxID, mb.Provider, mb.IMAP))
	if err != nil {
		t.Fatal(err)
	}
	mb.SealedCredentials = &sealed
	h.job, h.setTier = mailsync.NewJob(mb, 0, epochs[0], owner, h.fence.Writer(0, epochs[0], owner, mailboxID), tier,
		func(newest time.Time, known bool) {
			h.mu.Lock()
			hook := h.onNoMail
			if newest.IsZero() {
				h.noMail = true
			} else if newest.After(h.newest) {
				h.newest = newest
				hook = nil
			}
			h.mu.Unlock()
			if hook != nil {
				hook()
			}
		})
	h.job.PollWarm = time.Hour
	h.job.PollCold = time.Hour
	h.cfg = imapsync.Config{
		Keyring: kr, RootCAs: srv.pool(), Reporter: h.rep,
		IdleRefresh: 3 * time.Second, IdleMargin: time.Second, CommandTimeout: 2 * time.Second, DialTimeout: 2 * time.Second,
		BackoffMin: 50 * time.Millisecond, BackoffMax: 300 * time.Millisecond,
		// The test servers listen on loopback, which the runner refuses
		// unless allowlisted.
		Transport: domain.MustTransportPolicy("127.0.0.0/8"),
	}
	if tune != nil {
		tune(&h.cfg, h.job)
	}
	return h
}

// start runs the runner until the test ends (or stop).
func (h *harness) start() {
	h.t.Helper()
	r, err := imapsync.New(h.cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done, h.startedAt = cancel, make(chan error, 1), time.Now()
	go func() { h.done <- r.Run(ctx, h.job) }()
	h.t.Cleanup(func() { h.stop() })
}

// stop cancels the run and checks it returns promptly.
func (h *harness) stop() error {
	h.t.Helper()
	if h.cancel == nil {
		return nil
	}
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.done:
		return err
	case <-time.After(2 * time.Second):
		var b strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		h.t.Errorf("Run did not return within 2s of its context ending\n%s", b.String())
		return nil
	}
}

type row struct {
	role, folder     string
	uidValidity, uid int64
	messageID, from  string
	subject          string
	size             int64
	flags            []string
	internalDate     time.Time
}

func (h *harness) rows() []row {
	h.t.Helper()
	rs, err := h.db.Pool.Query(context.Background(), `SELECT role, folder, uidvalidity, uid, coalesce(message_id, ''),
        coalesce(from_addr, ''), subject, size, flags, internal_date FROM imap_messages ORDER BY role, uid`)
	if err != nil {
		h.t.Fatal(err)
	}
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.role, &r.folder, &r.uidValidity, &r.uid, &r.messageID, &r.from, &r.subject, &r.size, &r.flags, &r.internalDate); err != nil {
			h.t.Fatal(err)
		}
		out = append(out, r)
	}
	if rs.Err() != nil {
		h.t.Fatal(rs.Err())
	}
	return out
}

func (h *harness) byMessageID(id string) (row, bool) {
	for _, r := range h.rows() {
		if r.messageID == id {
			return r, true
		}
	}
	return row{}, false
}

type cursorRow struct {
	role             string
	uidValidity, uid int64
	modseq           int64
}

func (h *harness) cursors() map[string]cursorRow {
	h.t.Helper()
	rs, err := h.db.Pool.Query(context.Background(), `SELECT folder, role, uidvalidity, last_uid, highest_modseq FROM imap_folder_cursors`)
	if err != nil {
		h.t.Fatal(err)
	}
	defer rs.Close()
	out := map[string]cursorRow{}
	for rs.Next() {
		var (
			f string
			c cursorRow
		)
		if err := rs.Scan(&f, &c.role, &c.uidValidity, &c.uid, &c.modseq); err != nil {
			h.t.Fatal(err)
		}
		out[f] = c
	}
	return out
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last state: %s", timeout, what, last)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func (h *harness) waitRows(n int, timeout time.Duration) []row {
	h.t.Helper()
	var rs []row
	waitFor(h.t, timeout, fmt.Sprintf("%d message rows", n), func() (bool, string) {
		rs = h.rows()
		return len(rs) == n, fmt.Sprintf("%d rows: %+v", len(rs), rs)
	})
	return rs
}

func (h *harness) waitMessage(id string, timeout time.Duration) row {
	h.t.Helper()
	var r row
	waitFor(h.t, timeout, "message "+id, func() (bool, string) {
		var ok bool
		r, ok = h.byMessageID(id)
		return ok, fmt.Sprintf("%+v", h.rows())
	})
	return r
}

func (h *harness) checkPeak() {
	h.t.Helper()
	if peak := h.proxy.Overlap(50 * time.Millisecond); peak > 2 {
		fs, _ := h.rep.snapshot()
		h.t.Errorf("the mailbox held %d connections at once; at most 2 allowed (failures: %v)", peak, fs)
	}
}

// ---- the suite ----

var cases = []struct {
	name string
	run  func(t *testing.T, srv testServer)
}{
	{"first sync", testFirstSync},
	{"new mail during IDLE", testNewMailDuringIdle},
	{"mail to Junk during hot", testJunkDuringHot},
	{"UIDVALIDITY change", testUIDValidityChange},
	{"flags change", testFlagsChange},
	{"server closes the connection during IDLE", testServerCloses},
	{"black-holed connection", testBlackHole},
	{"wrong password", testWrongPassword},
	{"untrusted certificate refused", testUntrustedTLS},
	{"fenced write ends the run", testFenced},
	{"warmup placement observed", testWarmupObserved},
	{"expunged message removed", testExpunge},
	{"database down keeps the connection", testStoreDownKeepsConnection},
	{"demoted by its own poll: no second login", testDemotedByOwnPoll},
	{"hot holds one connection; junk checked on it", testHotOneConnection},
}

// TestRunner runs every case against imapmemserver and Dovecot.
func TestRunner(t *testing.T) {
	t.Parallel()
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					srv := s.start(t)
					srv.addUser(t, user, password)
					c.run(t, srv)
				})
			}
		})
	}
}

func testFirstSync(t *testing.T, srv testServer) {
	srv.deliver(t, user, "INBOX", readMsg(t, "inbox1.eml"))
	srv.deliver(t, user, "INBOX", readMsg(t, "inbox2.eml"))
	srv.deliver(t, user, srv.junk(), readMsg(t, "junk1.eml"))
	srv.deliver(t, user, srv.sent(), readMsg(t, "sent1.eml"))
	h := setup(t, srv, domain.SyncTierWarm, func(_ *imapsync.Config, j *mailsync.Job) { j.PollWarm = 300 * time.Millisecond }, "")
	h.start()
	rs := h.waitRows(4, 15*time.Second)

	want := map[string]struct{ role, folder, from, subject string }{
		"warm-1@warm.example": {"inbox", "INBOX", "Ann Warm <ann@warm.example>", "warmup one"},
		"bob-2@example.net":   {"inbox", "INBOX", "Bob <bob@example.net>", "café meeting"},
		"warm-2@warm.example": {"junk", srv.junk(), "Spammy <offers@spam.example>", "warmup two"},
		"alice-3@example.org": {"sent", srv.sent(), "Alice <alice@example.org>", "re: hello"},
	}
	var newest time.Time
	for _, r := range rs {
		id := strings.Trim(r.messageID, "<>")
		w, ok := want[id]
		if !ok {
			t.Errorf("unexpected row %+v", r)
			continue
		}
		if r.role != w.role || !folderIs(r.folder, w.folder) || r.from != w.from || r.subject != w.subject {
			t.Errorf("row %s = %+v, want %+v", id, r, w)
		}
		if r.size <= 0 || r.uid <= 0 || r.uidValidity <= 0 || r.internalDate.IsZero() {
			t.Errorf("row %s lacks size, uid, uidvalidity or date: %+v", id, r)
		}
		if r.internalDate.After(newest) {
			newest = r.internalDate
		}
	}
	cs := h.cursors()
	if len(cs) != 3 {
		t.Errorf("cursors %+v, want INBOX, Junk and Sent", cs)
	}
	if c := cs["INBOX"]; c.uid != 2 || c.role != "inbox" {
		t.Errorf("INBOX cursor %+v", c)
	}
	waitFor(t, 5*time.Second, "newest mail reported", func() (bool, string) {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.newest.Equal(newest), fmt.Sprintf("reported %s, newest row %s", h.newest, newest)
	})
	// Later polls are incremental: nothing is duplicated.
	waitFor(t, 10*time.Second, "three polls", func() (bool, string) {
		_, _, total := h.proxy.Stats()
		return total >= 3, fmt.Sprint(total, " connections")
	})
	if n := len(h.rows()); n != 4 {
		t.Errorf("%d rows after more polls, want 4", n)
	}
	h.checkPeak()
	if err := h.stop(); err != nil {
		t.Errorf("Run returned %v after its context ended, want nil", err)
	}
	if fs, _ := h.rep.snapshot(); len(fs) > 0 {
		t.Errorf("failures reported: %+v", fs[0].Err)
	}
}

// Warm first (polls an hour apart), then hot without a restart: new mail
// arrives through IDLE.
func testNewMailDuringIdle(t *testing.T, srv testServer) {
	srv.deliver(t, user, "INBOX", readMsg(t, "inbox1.eml"))
	h := setup(t, srv, domain.SyncTierWarm, nil, "")
	h.start()
	h.waitRows(1, 15*time.Second)
	h.setTier(domain.SyncTierHot)
	// Give the hot connection time to select INBOX and enter IDLE.
	time.Sleep(time.Second)
	at := time.Now()
	srv.deliver(t, user, "INBOX", readMsg(t, "new1.eml"))
	r := h.waitMessage("dave-4@example.com", 5*time.Second)
	t.Logf("new mail stored %s after delivery", time.Since(at))
	if r.role != "inbox" || r.subject != "arrives during idle" {
		t.Errorf("row %+v", r)
	}
	h.checkPeak()
}

func testJunkDuringHot(t *testing.T, srv testServer) {
	h := setup(t, srv, domain.SyncTierHot, func(_ *imapsync.Config, j *mailsync.Job) { j.PollWarm = 500 * time.Millisecond }, "")
	h.start()
	waitFor(t, 15*time.Second, "INBOX and Junk cursors", func() (bool, string) {
		cs := h.cursors()
		_, inbox := cs["INBOX"]
		_, junk := cs[srv.junk()]
		fs, _ := h.rep.snapshot()
		return inbox && junk, fmt.Sprintf("%+v failures %d %v", cs, len(fs), fs)
	})
	srv.deliver(t, user, srv.junk(), readMsg(t, "junk1.eml"))
	r := h.waitMessage("warm-2@warm.example", 10*time.Second)
	if r.role != "junk" || !folderIs(r.folder, srv.junk()) {
		t.Errorf("row %+v", r)
	}
	h.checkPeak()
}

func testUIDValidityChange(t *testing.T, srv testServer) {
	srv.deliver(t, user, "INBOX", readMsg(t, "inbox1.eml"))
	srv.deliver(t, user, "INBOX", readMsg(t, "inbox2.eml"))
	h := setup(t, srv, domain.SyncTierWarm, func(_ *imapsync.Config, j *mailsync.Job) { j.PollWarm = 300 * time.Millisecond }, "")
	h.start()
	before := h.waitRows(2, 15*time.Second)
	v := srv.newUIDValidity(t, user, "INBOX")
	if int64(v) == before[0].uidValidity {
		t.Fatalf("UIDVALIDITY did not change (%d)", v)
	}
	waitFor(t, 10*time.Second, "INBOX resynced under the new UIDVALIDITY", func() (bool, string) {
		rs := h.rows()
		c := h.cursors()["INBOX"]
		ok := c.uidValidity == int64(v) && len(rs) == 2
		for _, r := range rs {
			ok = ok && r.uidValidity == int64(v)
		}
		return ok, fmt.Sprintf("cursor %+v rows %+v", c, rs)
	})
}

func testFlagsChange(t *testing.T, srv testServer) {
	srv.deliver(t, user, "INBOX", readMsg(t, "inbox1.eml"))
	srv.deliver(t, user, "INBOX", readMsg(t, "inbox2.eml"))
	h := setup(t, srv, domain.SyncTierWarm, func(_ *imapsync.Config, j *mailsync.Job) { j.PollWarm = 300 * time.Millisecond }, "")
	h.start()
	h.waitRows(2, 15*time.Second)
	r0, _ := h.byMessageID("warm-1@warm.example")
	srv.setFlags(t, user, "INBOX", uint32(r0.uid), `\Seen`, `$Warmup`)
	waitFor(t, 10*time.Second, "flags updated", func() (bool, string) {
		r, _ := h.byMessageID("warm-1@warm.example")
		// imapmemserver lower-cases keywords.
		return strings.EqualFold(strings.Join(r.flags, " "), `$Warmup \Seen`), fmt.Sprintf("%v", r.flags)
	})
	// The other message is untouched.
	if r, _ := h.byMessageID("bob-2@example.net"); len(r.flags) != 0 {
		t.Errorf("bob's flags %v, want none", r.flags)
	}
	c := h.cursors()["INBOX"]
	if srv.condstore() && c.modseq == 0 {
		t.Errorf("server has CONDSTORE, cursor has no HIGHESTMODSEQ: %+v", c)
	}
	if !srv.condstore() && c.modseq != 0 {
		t.Errorf("server has no CONDSTORE, cursor has a HIGHESTMODSEQ: %+v", c)
	}
}

func testServerCloses(t *testing.T, srv testServer) {
	srv.deliver(t, user, "INBOX", readMsg(t, "inbox1.eml"))
	h := setup(t, srv, domain.SyncTierHot, nil, "")
	h.start()
	h.waitRows(1, 15*time.Second)
	time.Sleep(500 * time.Millisecond) // in IDLE
	srv.hangUp(t, user, h.proxy)
	waitFor(t, 10*time.Second, "the dropped IDLE reported", func() (bool, string) {
		fs, _ := h.rep.snapshot()
		for _, f := range fs {
			if f.Err.Kind == imapsync.KindNetwork {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d failures", len(fs))
	})
	time.Sleep(time.Second) // reconnected, in IDLE again
	srv.deliver(t, user, "INBOX", readMsg(t, "new1.eml"))
	h.waitMessage("dave-4@example.com", 10*time.Second)
	h.checkPeak()
}

func testBlackHole(t *testing.T, srv testServer) {
	srv.deliver(t, user, "INBOX", readMsg(t, "inbox1.eml"))
	h := setup(t, srv, domain.SyncTierHot, func(c *imapsync.Config, _ *mailsync.Job) {
		c.IdleRefresh, c.IdleMargin, c.CommandTimeout = 2*time.Second, 500*time.Millisecond, time.Second
	}, "")
	h.start()
	h.waitRows(1, 15*time.Second)
	time.Sleep(500 * time.Millisecond) // in IDLE
	if n := h.proxy.BlackHole(); n == 0 {
		t.Fatal("no connection to black-hole")
	}
	at := time.Now()
	srv.deliver(t, user, "INBOX", readMsg(t, "new1.eml"))
	h.waitMessage("dave-4@example.com", 15*time.Second)
	t.Logf("black hole detected and replaced; mail stored %s after delivery", time.Since(at))
	fs, _ := h.rep.snapshot()
	if len(fs) == 0 {
		t.Errorf("the dead connection was not reported")
	}
	for _, f := range fs {
		if f.Err.IsAuth() {
			t.Errorf("black hole reported as %v", f.Err)
		}
	}
	h.checkPeak()
}

func testWrongPassword(t *testing.T, srv testServer) {
	const wrong = "not-the-password-42"
	srv.deliver(t, user, "INBOX", readMsg(t, "inbox1.eml"))
	h := setup(t, srv, domain.SyncTierWarm, func(c *imapsync.Config, _ *mailsync.Job) {
		c.DisableAfter = 400 * time.Millisecond
		// Dovecot delays repeated failures from one address (up to 15 s;
		// login_trusted_networks does not lift it): the login deadline must
		// outlast the delay, as the default 30 s does.
		c.CommandTimeout = 20 * time.Second
	}, wrong)
	h.start()
	waitFor(t, 20*time.Second, "a disable request", func() (bool, string) {
		fs, ds := h.rep.snapshot()
		return len(ds) > 0, fmt.Sprintf("%d failures: %v", len(fs), fs)
	})
	fs, ds := h.rep.snapshot()
	for _, f := range fs {
		if f.Err.Kind != imapsync.KindAuth || f.Err.Reason == "" {
			t.Errorf("failure %+v: want an auth failure with the server's reason", f.Err)
		}
		for _, s := range []string{f.Err.Error(), fmt.Sprintf("%+v", f)} {
			if strings.Contains(s, wrong) || strings.Contains(s, password) {
				t.Errorf("a failure carries the password: %s", s)
			}
		}
		if f.AuthFailingSince.IsZero() {
			t.Errorf("failure without AuthFailingSince: %+v", f)
		}
	}
	if d := ds[0]; d.MailboxID != mailboxID || d.At.Sub(d.AuthFailingSince) < 400*time.Millisecond || strings.Contains(d.Reason, wrong) {
		t.Errorf("disable request %+v", d)
	}
	t.Logf("server's reason: %q", fs[0].Err.Reason)
	var since *time.Time
	if err := h.db.Pool.QueryRow(context.Background(), `SELECT auth_failing_since FROM imap_mailbox_status WHERE mailbox_id = $1`, mailboxID).Scan(&since); err != nil || since == nil {
		t.Errorf("imap_mailbox_status: %v %v", since, err)
	}
	if n := len(h.rows()); n != 0 {
		t.Errorf("%d rows synced with a wrong password", n)
	}
	// The mailbox.disabled event waits in the outbox, once, without the
	// password.
	recs, err := outbox.Pending(context.Background(), h.db.Pool, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var disabled []*domain.MailboxDisabled
	for _, r := range recs {
		if r.Topic != topics.MailboxEvents {
			continue
		}
		if strings.Contains(string(r.Value), wrong) {
			t.Errorf("a record carries the password: %s", r.Value)
		}
		ev, err := topics.Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := ev.Data.(*domain.MailboxDisabled); ok {
			disabled = append(disabled, d)
		}
	}
	if len(disabled) != 1 || disabled[0].MailboxID != mailboxID || disabled[0].Cause != domain.DisableAuthFailing || disabled[0].FailingSince == nil {
		t.Errorf("mailbox.disabled events in the outbox: %+v", disabled)
	}
}

func testUntrustedTLS(t *testing.T, srv testServer) {
	srv.deliver(t, user, "INBOX", readMsg(t, "inbox1.eml"))
	h := setup(t, srv, domain.SyncTierWarm, func(c *imapsync.Config, _ *mailsync.Job) {
		c.RootCAs = x509.NewCertPool() // trusts nothing: the server's self-signed certificate is refused
	}, "")
	h.start()
	waitFor(t, 10*time.Second, "a TLS failure", func() (bool, string) {
		fs, _ := h.rep.snapshot()
		return len(fs) >= 2, fmt.Sprintf("%d failures", len(fs))
	})
	fs, _ := h.rep.snapshot()
	for _, f := range fs {
		if f.Err.Kind != imapsync.KindTLS {
			t.Errorf("failure %v, want kind tls", f.Err)
		}
	}
	t.Logf("TLS failure: %v", fs[0].Err)
	if n := len(h.rows()); n != 0 {
		t.Errorf("%d rows synced over an untrusted connection", n)
	}
}

func testFenced(t *testing.T, srv testServer) {
	srv.deliver(t, user, "INBOX", readMsg(t, "inbox1.eml"))
	h := setup(t, srv, domain.SyncTierWarm, func(_ *imapsync.Config, j *mailsync.Job) { j.PollWarm = 200 * time.Millisecond }, "")
	h.start()
	h.waitRows(1, 15*time.Second)
	if _, err := h.fence.Acquire(context.Background(), "another-worker", []int32{0}); err != nil {
		t.Fatal(err)
	}
	srv.deliver(t, user, "INBOX", readMsg(t, "new1.eml"))
	select {
	case err := <-h.done:
		h.cancel = nil
		if !errors.Is(err, mailsync.ErrFenced) {
			t.Errorf("Run returned %v, want ErrFenced", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run went on after its epoch was taken")
	}
	if _, ok := h.byMessageID("dave-4@example.com"); ok {
		t.Error("a write landed after the epoch moved on")
	}
}

// ---- special-use discovery ----

func TestSpecialUse(t *testing.T) {
	t.Parallel()
	l := func(name string, attrs ...imap.MailboxAttr) *imap.ListData {
		return &imap.ListData{Mailbox: name, Delim: '/', Attrs: attrs}
	}
	for _, tc := range []struct {
		name       string
		list       []*imap.ListData
		junk, sent string
	}{
		{"attributes win over names", []*imap.ListData{l("INBOX"), l("Junk"), l("Quarantine", imap.MailboxAttrJunk), l("Outbox", imap.MailboxAttrSent), l("Sent")}, "Quarantine", "Outbox"},
		{"name fallbacks", []*imap.ListData{l("INBOX"), l("Spam"), l("Sent Items")}, "Spam", "Sent Items"},
		{"fallback order", []*imap.ListData{l("INBOX"), l("Spam"), l("junk")}, "junk", ""},
		{"gmail", []*imap.ListData{l("INBOX"), l("[Gmail]", imap.MailboxAttrNoSelect), l("[Gmail]/Spam"), l("[Gmail]/Sent Mail")}, "[Gmail]/Spam", "[Gmail]/Sent Mail"},
		{"outlook", []*imap.ListData{l("Inbox"), l("Junk E-mail"), l("Sent Items")}, "Junk E-mail", "Sent Items"},
		{"under INBOX", []*imap.ListData{{Mailbox: "INBOX.Junk", Delim: '.'}, {Mailbox: "INBOX.Sent Messages", Delim: '.'}}, "INBOX.Junk", "INBOX.Sent Messages"},
		{"not selectable", []*imap.ListData{l("Junk", imap.MailboxAttrNoSelect), l("Sent", imap.MailboxAttrNonExistent)}, "", ""},
		{"none", []*imap.ListData{l("INBOX"), l("Archive")}, "", ""},
	} {
		junk, sent := imapsync.SpecialUse(tc.list)
		if junk != tc.junk || sent != tc.sent {
			t.Errorf("%s: got junk %q sent %q, want %q %q", tc.name, junk, sent, tc.junk, tc.sent)
		}
	}
}

// A message expunged on the server (or moved away) loses its row, in warm
// polls and through IDLE.
func testExpunge(t *testing.T, srv testServer) {
	srv.deliver(t, user, "INBOX", readMsg(t, "inbox1.eml"))
	srv.deliver(t, user, "INBOX", readMsg(t, "inbox2.eml"))
	srv.deliver(t, user, "INBOX", readMsg(t, "new1.eml"))
	h := setup(t, srv, domain.SyncTierWarm, func(_ *imapsync.Config, j *mailsync.Job) { j.PollWarm = 300 * time.Millisecond }, "")
	h.start()
	h.waitRows(3, 15*time.Second)
	srv.expunge(t, user, "INBOX", 2)
	waitFor(t, 10*time.Second, "the expunged message's row gone", func() (bool, string) {
		rs := h.rows()
		for _, r := range rs {
			if r.uid == 2 {
				return false, fmt.Sprint(len(rs), " rows, uid 2 among them")
			}
		}
		return len(rs) == 2, fmt.Sprint(len(rs), " rows")
	})
	h.setTier(domain.SyncTierHot)
	time.Sleep(500 * time.Millisecond) // into IDLE
	srv.expunge(t, user, "INBOX", 3)
	waitFor(t, 10*time.Second, "the row of a message expunged during IDLE gone", func() (bool, string) {
		rs := h.rows()
		return len(rs) == 1 && rs[0].uid == 1, fmt.Sprintf("%+v", rs)
	})
}

// downWriter fails every write while down is set, as a fenced writer does
// when Postgres is unreachable.
type downWriter struct {
	mailsync.Writer
	down *atomic.Bool
}

func (w downWriter) Write(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if w.down.Load() {
		return errors.New("failed to connect to host=127.0.0.1 user=mailplane database=mailplane: connection refused")
	}
	return w.Writer.Write(ctx, fn)
}

// While the database is down, a hot mailbox keeps its IMAP connections:
// the sync that cannot be stored is retried on the same connection, and
// once the database is back the mail arrives without a reconnect (the
// fleet does not reconnect all at once after an outage).
func testStoreDownKeepsConnection(t *testing.T, srv testServer) {
	var down atomic.Bool
	h := setup(t, srv, domain.SyncTierHot, func(_ *imapsync.Config, j *mailsync.Job) {
		j.Writer = downWriter{Writer: j.Writer, down: &down}
	}, "")
	h.start()
	waitFor(t, 15*time.Second, "INBOX and Junk cursors", func() (bool, string) {
		cs := h.cursors()
		_, inbox := cs["INBOX"]
		_, junk := cs[srv.junk()]
		return inbox && junk, fmt.Sprintf("%+v", cs)
	})
	// Give the hot connection time to enter IDLE.
	time.Sleep(500 * time.Millisecond)
	_, _, before := h.proxy.Stats()
	down.Store(true)
	srv.deliver(t, user, "INBOX", readMsg(t, "new1.eml"))
	waitFor(t, 10*time.Second, "store failures while the database is down", func() (bool, string) {
		fs, _ := h.rep.snapshot()
		n := 0
		for _, f := range fs {
			if f.Err.Kind == imapsync.KindStore {
				n++
			}
		}
		return n >= 3, fmt.Sprint(n, " store failures")
	})
	down.Store(false)
	r := h.waitMessage("dave-4@example.com", 10*time.Second)
	if r.role != "inbox" {
		t.Errorf("row %+v", r)
	}
	if _, _, after := h.proxy.Stats(); after != before {
		t.Errorf("%d connections opened across the outage, want none (the sync was retried on its connection)", after-before)
	}
}

// A warm mailbox with no mail is demoted to cold by the worker as soon as
// its first poll reports no mail, which can be before that poll's LOGOUT
// returns. The completed poll counts for the cold tier: no second login
// (found reading the runner during the fleet rehearsal, BENCHMARKS.md).
func testDemotedByOwnPoll(t *testing.T, srv testServer) {
	h := setup(t, srv, domain.SyncTierWarm, nil, "")
	h.onNoMail = func() { h.setTier(domain.SyncTierCold) }
	h.start()
	waitFor(t, 15*time.Second, "the first poll done and its connection closed", func() (bool, string) {
		h.mu.Lock()
		noMail := h.noMail
		h.mu.Unlock()
		active, _, total := h.proxy.Stats()
		return noMail && active == 0 && total >= 1, fmt.Sprintf("no mail reported %v, %d connections open, %d in all", noMail, active, total)
	})
	// The bug logged in again at once (no pacing outside a worker): a
	// second connection within a second is the regression.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if _, _, total := h.proxy.Stats(); total != 1 {
			t.Fatalf("%d connections after the demotion to cold; the completed poll should have counted", total)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := h.stop(); err != nil {
		t.Errorf("Run returned %v after its context ended, want nil", err)
	}
}

// A hot mailbox holds exactly one connection (one login) however many
// special-use checks run: they are made on the IDLE connection between
// IDLE rounds, by STATUS while nothing changed. Junk mail that arrives
// while in IDLE is stored at the next check, within one poll interval, and
// INBOX mail still arrives through IDLE.
func testHotOneConnection(t *testing.T, srv testServer) {
	const poll = time.Second
	reg := prometheus.NewRegistry()
	h := setup(t, srv, domain.SyncTierHot, func(c *imapsync.Config, j *mailsync.Job) {
		c.Registerer = reg
		// No full check (of servers without CONDSTORE) during the test.
		c.IdleRefresh = time.Minute
		j.PollWarm = poll
	}, "")
	h.start()
	checks := func(outcome string) float64 {
		return counterValue(t, reg, "mailplane_imap_hot_special_checks_total", outcome)
	}
	waitFor(t, 20*time.Second, "three special-use checks by STATUS", func() (bool, string) {
		fs, _ := h.rep.snapshot()
		return checks("unchanged") >= 3, fmt.Sprintf("unchanged %v synced %v, failures %v", checks("unchanged"), checks("synced"), fs)
	})
	synced := checks("synced")
	at := time.Now()
	srv.deliver(t, user, srv.junk(), readMsg(t, "junk1.eml"))
	// One poll interval, plus the time a check takes on a loaded machine.
	r := h.waitMessage("warm-2@warm.example", poll+3*time.Second)
	t.Logf("junk mail stored %s after delivery (poll interval %s)", time.Since(at), poll)
	if r.role != "junk" || !folderIs(r.folder, srv.junk()) {
		t.Errorf("row %+v", r)
	}
	srv.deliver(t, user, "INBOX", readMsg(t, "new1.eml"))
	h.waitMessage("dave-4@example.com", 5*time.Second)
	// Counted once the check is done, just after the row's commit.
	waitFor(t, 5*time.Second, "the junk check counted", func() (bool, string) {
		return checks("synced") > synced, fmt.Sprint(checks("synced")-synced, " folders synced")
	})
	if got := checks("synced") - synced; got != 1 {
		t.Errorf("%v special-use folders selected for one junk delivery, want 1 (the other's STATUS unchanged)", got)
	}
	if _, peak, total := h.proxy.Stats(); peak != 1 || total != 1 {
		fs, _ := h.rep.snapshot()
		t.Errorf("hot mailbox opened %d connections, %d at once; want exactly one (failures: %v)", total, peak, fs)
	}
}

// counterValue is the value of the counter name with a label of value v
// in reg (0 before it counted anything).
func counterValue(t *testing.T, reg *prometheus.Registry, name, v string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetValue() == v {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
