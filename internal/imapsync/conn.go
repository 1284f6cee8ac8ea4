package imapsync

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"

	"github.com/mailplane/mailplane/domain"
)

// deadlineConn owns the deadlines and the byte budgets of an IMAP
// connection; the server is not trusted to be quick or brief.
//
// Deadlines: go-imap sets its own (30 s per response, none while waiting
// for the next one, which never notices a black-holed peer); its calls are
// ignored here, and the runner arms a deadline before every command
// instead (arm), a longer one for an IDLE. An operation (a setup up to the
// first IDLE, a poll, a hot round between IDLEs) also has a budget of the
// server's time (startOp): every arm is cut to what is left of it, and the
// time spent waiting on our own database (hold) is not charged, so a server
// that answers one message every few seconds, re-arming the per-command
// deadline each time, still ends at the operation's budget.
//
// Bytes: every byte read from the socket is counted (under TLS, the
// ciphertext, a little more than the IMAP stream), in a window reset at
// each arm (one command's answer, one fetched message, one IDLE) and over
// the operation. Past either bound the read fails and the socket is
// closed: go-imap holds a literal outside a body section wholly in memory,
// so only the socket can bound what a server's literal costs.
type deadlineConn struct {
	net.Conn
	maxWindow, maxOp int64 // <= 0: unbounded

	window, op atomic.Int64
	// limit is the window's bound: maxWindow, or a command's own
	// (armWindow); <= 0: unbounded.
	limit atomic.Int64
	over  atomic.Bool // a byte budget was exceeded

	// The operation's time budget; the run's goroutine only.
	timed   bool
	left    time.Duration
	armedAt time.Time // zero: not armed (held, or idling outside an operation)
}

// oversized is the failure of a connection dropped past a byte budget.
func oversized(op string, err error) *Error {
	return &Error{Kind: KindOversized, Op: op, Reason: "the server sent more than the connection's byte budget", Err: err}
}

// refusedAnswer is the failure of a connection dropped for an answer its
// nestConn refused.
func refusedAnswer(op string, why lexError, err error) *Error {
	return &Error{Kind: KindProtocol, Op: op, Reason: string(why), Err: err}
}

// errOversized is the read error past a byte budget.
var errOversized = errors.New("imapsync: the server sent more than the connection's byte budget")

func (c *deadlineConn) Read(p []byte) (int, error) {
	if c.over.Load() {
		return 0, errOversized
	}
	n, err := c.Conn.Read(p)
	w, o := c.window.Add(int64(n)), c.op.Add(int64(n))
	if l := c.limit.Load(); l > 0 && w > l || c.maxOp > 0 && o > c.maxOp {
		c.over.Store(true)
		_ = c.Conn.Close()
		return 0, errOversized
	}
	return n, err
}

func (c *deadlineConn) SetDeadline(time.Time) error      { return nil }
func (c *deadlineConn) SetReadDeadline(time.Time) error  { return nil }
func (c *deadlineConn) SetWriteDeadline(time.Time) error { return nil }

// startOp starts an operation with d of the server's time (d <= 0: no
// time budget) and a fresh byte count.
func (c *deadlineConn) startOp(d time.Duration) {
	c.timed, c.left, c.armedAt = d > 0, d, time.Time{}
	c.op.Store(0)
}

// endOp leaves the operation: what follows (an IDLE's wait, the logout)
// has only its own deadline.
func (c *deadlineConn) endOp() {
	c.charge()
	c.timed = false
}

// charge counts the time armed since the last charge against the
// operation's budget.
func (c *deadlineConn) charge() {
	if c.armedAt.IsZero() {
		return
	}
	now := time.Now()
	if c.timed {
		c.left -= now.Sub(c.armedAt)
	}
	c.armedAt = now
}

// arm sets the read and write deadline d from now, cut to what is left
// of the operation's budget, and opens a new byte window.
func (c *deadlineConn) arm(d time.Duration) { c.armWindow(d, c.maxWindow) }

