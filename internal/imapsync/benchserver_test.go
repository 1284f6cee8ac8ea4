package imapsync_test

// The IMAP server of the benchmarks in bench_test.go runs in another
// process: this test binary, re-executed with envBenchServer set, so that
// the runner's memory and CPU are measured apart from the server's.
// TestMain turns such a process into the server instead of running tests.

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapserver"
	"github.com/emersion/go-imap/v2/imapserver/imapmemserver"

	"github.com/mailplane/mailplane/internal/dovecottest"
)

const (
	envBenchServer = "MAILPLANE_IMAPSYNC_BENCH_SERVER" // "1": be the server
	envBenchUsers  = "MAILPLANE_IMAPSYNC_BENCH_USERS"
	envBenchCert   = "MAILPLANE_IMAPSYNC_BENCH_CERT" // PEM, for the implicit-TLS listener
	envBenchKey    = "MAILPLANE_IMAPSYNC_BENCH_KEY"
)

// TestMain runs this test binary as the benchmarks' IMAP server when the
// environment asks for it, instead of running tests.
func TestMain(m *testing.M) {
	if os.Getenv(envBenchServer) == "1" {
		benchServerMain()
	}
	os.Exit(m.Run())
}

func benchUser(i int) string { return fmt.Sprintf("u%05d", i) }
func benchPass(i int) string { return fmt.Sprintf("pw-%05d-bench", i) }

// raiseNoFile lifts RLIMIT_NOFILE as far as the process may: every
// mailbox is a socket on both sides.
func raiseNoFile() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	want := syscall.Rlimit{Cur: 1 << 17, Max: 1 << 17}
	if rl.Max > want.Max {
		want = syscall.Rlimit{Cur: rl.Max, Max: rl.Max}
	}
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) != nil {
		// Not allowed above the hard limit: take the hard limit.
		want = syscall.Rlimit{Cur: rl.Max, Max: rl.Max}
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want)
	}
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl)
	return rl.Cur
}

// benchServerStats is what the server process counts.
type benchServerStats struct {
	Sessions int64 `json:"sessions"` // connections open
	Logins   int64 `json:"logins"`
	Idling   int64 `json:"idling"`  // sessions in IDLE now
	Polls    int64 `json:"polls"`   // sessions closed after selecting INBOX, Junk and Sent
	Closed   int64 `json:"closed"`  // sessions closed
	Appends  int64 `json:"appends"` // control-channel appends
	CPUNanos int64 `json:"cpu_ns"`  // user + sys of the server process
	RSSKiB   int64 `json:"rss_kib"`
	NoFile   int64 `json:"nofile"`
}

type benchCounters struct {
	sessions, logins, idling, polls, closed, appends atomic.Int64
}

// benchSession counts what the benchmarks need to know about a session of
// imapmemserver: whether it is in IDLE, and whether it was a full poll.
type benchSession struct {
	imapserver.Session
	c       *benchCounters
	selects map[string]bool
}

func (s *benchSession) Login(user, pass string) error {
	if err := s.Session.Login(user, pass); err != nil {
		return err
	}
	s.c.logins.Add(1)
	return nil
}

func (s *benchSession) Select(name string, opts *imap.SelectOptions) (*imap.SelectData, error) {
	d, err := s.Session.Select(name, opts)
	if err == nil {
		s.selects[name] = true
	}
	return d, err
}

func (s *benchSession) Idle(w *imapserver.UpdateWriter, stop <-chan struct{}) error {
	s.c.idling.Add(1)
	defer s.c.idling.Add(-1)
	return s.Session.Idle(w, stop)
}

func (s *benchSession) Close() error {
	if s.selects["INBOX"] && s.selects["Junk"] && s.selects["Sent"] {
		s.c.polls.Add(1)
	}
	s.c.sessions.Add(-1)
	s.c.closed.Add(1)
	return s.Session.Close()
}

type byteLiteral struct {
	*bytes.Reader
	n int64
}

func (l byteLiteral) Size() int64 { return l.n }

func benchMessage(id string, at time.Time) []byte {
	return fmt.Appendf(nil, "From: Warm Up <warm@bench.example>\r\nTo: someone@bench.example\r\n"+
		"Subject: benchmark %s\r\nMessage-ID: <%s>\r\nDate: %s\r\nContent-Type: text/plain\r\n\r\nhello\r\n",
		id, id, at.Format(time.RFC1123Z))
}

