package domain

import (
	"regexp"
	"slices"
	"unicode/utf8"
)

// These patterns are mirrored verbatim in the JSON Schemas under
// domain/schemas; the agreement test keeps the two in step.
var (
	uuidPattern    = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	uuidV7Pattern  = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	addressPattern = regexp.MustCompile(`^[^@\s]+@[^@\s]+\.[^@\s]+$`)
	hostPattern    = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$`)
	base64Pattern  = regexp.MustCompile(`^[A-Za-z0-9+/]+={0,2}$`)
	keyIDPattern   = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
	// rfc3339Pattern is the strict RFC 3339 timestamp the schemas require
	// (with format date-time for the calendar); time.Time alone is laxer.
	rfc3339Pattern = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`)
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
// characters (code points, as JSON Schema counts them).
func checkText(ps *Problems, field, v string, required bool, max int) bool {
	if v == "" {
		if required {
			ps.Add(field, CodeRequired, "is required")
		}
		return false
	}
	if utf8.RuneCountInString(v) > max {
		ps.Add(field, CodeTooLong, "must be at most %d characters", max)
		return false
	}
	return true
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

// isAddress matches addressPattern: local@domain.tld, no spaces, one @.
func isAddress(s string) bool {
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
