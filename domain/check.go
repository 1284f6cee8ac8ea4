package domain

import (
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

// TextPattern is the pattern every free-text field of every schema carries
// (and fields with a pattern of their own fold its class in): no character
// that forges or hides text where records are read (kcat, Redpanda Console,
// psql, logs) and none a consumer cannot store. Refused are the C0 and C1
// controls (Unicode Cc: NUL, which Postgres text cannot hold, CR and LF,
// which forge lines, ESC, which drives terminals, and the rest), the line
// and paragraph separators U+2028 and U+2029 (line breaks in JavaScript
// views), and the bidirectional embeddings, overrides and isolates
// U+202A–U+202E and U+2066–U+2069 (they reorder what a reader sees, as in
// "Trojan Source"). No field mailplane has needs any of them; the
// implicit marks U+200E and U+200F, which right-to-left text does use,
// stay allowed. checkText applies it (IsCleanText).
const TextPattern = "^[^" + TextPatternClass + "]*$"

// TextPatternClass is TextPattern's character class body, folded into the
// classes of fields with patterns of their own (addresses).
const TextPatternClass = "\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069"

// These patterns are mirrored verbatim in the JSON Schemas under
// domain/schemas; the agreement test keeps the two in step.
var (
	uuidPattern    = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	uuidV7Pattern  = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	addressPattern = regexp.MustCompile(`^[^@\s` + TextPatternClass + `]+@[^@\s` + TextPatternClass + `]+\.[^@\s` + TextPatternClass + `]+$`)
	textPattern    = regexp.MustCompile(TextPattern)
	// sourcePattern is the URI-reference (RFC 3986) a CloudEvents source
	// must be (documented in domain/schemas/README.md: the schemas cover
	// data only), as isURIReference checks it: an optional scheme, then only
	// URI characters and %XX escapes, a first segment without a colon when
	// there is no scheme, and at most one '#'.
	sourcePattern = regexp.MustCompile(`^(?:[A-Za-z][A-Za-z0-9+.-]*:` + uriCharsRE + `*|` + uriSegRE + `*(?:[/?]` + uriCharsRE + `*)?)(?:#` + uriCharsRE + `*)?$`)
	hostPattern   = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$`)
	base64Pattern = regexp.MustCompile(`^[A-Za-z0-9+/]+={0,2}$`)
	keyIDPattern  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
	// rfc3339Pattern is the strict RFC 3339 timestamp the schemas require
	// (with format date-time for the calendar); time.Time alone is laxer.
	rfc3339Pattern = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`)
)

const (
	uriCharsRE = `(?:[A-Za-z0-9._~!$&'()*+,;=:@/?\[\]-]|%[0-9A-Fa-f]{2})`
	uriSegRE   = `(?:[A-Za-z0-9._~!$&'()*+,;=@\[\]-]|%[0-9A-Fa-f]{2})`
)

// IsUUID reports whether s is a canonical lower-case UUID (uuidPattern,
// checked by hand: it runs several times per event on the ingest path).
func IsUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < 36; i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
		}
	}
	return true
}

// IsUUIDv7 reports whether s is a canonical lower-case version-7 UUID
// (uuidV7Pattern).
func IsUUIDv7(s string) bool {
	return IsUUID(s) && s[14] == '7' && (s[19] == '8' || s[19] == '9' || s[19] == 'a' || s[19] == 'b')
}

func checkUUID(ps *Problems, field, v string) {
	switch {
	case v == "":
		ps.Add(field, CodeRequired, "is required")
	case !IsUUID(v):
		ps.Add(field, CodeInvalid, "must be a lower-case UUID")
	}
}

// checkText checks a required (when min > 0) string of at most max
// characters (code points, as JSON Schema counts them) that is valid UTF-8
// and clean (TextPattern). The problem names the character by code point
// and position only, so the message itself forges nothing.
func checkText(ps *Problems, field, v string, required bool, max int) bool {
	if v == "" {
		if required {
			ps.Add(field, CodeRequired, "is required")
		}
		return false
	}
	// One pass finds the first refused character and counts the runes.
	runes, i, r := scanText(v)
	if i >= 0 {
		if r == utf8.RuneError {
			ps.Add(field, CodeForbiddenCharacter, "must be valid UTF-8 (invalid byte at offset %d)", i)
		} else {
			ps.Add(field, CodeForbiddenCharacter, "must not contain control, line-separator or bidi characters (%U at character %d)", r, runes+1)
		}
		return false
	}
	if runes > max {
		ps.Add(field, CodeTooLong, "must be at most %d characters", max)
		return false
	}
	return true
}

// checkSource checks a CloudEvents source: clean text of at most 256
// characters that is a URI-reference (RFC 3986).
func checkSource(ps *Problems, field, v string) {
	if checkText(ps, field, v, true, 256) && !isURIReference(v) {
		ps.Add(field, CodeInvalid, "must be a URI-reference (RFC 3986): URI characters and %%XX escapes only, no spaces")
	}
}