// benchServerMain is the server process: imapmemserver with N users, each
// with INBOX (one message), Junk and Sent, on a plain listener and an
// implicit-TLS listener (loopback), plus a loopback HTTP control channel
// (/stats, /append). It prints its addresses on one line and runs until
// its stdin closes (the parent ended) or SIGTERM.
func benchServerMain() {
	nofile := raiseNoFile()
	n, err := strconv.Atoi(os.Getenv(envBenchUsers))
	if err != nil || n <= 0 {
		log.Fatalf("bench server: %s=%q", envBenchUsers, os.Getenv(envBenchUsers))
	}
	cert, err := tls.X509KeyPair([]byte(os.Getenv(envBenchCert)), []byte(os.Getenv(envBenchKey)))
	if err != nil {
		log.Fatalf("bench server: certificate: %v", err)
	}
	mem := imapmemserver.New()
	users := make([]*imapmemserver.User, n)
	seeded := time.Now().Add(-time.Hour)
	for i := range n {
		u := imapmemserver.NewUser(benchUser(i), benchPass(i))
		for _, f := range []string{"INBOX", "Junk", "Sent"} {
			if err := u.Create(f, nil); err != nil {
				log.Fatal(err)
			}
		}
		msg := benchMessage(fmt.Sprintf("seed-%d@bench.example", i), seeded)
		if _, err := u.Append("INBOX", byteLiteral{bytes.NewReader(msg), int64(len(msg))}, &imap.AppendOptions{Time: seeded}); err != nil {
			log.Fatal(err)
		}
		mem.AddUser(u)
		users[i] = u
	}
	var c benchCounters
	srv := imapserver.New(&imapserver.Options{
		NewSession: func(*imapserver.Conn) (imapserver.Session, *imapserver.GreetingData, error) {
			c.sessions.Add(1)
			return &benchSession{Session: mem.NewSession(), c: &c, selects: map[string]bool{}}, nil, nil
		},
		Logger:       log.New(io.Discard, "", 0),
		InsecureAuth: true, // the plain listener is for TLSMode none
	})
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	tlsLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.Serve(plain) }()
	go func() {
		_ = srv.Serve(tls.NewListener(tlsLn, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"imap"}}))
	}()

	mux := http.NewServeMux()
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		st := benchServerStats{Sessions: c.sessions.Load(), Logins: c.logins.Load(), Idling: c.idling.Load(),
			Polls: c.polls.Load(), Closed: c.closed.Load(), Appends: c.appends.Load(),
			CPUNanos: ru.Utime.Nano() + ru.Stime.Nano(), RSSKiB: vmRSSKiB(), NoFile: int64(nofile)}
		_ = json.NewEncoder(w).Encode(st)
	})
	mux.HandleFunc("/append", func(w http.ResponseWriter, r *http.Request) {
		i, err := strconv.Atoi(r.FormValue("user"))
		if err != nil || i < 0 || i >= n {
			http.Error(w, "bad user", http.StatusBadRequest)
			return
		}
		folder := r.FormValue("folder")
		if folder == "" {
			folder = "INBOX"
		}
		now := time.Now()
		msg := benchMessage(r.FormValue("id"), now)
		if _, err := users[i].Append(folder, byteLiteral{bytes.NewReader(msg), int64(len(msg))}, &imap.AppendOptions{Time: now}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		c.appends.Add(1)
	})
	ctl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = http.Serve(ctl, mux) }()

	fmt.Printf("READY imap=%s imaps=%s ctl=%s\n", plain.Addr(), tlsLn.Addr(), ctl.Addr())
	// The parent holds our stdin: EOF means it is gone (or done with us).
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// vmRSSKiB reads the process's resident set size from /proc/self/status.
func vmRSSKiB() int64 { return procStatusKiB("VmRSS:") }

// vmHWMKiB is the peak resident set size.
func vmHWMKiB() int64 { return procStatusKiB("VmHWM:") }

func procStatusKiB(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			v, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return v
		}
	}
	return 0
}

// ---- the parent's side ----

// benchServer is a running server process.
type benchServer struct {
	plain, implicit string // IMAP addresses
	ctl             string // control channel base URL
	pid             int
	cert            *dovecottest.Cert
	http            *http.Client
}

// startBenchServer starts a server process with n users; it is stopped at
// the end of tb.
func startBenchServer(tb testing.TB, n int) *benchServer {
	tb.Helper()
	cert, err := dovecottest.NewCert()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.count=1")
	cmd.Env = append(os.Environ(), envBenchServer+"=1", envBenchUsers+"="+strconv.Itoa(n),
		envBenchCert+"="+string(cert.CertPEM), envBenchKey+"="+string(cert.KeyPEM))
	// Dies with us even if we are killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	var stderr syncBuf
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	tb.Cleanup(func() {
		_ = stdin.Close()
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-waited
		}
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "READY ") {
				ready <- line
			}
		}
		close(ready)
	}()
	var line string
	select {
	case l, ok := <-ready:
		if !ok {
			tb.Fatalf("bench server exited before it was ready: %s", stderr.String())
		}
		line = l
	case <-time.After(2 * time.Minute):
		tb.Fatalf("bench server not ready after 2 minutes: %s", stderr.String())
	}
	s := &benchServer{pid: cmd.Process.Pid, cert: cert,
		http: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}}
	for _, f := range strings.Fields(line)[1:] {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "imap":
			s.plain = v
		case "imaps":
			s.implicit = v
		case "ctl":
			s.ctl = "http://" + v
		}
	}
	return s
}

func (s *benchServer) stats(tb testing.TB) benchServerStats {
	tb.Helper()
	resp, err := s.http.Get(s.ctl + "/stats")
	if err != nil {
		tb.Fatalf("bench server stats: %v", err)
	}
	defer resp.Body.Close()
	var st benchServerStats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		tb.Fatalf("bench server stats: %v", err)
	}
	return st
}

// deliver appends a message with Message-ID <id> to user i's folder, in
// the server process; it returns once the server has stored it.
func (s *benchServer) deliver(i int, folder, id string) error {
	resp, err := s.http.PostForm(s.ctl+"/append", url.Values{"user": {strconv.Itoa(i)}, "folder": {folder}, "id": {id}})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("append: %s: %s", resp.Status, b)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuf) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuf) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
