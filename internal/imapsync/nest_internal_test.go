package imapsync

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/emersion/go-imap/v2/imapclient"
)

// deepFetch is a FETCH whose BODYSTRUCTURE opens 3 Mi lists, within one
// response's byte budget: go-imap parses it by unbounded recursion, and
// its reader goroutine's stack overflowed (a fatal error, the whole
// process gone) before nestConn.
var deepFetch = "* 1 FETCH (UID 1 BODYSTRUCTURE " + strings.Repeat("(", 3<<20) + ")\r\n"

// noopThrough runs a NOOP on a go-imap client reading through a nestConn
// from a server that greets, then answers the NOOP with script and OK.
func noopThrough(t *testing.T, script string) (*nestConn, error) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	go func() {
		w := bufio.NewWriter(b)
		r := bufio.NewReader(b)
		w.WriteString("* OK ready\r\n")
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
	} {
		t.Run(what, func(t *testing.T) {
			nc, err := noopThrough(t, script)
			if !nc.tooDeep.Load() {
				t.Fatalf("not refused as too deep (err %v)", err)
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
		"* 2 EXISTS\r\n"
	nc, err := noopThrough(t, script)
	if err != nil || nc.tooDeep.Load() {
		t.Fatalf("a legitimate answer failed: %v (too deep: %v)", err, nc.tooDeep.Load())
	}
	if nc.lex.depth != 0 {
		t.Errorf("depth %d after complete responses, want 0", nc.lex.depth)
	}
}