// IsCleanText reports whether s is valid UTF-8 without a character
// TextPattern refuses.
func IsCleanText(s string) bool {
	_, i, _ := scanText(s)
	return i < 0
}

// CleanText returns s with every character TextPattern refuses, and every
// invalid UTF-8 byte, replaced by U+FFFD. Readers of the decision log use it
// on text written before the rule (see DecodePlacementDecision), and
// writers on foreign text they put in an event (a server's refusal).
func CleanText(s string) string {
	if IsCleanText(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s { // ranging yields U+FFFD for invalid bytes
		if isForbiddenRune(r) {
			r = utf8.RuneError
		}
		b.WriteRune(r)
	}
	return b.String()
}

// scanText walks s once: it returns the offset of the first character
// TextPattern refuses, or of the first invalid UTF-8 byte (bad, -1 when
// none), that character (utf8.RuneError for an invalid byte), and the runes
// before it (all of s's runes when bad is -1).
func scanText(s string) (runes, bad int, r rune) {
	for i := 0; i < len(s); runes++ {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return runes, i, rune(c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || isForbiddenRune(r) {
			return runes, i, r
		}
		i += n
	}
	return runes, -1, 0
}

// isForbiddenRune is the class TextPattern refuses.
func isForbiddenRune(r rune) bool {
	return r < 0x20 || 0x7f <= r && r <= 0x9f || r == 0x2028 || r == 0x2029 ||
		0x202a <= r && r <= 0x202e || 0x2066 <= r && r <= 0x2069
}

func checkEnum[T ~string](ps *Problems, field string, v T, required bool, allowed ...T) {
	if v == "" {
		if required {
			ps.Add(field, CodeRequired, "is required")
		}
		return
	}
	if !slices.Contains(allowed, v) {
		ps.Add(field, CodeInvalid, "must be one of %v", allowed)
	}
}

func checkRange(ps *Problems, field string, v, min, max int64) {
	if v < min || v > max {
		ps.Add(field, CodeOutOfRange, "must be between %d and %d", min, max)
	}
}

// Hand-written equivalents of the patterns above, which run on every event
// decoded; TestPatternChecksMatchRegexps keeps each equal to its pattern.

// isHost matches hostPattern.
func isHost(s string) bool {
	if s == "" || !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

// isAddress matches addressPattern: local@domain.tld, no spaces, one @,
// clean text.
func isAddress(s string) bool {
	if !IsCleanText(s) {
		return false
	}
	at := -1
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '@':
			if at >= 0 {
				return false
			}
			at = i
		case isRegexpSpace(c):
			return false
		}
	}
	if at <= 0 {
		return false
	}
	domain := s[at+1:]
	// [^@\s]+\.[^@\s]+ : some dot with a character on each side.
	for i := 1; i < len(domain)-1; i++ {
		if domain[i] == '.' {
			return true
		}
	}
	return false
}

// isURIReference matches sourcePattern.
func isURIReference(s string) bool {
	rest, frag, hasFrag := strings.Cut(s, "#")
	if hasFrag && !isURIChars(frag) {
		return false
	}
	first := rest
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		first = rest[:i]
	}
	if colon := strings.IndexByte(first, ':'); colon >= 0 {
		// A colon in the first segment ends a scheme.
		scheme := first[:colon]
		if scheme == "" || !isAlpha(scheme[0]) {
			return false
		}
		for i := 1; i < len(scheme); i++ {
			if c := scheme[i]; !isAlnum(c) && c != '+' && c != '-' && c != '.' {
				return false
			}
		}
	}
	return isURIChars(rest)
}

// uriPunct marks the RFC 3986 punctuation a URI may hold besides '%' and
// '#' (isURIChars runs on every decoded event's source).
var uriPunct = func() (t [256]bool) {
	for _, c := range []byte("-._~!$&'()*+,;=:@/?[]") {
		t[c] = true
	}
	return t
}()

// isURIChars reports whether s holds only RFC 3986 URI characters other
// than '#' (a '%' only as %XX).
func isURIChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case isAlnum(c):
		case c == '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return false
			}
			i += 2
		case uriPunct[c]:
		default:
			return false
		}
	}
	return true
}

func isAlpha(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

// isRegexpSpace is \s in Go's regexp syntax: [\t\n\f\r ] (no \v).
func isRegexpSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r'
}

// isBase64 matches base64Pattern.
func isBase64(s string) bool {
	n := len(s)
	for n > 0 && s[n-1] == '=' && len(s)-n < 2 {
		n--
	}
	if n == 0 {
		return false
	}
	for i := 0; i < n; i++ {
		c := s[i]
		if !isAlnum(c) && c != '+' && c != '/' {
			return false
		}
	}
	return true
}

// isKeyID matches keyIDPattern.
func isKeyID(s string) bool { return isToken(s, 64) }

// isToken matches [A-Za-z0-9._-]{1,max}.
func isToken(s string, max int) bool {
	if len(s) < 1 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}
