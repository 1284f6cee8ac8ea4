package domain_test

import (
	"testing"

	"github.com/mailplane/mailplane/domain"
)

func TestWarmupHeaderRoundTrip(t *testing.T) {
	t.Parallel()
	const sender = "0190a5b2-4c5e-7b1a-9c3d-00000000aa01"
	key := []byte("k-0123456789abcdef")
	for _, k := range [][]byte{nil, key} {
		v := domain.FormatWarmupHeader(sender, "w.1", k)
		s, id, outcome := domain.ParseWarmupHeader(v, k)
		if outcome != domain.WarmupValid || s != sender || id != "w.1" {
			t.Fatalf("key %q: %q → %q %q %q", k, v, s, id, outcome)
		}
	}
	signed := domain.FormatWarmupHeader(sender, "w.1", key)
	if _, _, o := domain.ParseWarmupHeader(signed, []byte("other-key-0123456")); o != domain.WarmupForged {
		t.Fatalf("another key: %s", o)
	}
	if _, _, o := domain.ParseWarmupHeader(domain.FormatWarmupHeader(sender, "w.1", nil), key); o != domain.WarmupUnsigned {
		t.Fatalf("unsigned: %s", o)
	}
	// The signature binds sender and id.
	other := domain.FormatWarmupHeader("0190a5b2-4c5e-7b1a-9c3d-00000000aa02", "w.1", key)
	if signed[len(signed)-22:] == other[len(other)-22:] {
		t.Fatal("two senders share a signature")
	}
}
