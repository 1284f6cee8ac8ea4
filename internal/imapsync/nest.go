package imapsync

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync/atomic"
)

// maxNesting bounds how deep a server's answer may nest parenthesised
// lists. go-imap parses a BODYSTRUCTURE by recursion without a bound
// (only its other lists stop at 1000): three megabytes of "(", within one
// response's byte budget, overflow the reader goroutine's stack, a fatal
// error that ends the whole sync process, every mailbox of the worker
// with it. What the runner asks for nests four deep (an ENVELOPE's
// addresses in a FETCH).
const maxNesting = 100

// maxRetainedLine bounds the lines whose content go-imap keeps for the
// connection's life: the capabilities (a CAPABILITY response or code, an
// ENABLED), a folder's FLAGS and PERMANENTFLAGS, and so every status
// response. Within one response's byte budget, 3 MiB of each made a
// connection keep 36 MiB (a map entry or a string per word) for as long as
// it lived, a hot one for ever: a hundred mailboxes on one hostile server
// would keep 3.6 GB. Real servers send a few hundred bytes.
const maxRetainedLine = 16 << 10

// lexError is an answer the lexer refuses; its text is fixed.
type lexError string

func (e lexError) Error() string { return "imapsync: " + string(e) }

// The answers a nestConn refuses.
const (
	errNested   lexError = "the server's answer nests too deep"
	errLongLine lexError = "the server's answer holds a line too long"
)

// nestConn bounds the nesting of what the IMAP client reads: it sits
// between the client and the plain text (above TLS), lexes every byte as
// it is read (nestLexer), and fails the read, closing the connection,
// before a byte nested past maxNesting, or a line past maxRetainedLine,
// reaches go-imap's parser. pre is served first (a greeting for a client
// created after STARTTLS).
type nestConn struct {
	net.Conn
	pre     []byte
	lex     nestLexer
	refused atomic.Bool
	why     lexError // set before refused
}

func newNestConn(c net.Conn, pre string) *nestConn {
	return &nestConn{Conn: c, pre: []byte(pre)}
}

func (c *nestConn) Read(p []byte) (int, error) {
	if c.refused.Load() {
		return 0, c.why
	}
	var (
		n   int
		err error
	)
	if len(c.pre) > 0 {
		n = copy(p, c.pre)
		c.pre = c.pre[n:]
	} else {
		n, err = c.Conn.Read(p)
	}
	if why := c.lex.feed(p[:n]); why != "" {
		c.why = why
		c.refused.Store(true)
		_ = c.Conn.Close()
		return 0, why
	}
	return n, err
}

type lexState uint8

const (
	lexNormal lexState = iota
	lexQuoted
	lexQuotedEscape
	lexLiteralCount // after "{": digits
	lexLiteralPlus  // after "{n+"
	lexLiteralSP    // after "{n}"
	lexLiteralCR    // after "{n} "
	lexLiteralLF    // after "{n}\r" or "{n} \r"
	lexLiteral      // in a literal's n bytes
)

// headMax is how much of a line's start is kept to tell a status response
// from the others.
const headMax = 48

// nestLexer follows the IMAP grammar just far enough to know how deep
// go-imap's parser is, never less deep. Its one risk is to take for a
// literal (whose bytes it skips) what go-imap parses; so it skips a
// literal's bytes only where go-imap reads a literal as a literal (inside
// a list, on a line that is not a status response), and elsewhere
// counts every parenthesis, even one go-imap reads as text:
//
//   - A status response (OK, NO, BAD, BYE, PREAUTH, tagged or not, and a
//     continuation "+") is text to go-imap, "{n}" included, and so is
//     what follows an unknown response code's "[" up to the "]", across
//     lines: no literal is recognised there.
//   - A literal at depth 0 (a mailbox name) is read by go-imap as one
//     string; its bytes are lexed for parentheses only.
//   - A quoted string is one where go-imap reads one (not in a status
//     response's text), and ends, as go-imap ends it, at the next
//     unescaped quote, line feeds included.
//   - A line feed outside a literal or a quoted string ends a response
//     for go-imap (or fails it), so it ends the nesting.
type nestLexer struct {
	state lexState
	depth int

	head       [headMax]byte
	headN      int
	classified bool // the line's kind is known
	status     bool // a status response or continuation: text
	retained   bool // a line go-imap keeps (maxRetainedLine)
	lineLen    int  // bytes of the line so far
	bracket    bool // in a status response's code, after "[" and before "]"
	codeNext   bool // the next byte opens a status response's code if "["

	digits int   // of the literal's count
	count  int64 // the literal's count
	left   int64 // bytes of the literal left
	opaque bool  // the literal is at depth 0: its parentheses counted
}

