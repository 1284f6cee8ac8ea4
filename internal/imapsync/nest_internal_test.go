package imapsync

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2/imapclient"
)

// deepFetch is a FETCH whose BODYSTRUCTURE opens 3 Mi lists, within one
// response's byte budget: go-imap parses it by unbounded recursion, and
// its reader goroutine's stack overflowed (a fatal error, the whole
// process gone) before nestConn.
var deepFetch = "* 1 FETCH (UID 1 BODYSTRUCTURE " + strings.Repeat("(", 3<<20) + ")\r\n"

// levels is a FETCH whose BODYSTRUCTURE nests 60,000 multiparts, each
// with a first part whose media type is a literal (counted by count, its
// 4 bytes holding a line feed) and the next level as its second part.
func levels(count string) string {
	return "* 1 FETCH (UID 1 BODYSTRUCTURE " + strings.Repeat("(("+count+"a\nbc \"plain\" NIL NIL NIL \"7BIT\" 1)", 60000) + "\r\n"
}

// noopThrough runs a NOOP (the greeting "* OK ready") on a go-imap client reading through a nestConn
// from a server that greets, then answers the NOOP with script and OK.
func noopThrough(t *testing.T, script string) (*nestConn, error) {
	t.Helper()
	return greetThenNoop(t, "* OK ready\r\n", script)
}

// greetThenNoop is noopThrough with the given greeting.
func greetThenNoop(t *testing.T, greeting, script string) (*nestConn, error) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	go func() {
		w := bufio.NewWriter(b)
		r := bufio.NewReader(b)
		w.WriteString(greeting)
		if w.Flush() != nil {
			return
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		tag := strings.Fields(line)[0]
		w.WriteString(script + tag + " OK done\r\n")
		if w.Flush() != nil {
			return
		}
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
		}
	}()
	nc := newNestConn(a, "")
	c := imapclient.New(nc, nil)
	defer c.Close()
	if err := c.WaitGreeting(); err != nil {
		return nc, err
	}
	return nc, c.Noop().Wait()
}

// TestNestingBounded: answers nested past maxNesting fail the read
// (errNested) before go-imap parses them, however the depth is hidden
// from a lexer: behind text that holds a literal's syntax (a status
// response, an unknown response code's text running over lines), or
// inside a mailbox name literal that itself looks like a literal's start.
func TestNestingBounded(t *testing.T) {
	t.Parallel()
	name := "(( {3000100}\r\n"
	for what, script := range map[string]string{
		"bodystructure":          deepFetch,
		"literal in status text": fmt.Sprintf("* OK ((( {%d}\r\n", len(deepFetch)) + deepFetch,
		"literal in tagged text": fmt.Sprintf("X1 NO ((( {%d}\r\n", len(deepFetch)) + deepFetch,
		"code text over lines":   fmt.Sprintf("* OK [XYZ \r\n((( {%d}\r\n]\r\n", len(deepFetch)) + deepFetch,
		"literal in a name":      fmt.Sprintf("* LIST () \"/\" {%d}\r\n%s\r\n", len(name), name) + deepFetch,
		"numbered status":        fmt.Sprintf("* 5 OK ((( {%d}\r\n", len(deepFetch)) + deepFetch,
		// Literals go-imap reads and a strict lexer would not: a count
		// line ended by a lone LF, or by a space, or with leading zeros;
		// each literal a line feed that would end the nesting.
		"bare LF literals":     levels("{4}\n"),
		"spaced literals":      levels("{4} \r\n"),
		"zero-padded literals": levels("{0000000000000000000004}\r\n"),
		// A quoted string go-imap reads across line feeds; and a quote in
		// a status response's text, which go-imap reads as text.
		"quoted line feeds":    "* 1 FETCH (UID 1 BODYSTRUCTURE " + strings.Repeat("((\"a\nb\" \"plain\" NIL NIL NIL \"7BIT\" 1)", 60000) + "\r\n",
		"quote in status text": "* OK \"\r\n" + deepFetch,
	} {
		t.Run(what, func(t *testing.T) {
			nc, err := noopThrough(t, script)
			if !nc.refused.Load() || nc.why != errNested {
				t.Fatalf("not refused as too deep (err %.200v)", err)
			}
			if err == nil {
				t.Fatal("the NOOP succeeded")
			}
		})
	}
}

