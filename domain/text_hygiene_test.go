package domain_test

import (
	"testing"

	"github.com/mailplane/mailplane/domain"
)

// TestCleanText: what the decision-log readers make of legacy text.
func TestCleanText(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"10.0.0.1:25":          "10.0.0.1:25",
		"10.0.0.1:25\x00":      "10.0.0.1:25\uFFFD",
		"a\r\nb":               "a\uFFFD\uFFFDb",
		"x\u202eyz":            "x\uFFFDyz",
		"bad \xff byte":        "bad \uFFFD byte",
		"ok é \u200f rtl mark": "ok é \u200f rtl mark",
	} {
		got := domain.CleanText(in)
		if got != want || !domain.IsCleanText(got) {
			t.Errorf("CleanText(%+q) = %+q, want %+q", in, got, want)
		}
	}
}

// FuzzCleanText: CleanText always yields clean text of the same length in
// characters as JSON would read the input, and leaves clean text alone.
func FuzzCleanText(f *testing.F) {
	for _, s := range []string{"", "a", "\x00", "a\u2028b", "\xff\xfe", "é\u202e"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c := domain.CleanText(s)
		if !domain.IsCleanText(c) {
			t.Fatalf("CleanText(%+q) = %+q is not clean", s, c)
		}
		if domain.IsCleanText(s) && c != s {
			t.Fatalf("CleanText changed clean text %+q to %+q", s, c)
		}
		if n, m := len([]rune(s)), len([]rune(c)); n != m {
			t.Fatalf("CleanText(%+q): %d characters, was %d", s, m, n)
		}
	})
}
