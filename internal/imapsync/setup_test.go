package imapsync_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapserver"
	"github.com/emersion/go-imap/v2/imapserver/imapmemserver"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/imapsync"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/sealing"
)

// TestSettingUpBounded: a runner starting many hot mailboxes at once has
// at most Config.MaxSettingUp of them connected and not yet in IDLE at any
// time (counted by a proxy that reads the plain-text IMAP stream), and all
// of them reach IDLE. With a bound as large as the fleet, the same setups
// overlap beyond it: the proxy's count does see overlap.
func TestSettingUpBounded(t *testing.T) {
	t.Parallel()
	const n, bound = 12, 3
	for _, tc := range []struct {
		name     string
		maxSetup int
	}{{"bounded", bound}, {"unbounded", n}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			peak := runSetupFleet(t, n, tc.maxSetup)
			switch {
			case tc.maxSetup == bound && peak > bound:
				t.Fatalf("%d mailboxes setting up at once, bound %d", peak, bound)
			case tc.maxSetup == bound && peak < bound:
				t.Fatalf("at most %d setting up at once: the bound %d was never reached, the test shows nothing", peak, bound)
			case tc.maxSetup == n && peak <= bound:
				t.Fatalf("without the bound only %d set up at once: the proxy does not see overlapping setups", peak)
			}
			t.Logf("%s: at most %d of %d mailboxes setting up at once", tc.name, peak, n)
		})
	}
}

// runSetupFleet runs n hot mailboxes on one runner (MaxSettingUp
// maxSetup) against a plain-text imapmemserver behind a proxy that holds
// each greeting 200 ms, waits until all are in IDLE and returns the peak
// number of connections not yet in IDLE.
func runSetupFleet(t *testing.T, n, maxSetup int) int {
	mem := imapmemserver.New()
	for i := range n {
		u := imapmemserver.NewUser(benchUser(i), benchPass(i))
		for _, f := range []string{"INBOX", "Junk", "Sent"} {
			if err := u.Create(f, nil); err != nil {
				t.Fatal(err)
			}
		}
		mem.AddUser(u)
	}
	srv := imapserver.New(&imapserver.Options{
		NewSession: func(*imapserver.Conn) (imapserver.Session, *imapserver.GreetingData, error) {
			return mem.NewSession(), nil, nil
		},
		Caps:         imap.CapSet{imap.CapIMAP4rev1: {}, imap.CapIdle: {}},
		Logger:       log.New(io.Discard, "", 0),
		InsecureAuth: true,
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	px := newProxy(t, ln.Addr().String())
	px.greetDelay.Store(int64(200 * time.Millisecond))

	ctx := t.Context()
	db := pgtest.New(t)
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	fence := mailsync.NewFence(db.Pool, nil, 0)
	epochs, err := fence.Acquire(ctx, owner, []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	key := bytes.Repeat([]byte{3}, sealing.KeySize)
	kr, err := sealing.NewKeyring("test-1", map[string][]byte{"test-1": key})
	if err != nil {
		t.Fatal(err)
	}
	r, err := imapsync.New(imapsync.Config{Keyring: kr, MaxSettingUp: maxSetup, CommandTimeout: 5 * time.Second,
		BackoffMin: 50 * time.Millisecond, BackoffMax: 300 * time.Millisecond, Transport: domain.MustTransportPolicy("127.0.0.0/8")})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	ep := domain.IMAPEndpoint{Host: px.Host(), Port: px.Port(), TLS: domain.TLSNone}
	for i := range n {
		id := fmt.Sprintf("0190a1b2-c3d4-7e5f-8a9b-%012x", i)
		ep.Username = benchUser(i)
		plain, _ := json.Marshal(domain.Credentials{Password: benchPass(i)})
		sealed, err := kr.Seal(plain, domain.CredentialsAAD(id, domain.ProviderSMTPIMAP, ep))
		if err != nil {
			t.Fatal(err)
		}
		mb := domain.MailboxStateRecord{MailboxID: id, OrgID: "0190a1b2-0000-7000-8000-000000000001",
			UserID: "0190a1b2-0000-7000-9000-" + fmt.Sprintf("%012x", i), Address: benchUser(i) + "@example.org",
			Provider: domain.ProviderSMTPIMAP, IMAP: ep, SealedCredentials: &sealed, Enabled: true,
			AddedAt: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
		job, _ := mailsync.NewJob(mb, 0, epochs[0], owner, fence.Writer(0, epochs[0], owner, id), domain.SyncTierHot, nil)
		job.PollWarm, job.PollCold = time.Hour, time.Hour
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(rctx, job); err != nil {
				t.Errorf("Run %s: %v", id, err)
			}
		}()
	}
	waitFor(t, 30*time.Second, strconv.Itoa(n)+" mailboxes in IDLE", func() (bool, string) {
		px.mu.Lock()
		defer px.mu.Unlock()
		idle := 0
		for c := range px.conns {
			if c.idled {
				idle++
			}
		}
		return idle == n, fmt.Sprintf("%d in IDLE, %d setting up", idle, px.settingUp)
	})
	_, _, total := px.Stats()
	if total != n {
		t.Errorf("%d connections for %d mailboxes: a setup failed and was retried", total, n)
	}
	return px.SetupPeak()
}
