package imapsync_test

// Hostile IMAP servers, second review (issue 23): answers within every
// byte budget that still cost the worker dearly, each run against a sync
// process of its own (a crash or the memory of one stays there).

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/imapsync"
)

// answerServer logs in like any server, lists INBOX alone and answers
// with its script.
type answerServer struct {
	ln      net.Listener
	exists  int
	uidNext int
	// condstore: the server has CONDSTORE, and each SELECT reports a
	// higher HIGHESTMODSEQ.
	condstore bool
	// uidFetch writes the answer to the first UID FETCH (false: hang up
	// without the OK).
	uidFetch func(w *bufio.Writer) bool
	// fetch writes the answer to later FETCH and UID FETCH commands (the
	// flags of stored messages), false: hang up.
	fetch func(w *bufio.Writer) bool
	// search is the answer to a UID SEARCH tagged tag.
	search func(tag string) string
	// idle is sent once the IDLE is acknowledged.
	idle string
	wg   sync.WaitGroup

	mu          sync.Mutex
	selects     int       // SELECT and EXAMINE commands received
	firstSelect time.Time // when the first was
}

func startAnswers(t *testing.T, s *answerServer) *answerServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.ln = ln
	acceptLoop(ln, &s.wg, s.serve)
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s
}

func (s *answerServer) serve(c net.Conn) {
	br := bufio.NewReader(c)
	w := bufio.NewWriter(c)
	say := func(lines ...string) bool {
		for _, l := range lines {
			w.WriteString(l + "\r\n")
		}
		return w.Flush() == nil
	}
	caps := hostileCaps
	if s.condstore {
		caps += " CONDSTORE"
	}
	if !say("* OK [CAPABILITY " + caps + "] ready") {
		return
	}
	fetched, idleTag, modseq := false, "", 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		f := strings.Fields(line)
		if len(f) == 1 && strings.EqualFold(f[0], "DONE") && idleTag != "" {
			say(idleTag + " OK idled")
			idleTag = ""
			continue
		}
		if len(f) < 2 {
			return
		}
		tag, cmd := f[0], strings.ToUpper(f[1])
		if cmd == "UID" && len(f) > 2 {
			cmd += " " + strings.ToUpper(f[2])
		}
		ok := true
		switch cmd {
		case "CAPABILITY":
			ok = say("* CAPABILITY "+caps, tag+" OK done")
		case "LOGIN":
			ok = say(tag + " OK [CAPABILITY " + caps + "] logged in")
		case "LIST":
			ok = say(`* LIST (\HasNoChildren) "/" INBOX`, tag+" OK listed")
		case "SELECT", "EXAMINE":
			s.mu.Lock()
			if s.selects++; s.selects == 1 {
				s.firstSelect = time.Now()
			}
			s.mu.Unlock()
			modseq++
			if s.condstore {
				w.WriteString(fmt.Sprintf("* OK [HIGHESTMODSEQ %d] ok\r\n", modseq))
			}
			ok = say(fmt.Sprintf("* %d EXISTS", s.exists), "* OK [UIDVALIDITY 7] ok", fmt.Sprintf("* OK [UIDNEXT %d] ok", s.uidNext), tag+" OK [READ-ONLY] selected")
		case "UID FETCH":
			if !fetched {
				fetched = true
				if s.uidFetch != nil && (!s.uidFetch(w) || w.Flush() != nil) {
					return
				}
				ok = say(tag + " OK fetched")
				break
			}
			fallthrough
		case "FETCH":
			if s.fetch != nil && (!s.fetch(w) || w.Flush() != nil) {
				return
			}
			ok = say(tag + " OK fetched")
		case "UID SEARCH":
			if s.search != nil {
				w.WriteString(s.search(tag))
			}
			ok = say(tag + " OK searched")
		case "IDLE":
			idleTag = tag
			w.WriteString("+ idling\r\n")
			w.WriteString(s.idle)
			ok = w.Flush() == nil
		case "LOGOUT":
			say("* BYE bye", tag+" OK bye")
			return
		default:
			ok = say(tag + " OK")
		}
		if !ok {
			return
		}
	}
}

// message writes one FETCH response for uid, with flags.
func message(w *bufio.Writer, uid int, flags string) {
	fmt.Fprintf(w, `* %d FETCH (UID %d FLAGS (%s) INTERNALDATE "01-Jan-2026 00:00:00 +0000" RFC822.SIZE 100 ENVELOPE (NIL "s" NIL NIL NIL NIL NIL NIL NIL "<%d@x>"))`+"\r\n", uid, uid, flags, uid)
}

// deepAnswer is a FETCH response whose BODYSTRUCTURE opens 3 Mi lists
// (within one response's byte budget).
var deepAnswer = "* 1 FETCH (UID 1 BODYSTRUCTURE " + strings.Repeat("(", 3<<20) + ")\r\n"

