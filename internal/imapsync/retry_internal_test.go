package imapsync

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/mailplane/mailplane/internal/sealing"
)

// TestRetryWaits holds the runner's waits after failures to what they have
// always been: after the n-th failure in a row, half fixed and half random
// below a ceiling of BackoffMin doubled n-1 times, at most BackoffMax and
// lowered to the loop's ceiling (never below BackoffMin); after refused
// credentials the doubling goes on to AuthBackoffMax, past both.
func TestRetryWaits(t *testing.T) {
	kr, err := sealing.NewKeyring("test-1", map[string][]byte{"test-1": bytes.Repeat([]byte{3}, sealing.KeySize)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Keyring: kr, BackoffMin: time.Second, BackoffMax: 8 * time.Second, AuthBackoffMax: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	inHalf := func(t *testing.T, what string, d, ceiling time.Duration) {
		t.Helper()
		if d < ceiling/2 || d > ceiling {
			t.Errorf("%s: waited %s, want within [%s, %s]", what, d, ceiling/2, ceiling)
		}
	}
	for _, tc := range []struct {
		name    string
		limit   time.Duration // the loop's ceiling
		ceiling []time.Duration
	}{
		{"to BackoffMax", time.Hour, []time.Duration{1, 2, 4, 8, 8, 8}},
		{"lowered to the poll interval", 3 * time.Second, []time.Duration{1, 2, 3, 3}},
		{"never below BackoffMin", time.Millisecond, []time.Duration{1, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 50 { // the random half varies: every draw stays in range
				b := r.retries()
				for i, c := range tc.ceiling {
					inHalf(t, fmt.Sprintf("failure %d", i+1), b.NextWithin(tc.limit), c*time.Second)
				}
				if got := b.Failures(); got != len(tc.ceiling) {
					t.Fatalf("counted %d failures, want %d", got, len(tc.ceiling))
				}
				b.Reset()
				inHalf(t, "after a success", b.NextWithin(tc.limit), time.Second)
			}
		})
	}
	t.Run("refused credentials", func(t *testing.T) {
		for n, c := range []time.Duration{1, 2, 4, 8, 16, 32, 60, 60} {
			for range 50 {
				inHalf(t, fmt.Sprintf("refusal %d", n+1), r.authRetry.Wait(n+1, nil), c*time.Second)
			}
		}
	})
}
