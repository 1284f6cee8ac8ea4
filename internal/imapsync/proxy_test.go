package imapsync_test

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxy is a TCP proxy in front of a test IMAP server. It counts
// connections (and their peak), can close them all (as a server that hangs
// up) and can black-hole the current ones: they stay open but nothing is
// forwarded any more, either way, as behind a dead NAT or a pulled cable.
type proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[*pconn]struct{}
	all    []*pconn
	active int
	peak   int
	total  int
	// settingUp counts connections whose client has sent LIST (its first
	// command after the login: the runner's setup slot is taken) and not
	// IDLE yet (plain-text servers only), peakSetup its largest value.
	settingUp, peakSetup int
}

type pconn struct {
	listed, idled  bool // the client sent LIST, IDLE (under the proxy's mu)
	client, server net.Conn
	opened, ended  time.Time // ended: when the proxy saw the client hang up
	frozen         atomic.Bool
	once           sync.Once
}

func (c *pconn) close() {
	c.once.Do(func() {
		c.client.Close()
		c.server.Close()
	})
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[*pconn]struct{}{}}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.CloseAll()
	})
	return p
}

func (p *proxy) Host() string { return "127.0.0.1" }
func (p *proxy) Port() int    { return p.ln.Addr().(*net.TCPAddr).Port }
func (p *proxy) Addr() string { return net.JoinHostPort(p.Host(), strconv.Itoa(p.Port())) }

func (p *proxy) serve() {
	for {
		cl, err := p.ln.Accept()
		if err != nil {
			return
		}
		sv, err := net.Dial("tcp", p.target)
		if err != nil {
			cl.Close()
			continue
		}
		c := &pconn{client: cl, server: sv, opened: time.Now()}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.all = append(p.all, c)
		p.active++
		p.total++
		p.peak = max(p.peak, p.active)
		p.mu.Unlock()
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); p.pipe(c, sv, cl) }()
		go func() {
			defer wg.Done()
			p.pipe(c, cl, sv)
		}()
		go func() {
			wg.Wait()
			p.mu.Lock()
			delete(p.conns, c)
			p.active--
			if c.listed && !c.idled {
				p.settingUp--
			}
			p.mu.Unlock()
		}()
	}
}

// pipe copies src to dst until either ends; frozen data is dropped.
func (p *proxy) pipe(c *pconn, dst, src net.Conn) {
	defer c.close()
	if src == c.client {
		defer func() {
			p.mu.Lock()
			if c.ended.IsZero() {
				c.ended = time.Now()
			}
			p.mu.Unlock()
		}()
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && src == c.client {
			// Marked before it is forwarded: before the server can
			// acknowledge the IDLE, so before the client goes on.
			p.mu.Lock()
			if !c.listed && bytes.Contains(buf[:n], []byte(" LIST ")) {
				c.listed = true
				p.settingUp++
				p.peakSetup = max(p.peakSetup, p.settingUp)
			}
			if c.listed && !c.idled && bytes.Contains(buf[:n], []byte(" IDLE\r\n")) {
				c.idled = true
				p.settingUp--
			}
			p.mu.Unlock()
		}
		if n > 0 && !c.frozen.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

// CloseAll closes every current connection.
func (p *proxy) CloseAll() {
	p.mu.Lock()
	cs := make([]*pconn, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		c.close()
	}
}

// BlackHole stops forwarding on every current connection (new ones work).
// It returns how many it froze.
func (p *proxy) BlackHole() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.frozen.Store(true)
	}
	return len(p.conns)
}

// Overlap returns the most connections that were open at once, counting a
// connection as closed slack before the proxy noticed its client hang up
// (the proxy notices a close a scheduling delay after it happened).
func (p *proxy) Overlap(slack time.Duration) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	best := 0
	for _, a := range p.all {
		n := 0
		for _, b := range p.all {
			end := b.ended
			if end.IsZero() {
				end = now
			} else {
				end = end.Add(-slack)
			}
			if !b.opened.After(a.opened) && end.After(a.opened) {
				n++
			}
		}
		best = max(best, n)
	}
	return best
}

// Idled returns how many open connections have sent IDLE, and how many
// are setting up (sent LIST, not IDLE yet).
func (p *proxy) Idled() (idled, settingUp int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if c.idled {
			idled++
		}
	}
	return idled, p.settingUp
}

// SetupPeak returns the most connections open at once whose client had
// sent LIST but not IDLE yet.
func (p *proxy) SetupPeak() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.peakSetup
}

// Stats returns the open connections, the peak and the total accepted.
func (p *proxy) Stats() (active, peak, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.active, p.peak, p.total
}