// feed lexes p; the refusal, or "".
func (l *nestLexer) feed(p []byte) lexError {
	for i := 0; i < len(p); i++ {
		b := p[i]
		if l.lineLen++; l.retained && l.lineLen > maxRetainedLine {
			return errLongLine
		}
		switch l.state {
		case lexLiteral:
			k := int(min(l.left, int64(len(p)-i)))
			l.lineLen += k - 1
			if l.opaque {
				for _, x := range p[i : i+k] {
					if !l.paren(x) {
						return errNested
					}
				}
			}
			l.left -= int64(k)
			i += k - 1
			if l.left == 0 {
				l.state = lexNormal
			}
			continue
		case lexQuoted:
			// As go-imap reads one: to the next unescaped quote, line
			// feeds and all.
			switch b {
			case '\\':
				l.state = lexQuotedEscape
			case '"':
				l.state = lexNormal
			}
			continue
		case lexQuotedEscape:
			l.state = lexQuoted
			continue
		case lexLiteralCount:
			switch {
			case b >= '0' && b <= '9':
				// Leading zeros and all: go-imap reads the number whole.
				l.digits++
				l.count = min(l.count*10+int64(b-'0'), 1<<50)
				continue
			case b == '+' && l.digits > 0:
				l.state = lexLiteralPlus
				continue
			case b == '}' && l.digits > 0:
				l.state = lexLiteralSP
				continue
			}
		case lexLiteralPlus:
			if b == '}' {
				l.state = lexLiteralSP
				continue
			}
		case lexLiteralSP, lexLiteralCR:
			// go-imap ends a literal's count as it ends a line: an
			// optional space, an optional CR, an LF.
			switch {
			case b == ' ' && l.state == lexLiteralSP:
				l.state = lexLiteralCR
				continue
			case b == '\r':
				l.state = lexLiteralLF
				continue
			case b == '\n':
				if l.startLiteral() {
					continue
				}
			}
		case lexLiteralLF:
			if b == '\n' && l.startLiteral() {
				continue
			}
		}
		// lexNormal, or a literal's start that was none: b is lexed anew.
		if err := l.normal(b); err != "" {
			return err
		}
	}
	return ""
}

// normal lexes b outside literals and quoted strings.
func (l *nestLexer) normal(b byte) lexError {
	l.state = lexNormal
	code := l.codeNext // b is where a response code may open
	l.codeNext = false
	if !l.classified {
		l.classify(b)
	}
	switch b {
	case '"':
		// A quoted string where go-imap reads one; elsewhere (a
		// status response's text) a quote is text.
		if l.classified && !l.status && !l.bracket {
			l.state = lexQuoted
		}
	case '{':
		l.state, l.digits, l.count = lexLiteralCount, 0, 0
	case '[':
		l.bracket = l.bracket || code
	case ']':
		l.bracket = false
	case '\n':
		l.endLine()
	default:
		if !l.paren(b) {
			return errNested
		}
	}
	return ""
}

// startLiteral starts a literal whose count line just ended, where
// go-imap reads one (see nestLexer); false: none.
func (l *nestLexer) startLiteral() bool {
	if !l.classified || l.status || l.bracket {
		return false
	}
	l.state, l.left, l.opaque = lexNormal, l.count, l.depth == 0
	if l.left > 0 {
		l.state = lexLiteral
	}
	return true
}

// paren counts b if it is a parenthesis; false past maxNesting.
func (l *nestLexer) paren(b byte) bool {
	switch b {
	case '(':
		l.depth++
		return l.depth <= maxNesting
	case ')':
		l.depth = max(l.depth-1, 0)
	}
	return true
}

// endLine ends a response line (an unknown response code's text goes on
// to its "]").
func (l *nestLexer) endLine() {
	l.state, l.depth = lexNormal, 0
	if l.bracket {
		return
	}
	l.headN, l.classified, l.status, l.retained, l.lineLen = 0, false, false, false, 0
}

