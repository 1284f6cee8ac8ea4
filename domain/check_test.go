package domain

import (
	"math/rand/v2"
	"testing"
)

// The hand-written UUID checks agree with the patterns the schemas carry.
func TestUUIDChecksMatchPatterns(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 7))
	const alphabet = "0123456789abcdefABCDEF-g78 9ab"
	base := []string{
		"0190a5b2-4c5e-7b1a-9c3d-00000000e005", "0190a5b2-4c5e-4b1a-9c3d-00000000e005",
		"0190a5b2-4c5e-7b1a-cc3d-00000000e005", "0190A5B2-4c5e-7b1a-9c3d-00000000e005", "",
	}
	for i := 0; i < 200000; i++ {
		var s string
		if i < len(base) {
			s = base[i]
		} else {
			b := []byte(base[rng.IntN(3)])
			for n := rng.IntN(3); n >= 0; n-- {
				b[rng.IntN(len(b))] = alphabet[rng.IntN(len(alphabet))]
			}
			s = string(b)
			if rng.IntN(20) == 0 {
				s = s[:rng.IntN(len(s))]
			}
		}
		if IsUUID(s) != uuidPattern.MatchString(s) || IsUUIDv7(s) != uuidV7Pattern.MatchString(s) {
			t.Fatalf("%q: IsUUID %v (pattern %v), IsUUIDv7 %v (pattern %v)", s, IsUUID(s), uuidPattern.MatchString(s), IsUUIDv7(s), uuidV7Pattern.MatchString(s))
		}
	}
}
