package console

import (
	"net/http"
	"net/netip"
	"testing"
	"time"
)

// TestLoginBucketsBounded: however many addresses try, the buckets held
// stay within the bound.
func TestLoginBucketsBounded(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	l := newAddrLimiter(10, 10, 100, func() time.Time { return now })
	for i := range 5000 {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		if ok, _ := l.take(netip.PrefixFrom(a, 32)); !ok {
			t.Fatalf("address %d refused its first attempt", i)
		}
		if len(l.m) > 100 {
			t.Fatalf("%d buckets held, bound 100", len(l.m))
		}
	}
}

// TestClientAddr: the peer's address, unless the peer is a trusted proxy:
// then the last X-Forwarded-For hop that is not one; an unreadable hop
// stops the walk at the last readable address.
func TestClientAddr(t *testing.T) {
	t.Parallel()
	trusted, err := ParseTrustedProxies(" 10.0.0.0/8, 127.0.0.1 ,::1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseTrustedProxies("10.0.0.0/33"); err == nil {
		t.Error("a prefix of 33 bits was accepted")
	}
	if _, err := ParseTrustedProxies("proxy.example.org"); err == nil {
		t.Error("a host name was accepted")
	}
	for _, c := range []struct{ remote, xff, want string }{
		{"198.51.100.7:5000", "203.0.113.1", "198.51.100.7/32"},
		{"127.0.0.1:5000", "", "127.0.0.1/32"},
		{"127.0.0.1:5000", "203.0.113.1", "203.0.113.1/32"},
		{"127.0.0.1:5000", "198.51.100.1, 203.0.113.1, 10.2.3.4", "203.0.113.1/32"},
		{"127.0.0.1:5000", "garbage, 10.2.3.4", "10.2.3.4/32"},
		{"[::1]:5000", "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"[::ffff:198.51.100.7]:5000", "", "198.51.100.7/32"},
	} {
		r := &http.Request{RemoteAddr: c.remote, Header: http.Header{}}
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		if got := clientAddr(r, trusted); got.String() != c.want {
			t.Errorf("%s, X-Forwarded-For %q: %s, want %s", c.remote, c.xff, got, c.want)
		}
	}
}
