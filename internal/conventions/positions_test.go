package conventions_test

import (
	"go/ast"
	"go/token"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// positionWrite matches a statement that writes projector positions, or
// names their table apart from a statement (a name put together with
// pgx.Identifier, as a swap does).
var positionWrite = regexp.MustCompile(`(?is)(\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM|TRUNCATE(\s+TABLE)?)\s+(\S+\.)?"?projector_offsets\b)|^projector_offsets$`)

// TestOneWriterOfPositions: projector positions (projector_offsets) are
// written only by internal/applyonce, the one owner of "apply each record
// once": the projectors and the rebuilds call it, so a rebuild replays
// through the transaction the live projector runs.
func TestOneWriterOfPositions(t *testing.T) {
	t.Parallel()
	_, files := sources(t)
	owner := 0
	for path, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil || !positionWrite.MatchString(s) {
				return true
			}
			if strings.HasPrefix(path, "internal/applyonce/") {
				owner++
				return true
			}
			t.Errorf("%s: writes projector_offsets (%q); positions are written by internal/applyonce only", path, firstLine(s))
			return true
		})
	}
	if owner == 0 {
		t.Error("internal/applyonce writes no projector_offsets: the test no longer sees the owner")
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