// armWindow is arm with a window of its own bound (at least maxWindow).
func (c *deadlineConn) armWindow(d time.Duration, limit int64) {
	c.charge()
	c.window.Store(0)
	if c.maxWindow > 0 {
		c.limit.Store(max(limit, c.maxWindow))
	}
	if c.timed {
		d = min(d, max(c.left, 0))
	}
	now := time.Now()
	c.armedAt = now
	_ = c.Conn.SetDeadline(now.Add(d))
}

// hold lifts the deadline and stops charging the operation's budget.
func (c *deadlineConn) hold() {
	c.charge()
	c.armedAt = time.Time{}
	_ = c.Conn.SetDeadline(time.Time{})
}

// outOfTime reports whether the operation's time budget is spent.
func (c *deadlineConn) outOfTime() bool {
	c.charge()
	return c.timed && c.left <= 0
}

// conn is one IMAP connection of a mailbox run.
type conn struct {
	c       *imapclient.Client
	raw     *deadlineConn
	nest    *nestConn // the plain text the client reads
	cmdTO   time.Duration
	stop    func() bool // unregisters the close on ctx
	closing sync.Once
	idling  bool // an IDLE may be running: no other command can be sent
	// notify is signalled (never blocking) on unilateral EXISTS, EXPUNGE
	// and FETCH: something changed in the selected folder.
	notify chan struct{}
}

func (c *conn) arm() { c.raw.arm(c.cmdTO) }

// hold lifts the deadline while the run waits on its own database between
// commands: the client's reader reads all the time, so a deadline passing
// during a long wait for the pool (a worker's whole fleet syncing at once)
// would drop a healthy connection. The next command arms it again.
func (c *conn) hold() { c.raw.hold() }

// fail classifies err, a command's failure on c: past a byte budget
// (KindOversized) or the operation's time (KindSlow) first, since go-imap
// reports either as the connection's end.
func (c *conn) fail(op string, err error, ctx context.Context) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case c.raw.over.Load():
		return oversized(op, err)
	case c.nest != nil && c.nest.refused.Load():
		return refusedAnswer(op, c.nest.why, err)
	case c.raw.outOfTime():
		return &Error{Kind: KindSlow, Op: op, Reason: "the server did not complete the setup or poll in time", Err: err}
	}
	return classify(op, err, ctx)
}

func (c *conn) armFor(d time.Duration) { c.raw.arm(d) }
func (c *conn) has(cp imap.Cap) bool   { return c.c.Caps().Has(cp) }
func (c *conn) signal() {
	select {
	case c.notify <- struct{}{}:
	default:
	}
}
func (c *conn) drain() {
	select {
	case <-c.notify:
	default:
	}
}

// close logs out politely (bounded, and not while an IDLE holds the
// client) and closes the socket.
func (c *conn) close() {
	c.closing.Do(func() {
		live := c.stop == nil || c.stop() // false: ctx closed the socket already
		if live && !c.idling && c.c != nil && c.c.State() != imap.ConnStateLogout {
			d := min(c.cmdTO, 2*time.Second)
			c.raw.endOp()
			c.raw.arm(d)
			done := make(chan struct{})
			go func() {
				_ = c.c.Logout().Wait()
				close(done)
			}()
			t := time.NewTimer(d)
			select {
			case <-done:
			case <-t.C:
			}
			t.Stop()
		}
		_ = c.raw.Conn.Close()
		if c.c != nil {
			_ = c.c.Close()
		}
	})
}