// classify adds b to the line's head and, once it can, tells whether the
// line is a status response: [tag or "*"] SP [number SP] OK / NO / BAD /
// BYE / PREAUTH, or a continuation. A line it cannot tell within headMax
// bytes is taken for one (no literal recognised on it: the safe side).
func (l *nestLexer) classify(b byte) {
	if l.headN < headMax {
		l.head[l.headN] = b
		l.headN++
	}
	h := l.head[:l.headN]
	decide := func(status bool) { l.classified, l.status, l.retained = true, status, status }
	if h[0] == '+' {
		decide(true)
		return
	}
	full := l.headN == headMax || b == '\n'
	sp := bytes.IndexByte(h, ' ')
	if sp < 0 {
		if full {
			decide(true)
		}
		return
	}
	rest := h[sp+1:]
	if d := digitsPrefix(rest); d < len(rest) && d > 0 && rest[d] == ' ' {
		rest = rest[d+1:]
	}
	end := bytes.IndexAny(rest, " \r\n")
	switch {
	case end < 0:
		if full {
			decide(true)
		}
	default:
		switch strings.ToUpper(string(rest[:end])) {
		case "OK", "NO", "BAD", "BYE", "PREAUTH":
			decide(true)
			l.codeNext = b == ' '
		case "FLAGS", "CAPABILITY", "ENABLED":
			decide(false)
			l.retained = true
		default:
			decide(false)
		}
	}
}

// digitsPrefix is the count of leading ASCII digits of b.
func digitsPrefix(b []byte) int {
	n := 0
	for n < len(b) && b[n] >= '0' && b[n] <= '9' {
		n++
	}
	return n
}

// startTLS speaks the greeting and the STARTTLS exchange itself (RFC 9051
// section 6.2.1), rather than go-imap, so that the client it then creates
// reads the plain text through a nestConn: go-imap's own STARTTLS wraps
// the socket in TLS inside the client, out of reach. Lines are read a
// byte at a time, so that no byte the server sends after its OK is read
// as plain text (a command injected before the handshake). A PREAUTH
// greeting is refused (RFC 9051 section 7.1.4: it would skip the upgrade).
func startTLS(ctx context.Context, c *conn, cfg *tls.Config) (*tls.Conn, error) {
	left := maxLine // for the whole exchange
	greeting, err := readLine(c.raw, &left)
	if err != nil {
		return nil, greetingError(err, ctx)
	}
	switch f := strings.Fields(greeting); {
	case len(f) >= 2 && f[0] == "*" && strings.EqualFold(f[1], "OK"):
	case len(f) >= 2 && f[0] == "*" && strings.EqualFold(f[1], "PREAUTH"):
		return nil, &Error{Kind: KindProtocol, Op: "starttls", Reason: "the server sent PREAUTH on a plain connection"}
	default:
		return nil, greetingError(errors.New("not an IMAP greeting"), ctx)
	}
	c.arm()
	if _, err := c.raw.Write([]byte("S STARTTLS\r\n")); err != nil {
		return nil, c.fail("starttls", err, ctx)
	}
	for {
		line, err := readLine(c.raw, &left)
		if err != nil {
			return nil, c.fail("starttls", err, ctx)
		}
		f := strings.Fields(line)
		if len(f) >= 1 && f[0] == "*" {
			continue // untagged: a CAPABILITY, say
		}
		if len(f) >= 2 && f[0] == "S" && strings.EqualFold(f[1], "OK") {
			break
		}
		return nil, &Error{Kind: KindProtocol, Op: "starttls", Reason: "the server refused STARTTLS"}
	}
	tc := tls.Client(c.raw, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, c.fail("starttls", err, ctx)
	}
	return tc, nil
}

// maxLine bounds what the greeting and the STARTTLS exchange may take
// together (read a byte at a time, a system call each).
const maxLine = 64 << 10

// readLine reads one line, a byte at a time (see startTLS), taking its
// bytes from *left.
func readLine(r net.Conn, left *int) (string, error) {
	var line []byte
	b := make([]byte, 1)
	for *left > 0 {
		*left--
		if _, err := r.Read(b); err != nil {
			return "", err
		}
		if b[0] == '\n' {
			return strings.TrimSuffix(string(line), "\r"), nil
		}
		line = append(line, b[0])
	}
	return "", errors.New("imapsync: the STARTTLS exchange is too long")
}