// TestHostileAnswers: each answer below fails the mailbox with a stable
// category, and the sync process's peak RSS grows by less than 100 MiB.
// Before these were refused, each took the sync process (every mailbox of
// the worker) down or far up:
//
//   - "search-star": a UID SEARCH answered "* SEARCH 0" (0 is "*" to
//     go-imap): SearchData.AllUIDs panicked, and the process exited.
//   - "search-range": an ESEARCH "UID ALL 1:60000000": expanded
//     whole into 60 million UIDs, about 1 GB.
//   - "flag-flood": a CONDSTORE server that once listed UID 4000000000
//     answers the flag FETCH (UID 1:4000000000 CHANGEDSINCE) with every
//     UID, each answer a byte window of its own: the updates piled up
//     for as long as the operation's budgets last.
//   - "fat-flags": 200 new messages of 1 MiB of FLAGS each (keywords),
//     each within its window: the batch held them all (200 MiB).
//   - "deep-fetch", "deep-idle": a BODYSTRUCTURE nested 3 Mi deep, in the
//     FETCH or unasked during IDLE: go-imap's recursion overflowed the
//     reader goroutine's stack, a fatal error.
func TestHostileAnswers(t *testing.T) {
	t.Parallel()
	// 16384 distinct keywords of 63 bytes: 1 MiB of FLAGS.
	var kw strings.Builder
	for i := range (1 << 20) / 64 {
		fmt.Fprintf(&kw, "kw%061d ", i)
	}
	keywords := strings.TrimSpace(kw.String())
	cases := []struct {
		name string
		srv  *answerServer
		want imapsync.Kind
	}{
		{"search-star", &answerServer{exists: 3, uidNext: 4, search: func(string) string { return "* SEARCH 0\r\n" }}, imapsync.KindProtocol},
		{"search-range", &answerServer{exists: 3, uidNext: 60000001, search: func(tag string) string { return `* ESEARCH (TAG "` + tag + `") UID ALL 1:60000000` + "\r\n" },
			uidFetch: func(w *bufio.Writer) bool { message(w, 60000000, ""); return true }}, imapsync.KindProtocol},
		{"flag-flood", &answerServer{exists: 1, uidNext: 4000000001, condstore: true, idle: "* 2 EXISTS\r\n",
			uidFetch: func(w *bufio.Writer) bool { message(w, 4000000000, ""); return true },
			fetch: func(w *bufio.Writer) bool {
				for uid := 1; ; uid++ {
					fmt.Fprintf(w, "* 1 FETCH (UID %d MODSEQ (5) FLAGS (\\Seen))\r\n", uid)
					if uid%256 == 0 && w.Flush() != nil {
						return false
					}
				}
			}}, imapsync.KindProtocol},
		{"fat-flags", &answerServer{exists: 200, uidNext: 201,
			uidFetch: func(w *bufio.Writer) bool {
				for uid := 1; uid <= 200; uid++ {
					message(w, uid, keywords)
					if w.Flush() != nil {
						return false
					}
				}
				// Then an answer that fails the connection: the batch is
				// never written.
				w.WriteString(deepAnswer)
				return true
			}}, imapsync.KindProtocol},
		{"deep-fetch", &answerServer{exists: 1, uidNext: 2,
			uidFetch: func(w *bufio.Writer) bool { w.WriteString(deepAnswer); return true }}, imapsync.KindProtocol},
		{"deep-idle", &answerServer{exists: 0, uidNext: 1, idle: deepAnswer}, imapsync.KindProtocol},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := startAnswers(t, tc.srv)
			start := time.Now()
			kind, op, before, after := syncProcess(t, srv.ln.Addr().String())
			if kind != string(tc.want) {
				t.Errorf("failed %s (op %s), want %s", kind, op, tc.want)
			}
			growth := after - before
			if growth >= 100<<10 {
				t.Errorf("peak RSS grew by %d MiB (from %d to %d MiB), bound 100 MiB", growth>>10, before>>10, after>>10)
			}
			t.Logf("%s: peak RSS %.1f MiB before, %.1f MiB after (+%.1f MiB); failed %s (op %s) in %s",
				tc.name, float64(before)/1024, float64(after)/1024, float64(growth)/1024, kind, op, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestIDLEWakeStormPaced: a server that answers every IDLE with an EXISTS
// at once wakes the runner at most once per second (each wake a sync
// round: a SELECT). Before, the runner synced in a loop, about 12,000
// rounds a second, a core of the worker's for one mailbox.
func TestIDLEWakeStormPaced(t *testing.T) {
	t.Parallel()
	srv := startAnswers(t, &answerServer{exists: 0, uidNext: 1, idle: "* 0 EXISTS\r\n"})
	w := newSetupWorld(t)
	r, err := imapsync.New(imapsync.Config{Keyring: w.kr, Reporter: &kindReporter{}, Transport: domain.MustTransportPolicy("127.0.0.0/8")})
	if err != nil {
		t.Fatal(err)
	}
	w.runAt(r, mailboxIDOf(0), 0, "127.0.0.1", srv.ln.Addr().(*net.TCPAddr).Port)
	rounds := func() (int, time.Duration) {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		if srv.selects == 0 {
			return 0, 0
		}
		return srv.selects, time.Since(srv.firstSelect)
	}
	waitFor(t, 30*time.Second, "four sync rounds", func() (bool, string) {
		n, _ := rounds()
		return n >= 4, fmt.Sprintf("%d rounds", n)
	})
	n, since := rounds()
	if most := int(since/time.Second) + 2; n > most {
		t.Errorf("%d sync rounds in %s, at most %d", n, since.Round(time.Millisecond), most)
	}
	w.cancel()
	w.wg.Wait()
}