// dial connects, secures and logs in. Every step runs under a deadline;
// ctx being done closes the socket, which ends any step at once.
func (m *mailboxRun) dial(ctx context.Context) (*conn, error) {
	if err := m.job.PaceConnect(ctx); err != nil {
		return nil, err
	}
	ep := m.job.Mailbox.IMAP
	dctx, cancel := context.WithTimeout(ctx, m.r.cfg.DialTimeout)
	rawNet, err := m.r.dialEndpoint(dctx, ep)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, dialError(err)
	}
	m.r.metrics.connects.WithLabelValues(string(m.tier)).Inc()
	raw := &deadlineConn{Conn: rawNet, maxWindow: m.r.cfg.MaxResponseBytes, maxOp: m.r.cfg.MaxSessionBytes}
	raw.startOp(m.r.cfg.SetupTimeout)
	c := &conn{raw: raw, cmdTO: m.r.cfg.CommandTimeout, notify: make(chan struct{}, 1)}
	c.stop = context.AfterFunc(ctx, func() { _ = raw.Conn.Close() })
	ok := false
	defer func() {
		if !ok {
			c.stop()
			_ = raw.Conn.Close()
		}
	}()

	opts := &imapclient.Options{
		UnilateralDataHandler: &imapclient.UnilateralDataHandler{
			Expunge: func(uint32) { c.signal() },
			Mailbox: func(d *imapclient.UnilateralDataMailbox) {
				if d.NumMessages != nil {
					c.signal()
				}
			},
			Fetch: func(d *imapclient.FetchMessageData) {
				c.signal()
				// Read to its end (literals discarded, within the byte
				// budget): left unread, it would stall the client's
				// reader.
				for d.Next() != nil {
				}
			},
		},
		WordDecoder: wordDecoder,
	}
	tlsCfg := &tls.Config{ServerName: ep.Host, RootCAs: m.r.cfg.RootCAs, MinVersion: tls.VersionTLS12}
	c.arm()
	// The client reads the plain text through a nestConn (nest.go).
	switch ep.TLS {
	case domain.TLSNone:
		c.nest = newNestConn(raw, "")
	case domain.TLSStartTLS:
		tc, err := startTLS(ctx, c, tlsCfg)
		if err != nil {
			return nil, err
		}
		// The greeting was read before the upgrade; the client starts
		// from one of its own, and asks for the capabilities again, as
		// it must after STARTTLS.
		c.nest = newNestConn(tc, "* OK secured\r\n")
	default: // implicit, and anything not explicitly none
		tlsCfg.NextProtos = []string{"imap"}
		tc := tls.Client(raw, tlsCfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, c.fail("tls", err, ctx)
		}
		c.nest = newNestConn(tc, "")
	}
	c.c = imapclient.New(c.nest, opts)
	if err := c.c.WaitGreeting(); err != nil {
		if c.nest.refused.Load() {
			return nil, c.fail("connect", err, ctx)
		}
		return nil, greetingError(err, ctx)
	}
	if err := m.login(ctx, c); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// login unseals the credentials, logs in and wipes them.
func (m *mailboxRun) login(ctx context.Context, c *conn) error {
	if c.c.State() == imap.ConnStateAuthenticated {
		return nil // PREAUTH (never over STARTTLS: imapclient refuses it)
	}
	sec, err := m.unseal()
	if err != nil {
		return err
	}
	defer sec.wipe()
	if sec.refresh != nil {
		if err := m.loginOAuth(ctx, c, string(sec.refresh)); err != nil {
			return err
		}
		if _, err := m.caps(c); err != nil {
			return c.fail("capability", err, ctx)
		}
		return nil
	}
	c.arm()
	err = c.c.Login(m.job.Mailbox.IMAP.Username, sec.password()).Wait()
	if err != nil {
		var ie *imap.Error
		if errors.As(err, &ie) {
			return &Error{Kind: KindAuth, Op: "login", Code: knownCode(string(ie.Code)), Reason: "the server refused the credentials", Err: err}
		}
		return c.fail("login", err, ctx)
	}
	// Refresh capabilities after login (servers add some).
	if _, err := m.caps(c); err != nil {
		return c.fail("capability", err, ctx)
	}
	return nil
}

func (m *mailboxRun) caps(c *conn) (imap.CapSet, error) {
	c.arm()
	return c.c.Capability().Wait()
}