// TestNestingLegitimate: what real servers send, parentheses inside
// quoted strings and literals (a subject of 5000 "(", a header section
// full of them), a mailbox name literal, passes.
func TestNestingLegitimate(t *testing.T) {
	t.Parallel()
	subject := strings.Repeat("(", 5000)
	header := "X-Mailplane-Warmup: " + strings.Repeat("((((", 1000) + "\r\n\r\n"
	script := fmt.Sprintf("* 1 FETCH (UID 1 FLAGS (\\Seen) ENVELOPE (NIL {%d}\r\n%s ((\"a(((\" NIL \"x\" \"example.org\")) NIL NIL NIL NIL NIL NIL \"<(((@x>\") BODY[HEADER.FIELDS (X-MAILPLANE-WARMUP)] {%d}\r\n%s)\r\n",
		len(subject), subject, len(header), header) +
		"* LIST (\\HasNoChildren) \"/\" {8}\r\nInbox ((\r\n" +
		"* OK [ALERT] (((( {5}\r\n" +
		// An unbalanced "[" in a status response's text is text.
		"* OK ready [1\r\n* 1 FETCH (UID 1 ENVELOPE (NIL \"" + strings.Repeat("(", 200) + "\" NIL NIL NIL NIL NIL NIL NIL NIL))\r\n" +
		"* 2 EXISTS\r\n"
	nc, err := noopThrough(t, script)
	if err != nil || nc.refused.Load() {
		t.Fatalf("a legitimate answer failed: %v (refused: %q)", err, nc.why)
	}
	if nc.lex.depth != 0 {
		t.Errorf("depth %d after complete responses, want 0", nc.lex.depth)
	}
}

// words is n bytes of distinct short words, as a hostile server lists
// capabilities or keywords: go-imap keeps a map entry or a string for each.
func words(prefix string, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%s%d ", prefix, i)
	}
	return strings.TrimSpace(b.String())
}

// TestRetainedLinesBounded: the lines whose content go-imap keeps for the
// connection's life (capabilities, FLAGS, PERMANENTFLAGS, ENABLED) are
// refused past maxRetainedLine. Before, 3 MiB of each, within one
// response's byte budget, made one connection keep about 36 MiB (10
// connections: 362 MiB of heap), a hot one for ever.
func TestRetainedLinesBounded(t *testing.T) {
	t.Parallel()
	big := 3 << 20
	for what, answer := range map[string][2]string{
		"greeting capabilities": {"* OK [CAPABILITY IMAP4rev1 " + words("C", big) + "] hi\r\n", ""},
		"capability response":   {"* OK ready\r\n", "* CAPABILITY IMAP4rev1 " + words("C", big) + "\r\n"},
		"flags":                 {"* OK ready\r\n", "* FLAGS (" + words("k", big) + ")\r\n"},
		"permanentflags":        {"* OK ready\r\n", "* OK [PERMANENTFLAGS (" + words("k", big) + ")] ok\r\n"},
		"enabled":               {"* OK ready\r\n", "* ENABLED " + words("E", big) + "\r\n"},
	} {
		t.Run(what, func(t *testing.T) {
			nc, err := greetThenNoop(t, answer[0], answer[1])
			if !nc.refused.Load() || nc.why != errLongLine {
				t.Fatalf("not refused as too long (err %v, refused %q)", err, nc.why)
			}
		})
	}
	// What real servers send is far shorter, and passes.
	nc, err := greetThenNoop(t, "* OK [CAPABILITY IMAP4rev1 "+words("C", 4<<10)+"] hi\r\n",
		"* FLAGS ("+words("k", 12<<10)+")\r\n* OK [PERMANENTFLAGS ("+words("k", 12<<10)+")] ok\r\n"+
			"* 1 FETCH (UID 1 FLAGS ("+words("k", 64<<10)+"))\r\n")
	if err != nil || nc.refused.Load() {
		t.Fatalf("a legitimate answer failed: %v (refused %q)", err, nc.why)
	}
}

// TestSTARTTLSExchangeBounded: the STARTTLS exchange, read a byte at a
// time, ends after maxLine bytes however many untagged lines the server
// sends before its OK.
func TestSTARTTLSExchangeBounded(t *testing.T) {
	t.Parallel()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	sent := make(chan int, 1)
	go func() {
		n := 0
		defer func() { sent <- n }()
		if _, err := b.Write([]byte("* OK ready\r\n")); err != nil {
			return
		}
		go io.Copy(io.Discard, b)
		for {
			k, err := b.Write([]byte("* CAPABILITY IMAP4rev1 STARTTLS\r\n"))
			n += k
			if err != nil {
				return
			}
		}
	}()
	c := &conn{raw: &deadlineConn{Conn: a}, cmdTO: time.Minute}
	_, err := startTLS(t.Context(), c, nil)
	a.Close()
	if err == nil {
		t.Fatal("an endless STARTTLS exchange succeeded")
	}
	if n := <-sent; n > maxLine+64 {
		t.Errorf("read %d bytes of the exchange, bound %d", n, maxLine)
	}
}
