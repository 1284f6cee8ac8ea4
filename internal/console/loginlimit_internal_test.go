package console

import (
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
