package eventschema_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/eventschema"
)

// hostileRunes are characters every text field refuses (domain.TextPattern):
// NUL (Postgres text cannot hold it), CR and LF (forged lines), TAB, ESC
// (terminal control), DEL, C1 controls (NEL, CSI), the line and paragraph
// separators, and bidi overrides and isolates.
var hostileRunes = []rune{0x00, '\r', '\n', '\t', 0x1b, 0x7f, 0x85, 0x9b, 0x2028, 0x2029, 0x202e, 0x2066}

// hostileVariants returns v with c in front, in the middle and at the end.
func hostileVariants(v string, c rune) []string {
	r := []rune(v)
	mid := len(r) / 2
	return []string{string(c) + v, string(r[:mid]) + string(c) + string(r[mid:]), v + string(c)}
}

// schemaValueAt returns the string at a dotted path of base ("" if none).
func schemaValueAt(base, path string) string {
	var m map[string]any
	if err := json.Unmarshal([]byte(base), &m); err != nil {
		panic(err)
	}
	keys := strings.Split(path, ".")
	for _, k := range keys[:len(keys)-1] {
		m, _ = m[k].(map[string]any)
	}
	s, _ := m[keys[len(keys)-1]].(string)
	return s
}

// stringPaths walks a schema for its string properties (nested ones too).
func stringPaths(n *schemaShape, prefix string) []string {
	var out []string
	for name, p := range n.Properties {
		switch p.Type {
		case "string":
			out = append(out, prefix+name)
		case "object":
			out = append(out, stringPaths(p, prefix+name+".")...)
		}
	}
	slices.Sort(out)
	return out
}

// TestEveryTextFieldRefusesHostileCharacters: generated from the schema
// files, every string property of every event type, with each hostile
// character in front, in the middle and at the end of its valid value, is
// refused by the Go validation at that field and by the schema. Fields whose
// rule is text (their pattern is domain.TextPattern or folds its class in)
// are refused with forbidden_character.
func TestEveryTextFieldRefusesHostileCharacters(t *testing.T) {
	t.Parallel()
	v := eventschema.Default()
	fields := 0
	for _, typ := range domain.EventTypes() {
		root := loadSchemaShape(t, typ)
		base := schemaValidData[typ]
		for _, path := range stringPaths(root, "") {
			fields++
			p := schemaPropAt(root, path)
			text := p.Pattern == domain.TextPattern || strings.Contains(p.Pattern, domain.TextPatternClass)
			for _, c := range hostileRunes {
				for _, val := range hostileVariants(schemaValueAt(base, path), c) {
					data := []byte(schemaEdit(base, path, val))
					gps := domain.Problems(nil)
					if d, ps := domain.DecodeData(typ, data, true); len(ps) > 0 {
						gps = ps
					} else {
						gps = d.Validate().Prefixed("data")
					}
					if !schemaNearField(gps, "data."+path) {
						t.Errorf("%s: %s = %+q: Go does not refuse it there: %s", typ, path, val, problemsOrAccepted(gps))
					}
					if text && !schemaHasProblem(gps, domain.CodeForbiddenCharacter, "data."+path) {
						t.Errorf("%s: %s = %+q: want forbidden_character, got %s", typ, path, val, problemsOrAccepted(gps))
					}
					if sps := v.Validate(typ, data); len(sps) == 0 {
						t.Errorf("%s: %s = %+q: the schema accepts it", typ, path, val)
					}
					for _, p := range gps {
						if strings.ContainsRune(p.Message, c) {
							t.Errorf("%s: %s: the problem message echoes %U: %q", typ, path, c, p.Message)
						}
					}
				}
			}
		}
	}
	if fields < 30 {
		t.Fatalf("only %d string fields found in the schemas; the walk is broken", fields)
	}
}

func schemaPropAt(root *schemaShape, path string) *schemaShape {
	n := root
	for _, k := range strings.Split(path, ".") {
		n = n.Properties[k]
	}
	return n
}

// TestEveryFreeTextFieldCarriesTextPattern: a string property without an
// enum or a format either carries the text rule or a pattern of its own
// that already refuses every hostile character (the test above proves the
// latter); the ones with a maxLength and no other rule must carry
// TextPattern itself.
func TestEveryFreeTextFieldCarriesTextPattern(t *testing.T) {
	t.Parallel()
	for _, typ := range domain.EventTypes() {
		root := loadSchemaShape(t, typ)
		for _, path := range stringPaths(root, "") {
			p := schemaPropAt(root, path)
			if p.Enum == nil && p.MaxLength != nil && p.Pattern == "" {
				t.Errorf("%s: %s: free text without the text pattern %q", typ, path, domain.TextPattern)
			}
		}
	}
}

// TestSourceRefusesHostileText: the CloudEvents source, through the
// structured parser and Validate, refuses every hostile character and
// anything that is not a URI-reference.
func TestSourceRefusesHostileText(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ev := func(source string) []byte {
		b, _ := json.Marshal(map[string]any{
			"specversion": "1.0", "id": "0190a5b2-4c5e-7b1a-9c3d-00000000e001", "type": domain.TypeUserActive,
			"source": source, "data": json.RawMessage(schemaValidData[domain.TypeUserActive]),
		})
		return b
	}
	for _, c := range hostileRunes {
		for _, s := range hostileVariants("mailplane/cli", c) {
			_, ps := domain.ParseStructured(ev(s), now, nil)
			if !schemaHasProblem(ps, domain.CodeForbiddenCharacter, "source") {
				t.Errorf("source %+q: want forbidden_character, got %s", s, problemsOrAccepted(ps))
			}
		}
	}
	// Invalid UTF-8 can only arrive in a header (JSON reads it as U+FFFD).
	e := domain.Event{ID: "0190a5b2-4c5e-7b1a-9c3d-00000000e001", Type: domain.TypeUserActive, Source: "mailplane/\xff",
		Time: now, Data: &domain.UserActive{UserID: sampleUserID, Source: domain.ActivityLogin}}
	if ps := e.Validate(); !schemaHasProblem(ps, domain.CodeForbiddenCharacter, "source") {
		t.Errorf("source with invalid UTF-8: got %s", problemsOrAccepted(ps))
	}
	for s, ok := range map[string]bool{
		"mailplane/cli": true, "readme": true, "urn:mailplane:billing": true, "https://example.com/a?b=c#d": true,
		"/relative/path": true, "a%20b": true, "mailplane/sync/host-1-42-abc": true, "#frag": true,
		"with space": false, "a%2": false, "a%zz": false, "1a:b": false, "a#b#c": false, "é": false,
		"a<b>": false, `a"b`: false, "a\\b": false, "a{b}": false, "a|b": false, "a^b": false, "`": false,
	} {
		_, ps := domain.ParseStructured(ev(s), now, nil)
		if got := len(ps) == 0; got != ok {
			t.Errorf("source %q: accepted %v, want %v (%s)", s, got, ok, problemsOrAccepted(ps))
		}
	}
}
