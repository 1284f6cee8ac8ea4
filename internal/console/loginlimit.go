package console

import (
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mailplane/mailplane/internal/api"
)

// Login attempts are limited per client address, before the form is read:
// a token bucket per address (per /64 for IPv6, which one host is given
// whole), in a bounded map. The address is the connection's peer;
// X-Forwarded-For is believed only from a peer in Config.TrustedProxies,
// and then only up to the first address that is not a trusted proxy
// itself, so a client cannot name its own address.
const (
	// DefaultLoginsPerMinute and DefaultLoginBurst: an operator who
	// mistypes a token a few times is not held up; a guesser gets ten a
	// minute per address.
	DefaultLoginsPerMinute = 10
	DefaultLoginBurst      = 10
	// maxLoginAddrs bounds the addresses whose buckets are held.
	maxLoginAddrs = 10_000
)

type addrBucket struct {
	tokens float64
	last   time.Time
}

// addrLimiter is a token bucket per client address.
type addrLimiter struct {
	rate, burst float64 // tokens a second, bucket size
	max         int
	now         func() time.Time

	mu sync.Mutex
	m  map[netip.Prefix]*addrBucket
}

func newAddrLimiter(perMinute float64, burst int, max int, now func() time.Time) *addrLimiter {
	return &addrLimiter{rate: perMinute / 60, burst: float64(burst), max: max, now: now, m: map[netip.Prefix]*addrBucket{}}
}

// take spends a token of addr's bucket; when there is none it returns
// false and how long until there is.
func (l *addrLimiter) take(addr netip.Prefix) (bool, time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.m[addr]
	if b == nil {
		if len(l.m) >= l.max {
			l.evict(now)
		}
		b = &addrBucket{tokens: l.burst, last: now}
		l.m[addr] = b
	}
	b.tokens = math.Min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.rate)
	b.last = now
	if b.tokens < 1 {
		return false, time.Duration(math.Ceil((1-b.tokens)/l.rate)) * time.Second
	}
	b.tokens--
	return true, 0
}

// evict makes room: buckets that have refilled are as good as absent;
// when none has, an arbitrary one goes (an address that many can only
// get a fresh bucket by pushing others out, not more attempts each).
// The caller holds mu.
func (l *addrLimiter) evict(now time.Time) {
	for k, b := range l.m {
		if b.tokens+now.Sub(b.last).Seconds()*l.rate >= l.burst {
			delete(l.m, k)
		}
	}
	for k := range l.m {
		if len(l.m) < l.max {
			break
		}
		delete(l.m, k)
	}
}

// clientAddr is the address a request's login attempts are counted
// under: the peer's, or, from a trusted proxy, the last address of
// X-Forwarded-For that is not a trusted proxy.
func clientAddr(r *http.Request, trusted []netip.Prefix) netip.Prefix {
	addr := clientIP(r, trusted)
	if !addr.IsValid() {
		return netip.Prefix{}
	}
	bits := 32
	if addr.Is6() {
		bits = 64
	}
	p, _ := addr.Prefix(bits)
	return p
}

// clientIP is a request's client address: the peer's, or, from a trusted
// proxy, the last address of X-Forwarded-For that is not a trusted proxy.
func clientIP(r *http.Request, trusted []netip.Prefix) netip.Addr {
	addr := parseAddr(r.RemoteAddr)
	if !addr.IsValid() {
		return addr
	}
	if isTrusted(addr, trusted) {
		hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
		for i := len(hops) - 1; i >= 0 && isTrusted(addr, trusted); i-- {
			a := parseAddr(strings.TrimSpace(hops[i]))
			if !a.IsValid() {
				break // a hop we cannot read: count under the last we could
			}
			addr = a
		}
	}
	return addr
}

// parseAddr reads "host:port" or a bare address.
func parseAddr(s string) netip.Addr {
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap().WithZone("")
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ParseTrustedProxies reads a comma-separated list of addresses and
// CIDR prefixes (MAILPLANE_HTTP_TRUSTED_PROXIES); empty: none.
func ParseTrustedProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, err
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, err
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// screenLogin limits login attempts per client address before the form
// is read: 429 with Retry-After when the address has none left.
func (c *Console) screenLogin(w http.ResponseWriter, r *http.Request) (api.Class, bool) {
	if ok, retry := c.attempts.take(clientAddr(r, c.cfg.TrustedProxies)); !ok {
		c.logins.WithLabelValues("limited").Inc()
		secs := max(1, int(retry/time.Second))
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		c.headers(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			c.refuse(w, http.StatusTooManyRequests, "too many login attempts from your address (rate_limited); retry in "+strconv.Itoa(secs)+" s")
		})).ServeHTTP(w, r)
		return "", false
	}
	return api.ClassAnonymous, true
}

// screenPost charges a console post with a live session to the
// console's budget and refuses one without, from its headers, before any
// budget is reserved or its form read: such posts are not login attempts,
// so the per-address login limit does not see them, and reading their
// forms let one address hold the anonymous budget that the login form
// needs.
func (c *Console) screenPost(w http.ResponseWriter, r *http.Request) (api.Class, bool) {
	if _, ok := c.authenticate(r); ok {
		return api.ClassConsole, true
	}
	c.headers(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !sameOrigin(r) {
			c.refuse(w, http.StatusForbidden, "cross-site form posts are refused")
			return
		}
		c.refuse(w, http.StatusForbidden, "the form expired or was not ours")
	})).ServeHTTP(w, r)
	return "", false
}

// limits are the body limits of a console route: forms of a few KiB.
func (c *Console) limits(pattern string) api.RouteLimits {
	l := api.RouteLimits{Class: api.ClassAnonymous, MaxBody: maxFormBytes}
	switch {
	case pattern == "POST "+Prefix+"login":
		l.Classify = c.screenLogin
	case strings.HasPrefix(pattern, "POST "):
		l.Classify = c.screenPost
	}
	return l
}
