package domain

import (
	"math/rand/v2"
	"testing"
	"unicode/utf8"
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

func TestPatternChecksMatchRegexps(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(11, 13))
	const alphabet = "ab09AZ.-_@+/= \t\n\v\f\r\u00e9xyz:?#%[]~!$&'()*,;\"<>\\{}|^`\x00\x7f\u0085\u2028\u202e\u2066\u200f"
	seeds := []string{
		"imap.example.com", "a", "-a", "a-", "a..b", "127.0.0.1", "ada@example.com", "a@b.c", "a@b.", "@b.c",
		"a@@b.c", "a b@c.d", "AAAA", "AA==", "A===", "==", "", "k1", "dev-1.key_2", "x@y.z\u00e9",
		"mailplane/cli", "urn:a:b", "1a:b", "a:b/c:d", "/x:y", "a/b:c", "%41", "%4", "%zz", "a#b", "a#b#c", "#", "?q#f",
		"a\x00@b.c", "a@b.c\u2028", "\xff", "a\xffb@c.d",
	}
	check := func(s string) {
		if isHost(s) != hostPattern.MatchString(s) {
			t.Fatalf("isHost(%q) = %v, pattern %v", s, isHost(s), hostPattern.MatchString(s))
		}
		// Invalid UTF-8 never reaches a schema (JSON reads it as U+FFFD);
		// Go refuses it.
		if isAddress(s) != (utf8.ValidString(s) && addressPattern.MatchString(s)) {
			t.Fatalf("isAddress(%q) = %v, pattern %v", s, isAddress(s), addressPattern.MatchString(s))
		}
		if isBase64(s) != base64Pattern.MatchString(s) {
			t.Fatalf("isBase64(%q) = %v, pattern %v", s, isBase64(s), base64Pattern.MatchString(s))
		}
		if isURIReference(s) != sourcePattern.MatchString(s) {
			t.Fatalf("isURIReference(%q) = %v, pattern %v", s, isURIReference(s), sourcePattern.MatchString(s))
		}
		if IsCleanText(s) != (utf8.ValidString(s) && textPattern.MatchString(s)) {
			t.Fatalf("IsCleanText(%q) = %v, pattern %v", s, IsCleanText(s), textPattern.MatchString(s))
		}
		if isKeyID(s) != keyIDPattern.MatchString(s) {
			t.Fatalf("isKeyID(%q) = %v, pattern %v", s, isKeyID(s), keyIDPattern.MatchString(s))
		}
	}
	for _, s := range seeds {
		check(s)
	}
	runes := []rune(alphabet)
	for i := 0; i < 300000; i++ {
		n := rng.IntN(12)
		b := make([]rune, n)
		for j := range b {
			b[j] = runes[rng.IntN(len(runes))]
		}
		check(string(b))
	}
	long := make([]byte, 70)
	for i := range long {
		long[i] = 'k'
	}
	check(string(long))
}