// classify turns a dial, TLS or protocol error into an *Error.
func classify(op string, err error, ctx context.Context) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	var (
		certErr  *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invalid  x509.CertificateInvalidError
		recErr   tls.RecordHeaderError
		alertErr tls.AlertError
	)
	// Fixed texts: a certificate's names and a server's words are the
	// remote's bytes.
	switch {
	case errors.As(err, &hostErr):
		return &Error{Kind: KindTLS, Op: op, Reason: "certificate is not valid for the host", Err: err}
	case errors.As(err, &certErr), errors.As(err, &unknown), errors.As(err, &invalid):
		return &Error{Kind: KindTLS, Op: op, Reason: "certificate not trusted", Err: err}
	case errors.As(err, &recErr):
		return &Error{Kind: KindTLS, Op: op, Reason: "the server does not speak TLS", Err: err}
	case errors.As(err, &alertErr):
		return &Error{Kind: KindTLS, Op: op, Reason: "the server refused the TLS handshake", Err: err}
	}
	var ie *imap.Error
	if errors.As(err, &ie) {
		return &Error{Kind: KindProtocol, Op: op, Code: knownCode(string(ie.Code)), Reason: "the server answered " + string(ie.Type), Err: err}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &Error{Kind: KindTimeout, Op: op, Reason: "the server did not answer in time", Err: err}
	}
	return &Error{Kind: KindNetwork, Op: op, Reason: "connection failed", Err: err}
}

// noServer is the one text of every failure before an IMAP greeting: a
// refused port, an open port that is not IMAP and a silent one read alike,
// so the runner is no port scanner.
const noServer = "no IMAP server answered"

// greetingError classifies a failure to read the greeting as KindNetwork.
func greetingError(err error, ctx context.Context) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return &Error{Kind: KindNetwork, Op: "connect", Reason: noServer, Err: err}
}

// dialError classifies a failed TCP connect: refused by the transport
// policy, a name that does not resolve, or no server (KindNetwork, the
// same as a failed greeting).
func dialError(err error) error {
	var pe *policyError
	if errors.As(err, &pe) {
		return &Error{Kind: KindPolicy, Op: "connect", Reason: pe.why, Err: err}
	}
	var de *net.DNSError
	if errors.As(err, &de) {
		return &Error{Kind: KindDNS, Op: "connect", Reason: "the host name did not resolve", Err: err}
	}
	return &Error{Kind: KindNetwork, Op: "connect", Reason: noServer, Err: err}
}

// policyError is a connection the transport policy refused.
type policyError struct{ why string }

func (e *policyError) Error() string { return "transport policy: " + e.why }

// dialEndpoint opens the TCP connection to ep, refusing before any packet
// is sent an address the transport policy does not allow. The check runs
// on the resolved address (net.Dialer.Control sees each address the
// dialer is about to connect to), so a host name resolving to an internal
// address, at once or after a rebinding, is refused too. A custom
// Config.Dial is checked on the connected peer's address instead, before a
// byte is read or written.
func (r *Runner) dialEndpoint(ctx context.Context, ep domain.IMAPEndpoint) (net.Conn, error) {
	addr := net.JoinHostPort(ep.Host, strconv.Itoa(ep.Port))
	check := func(peer netip.AddrPort) error {
		if why := r.cfg.Transport.DialRefusal(ep.Host, peer, ep.TLS); why != "" {
			return &policyError{why: why}
		}
		return nil
	}
	if r.cfg.Dial == nil {
		nd := &net.Dialer{
			KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 60 * time.Second, Interval: 15 * time.Second, Count: 4},
			Control: func(_, address string, _ syscall.RawConn) error {
				ap, err := netip.ParseAddrPort(address)
				if err != nil {
					return &policyError{why: "unparsable peer address"}
				}
				return check(ap)
			},
		}
		return nd.DialContext(ctx, "tcp", addr)
	}
	c, err := r.cfg.Dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	ta, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		_ = c.Close()
		return nil, &policyError{why: "peer is not a TCP address"}
	}
	if err := check(ta.AddrPort()); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

func wrapf(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, err)
}

var wordDecoder = &mime.WordDecoder{}
