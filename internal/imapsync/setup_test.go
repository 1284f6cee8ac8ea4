package imapsync_test

import (
	"bytes"
	"context"
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
// at most Config.MaxSettingUp of them between their first command after
// the login (LIST) and their IDLE at any time, counted by a proxy that
// reads the plain-text IMAP stream, and all of them reach IDLE. With a
// bound as large as the fleet, the same setups overlap beyond it: the
// proxy's count does see overlap.
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

// slowSelect answers SELECT after 200 ms.
type slowSelect struct{ imapserver.Session }

func (s slowSelect) Select(name string, opts *imap.SelectOptions) (*imap.SelectData, error) {
	time.Sleep(200 * time.Millisecond)
	return s.Session.Select(name, opts)
}

// setupWorld is a runner's world for several mailboxes: a migrated
// schema with partition 0's epoch taken and a keyring.
type setupWorld struct {
	t      *testing.T
	kr     *sealing.Keyring
	fence  *mailsync.Fence
	epoch  int64
	wg     sync.WaitGroup
	cancel context.CancelFunc
	ctx    context.Context
}

func newSetupWorld(t *testing.T) *setupWorld {
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
	kr, err := sealing.NewKeyring("test-1", map[string][]byte{"test-1": bytes.Repeat([]byte{3}, sealing.KeySize)})
	if err != nil {
		t.Fatal(err)
	}
	w := &setupWorld{t: t, kr: kr, fence: fence, epoch: epochs[0]}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	t.Cleanup(func() { w.cancel(); w.wg.Wait() })
	return w
}

// runner returns a runner with at most maxSetup setups in flight.
func (w *setupWorld) runner(maxSetup int, cmdTimeout time.Duration) *imapsync.Runner {
	r, err := imapsync.New(imapsync.Config{Keyring: w.kr, MaxSettingUp: maxSetup, SetupSharePerHost: 100, CommandTimeout: cmdTimeout, DialTimeout: cmdTimeout,
		BackoffMin: 50 * time.Millisecond, BackoffMax: 300 * time.Millisecond, Transport: domain.MustTransportPolicy("127.0.0.0/8")})
	if err != nil {
		w.t.Fatal(err)
	}
	return r
}

// run starts bench user i's hot mailbox on r, at host:port in plain text.
func (w *setupWorld) run(r *imapsync.Runner, i int, host string, port int) {
	w.runAt(r, fmt.Sprintf("0190a1b2-c3d4-7e5f-8a9b-%012x", i), i, host, port)
}

// plainServer starts imapmemserver in plain text with bench users 0..n-1
// (INBOX, Junk, Sent), SELECT answered after 200 ms.
func plainServer(t *testing.T, n int) string {
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
			return slowSelect{mem.NewSession()}, nil, nil
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
	return ln.Addr().String()
}

// runSetupFleet runs n hot mailboxes on one runner (MaxSettingUp
// maxSetup) against a plain-text imapmemserver behind a proxy, waits until
// all are in IDLE and returns the peak number of connections setting up.
// The server answers SELECT after 200 ms, so setups last long enough to
// overlap.
func runSetupFleet(t *testing.T, n, maxSetup int) int {
	px := newProxy(t, plainServer(t, n))
	w := newSetupWorld(t)
	r := w.runner(maxSetup, 5*time.Second)
	for i := range n {
		w.run(r, i, px.Host(), px.Port())
	}
	waitFor(t, 30*time.Second, strconv.Itoa(n)+" mailboxes in IDLE", func() (bool, string) {
		idle, settingUp := px.Idled()
		return idle == n, fmt.Sprintf("%d in IDLE, %d setting up", idle, settingUp)
	})
	_, _, total := px.Stats()
	if total != n {
		t.Errorf("%d connections for %d mailboxes: a setup failed and was retried", total, n)
	}
	return px.SetupPeak()
}

// TestSettingUpNotHeldByTarpits: servers that accept the connection and
// never greet (a dead service, a tarpit, a hostile endpoint a user
// registered) hold no setup slot while the runner waits for them: with
// one slot and three tarpit mailboxes waiting out a 20 s command timeout,
// a healthy mailbox still reaches IDLE within seconds.
func TestSettingUpNotHeldByTarpits(t *testing.T) {
	t.Parallel()
	tarpit, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := tarpit.Accept()
			if err != nil {
				return
			}
			accepted <- c // held open, never written to
		}
	}()
	t.Cleanup(func() {
		tarpit.Close()
		for {
			select {
			case c := <-accepted:
				c.Close()
			default:
				return
			}
		}
	})
	px := newProxy(t, plainServer(t, 4))
	w := newSetupWorld(t)
	r := w.runner(1, 20*time.Second)
	tp := tarpit.Addr().(*net.TCPAddr).Port
	for i := range 3 {
		w.run(r, i, "127.0.0.1", tp)
	}
	waitFor(t, 5*time.Second, "the tarpit holding three connections", func() (bool, string) {
		return len(accepted) == 3, fmt.Sprintf("%d accepted", len(accepted))
	})
	start := time.Now()
	w.run(r, 3, px.Host(), px.Port())
	waitFor(t, 8*time.Second, "the healthy mailbox in IDLE", func() (bool, string) {
		px.mu.Lock()
		defer px.mu.Unlock()
		for c := range px.conns {
			if c.idled {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d connections at the healthy server", len(px.conns))
	})
	t.Logf("healthy mailbox in IDLE %s after it started, three tarpit mailboxes waiting", time.Since(start).Round(time.Millisecond))
}
