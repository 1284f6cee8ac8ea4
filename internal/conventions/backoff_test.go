package conventions_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// handWrittenBackoff lists the files that still double their own retry
// waits, each owned by the engineer moving it onto internal/backoff. The
// list only shrinks: a file that no longer doubles must leave it (the test
// says so), and no file may join it.
var handWrittenBackoff = map[string]string{
	// Empty: every retrying loop waits through internal/backoff.
}

// waitName is what a duration doubled by hand is called: a backoff, a
// wait, a delay.
var waitName = regexp.MustCompile(`(?i)backoff|wait|delay|sleep|retry|pause|cooldown`)

// TestOneBackoff: only internal/backoff doubles a wait. Every loop that
// retries takes a backoff.Policy (floor, cap, jitter) instead of writing
// its own `backoff = min(2*backoff, cap)`, so that floors, caps and
// jitter are chosen in one place and read the same everywhere.
func TestOneBackoff(t *testing.T) {
	t.Parallel()
	fset, files := sources(t)
	for path, f := range files {
		if strings.HasPrefix(path, "internal/backoff/") {
			continue
		}
		found := doublings(fset, f)
		owner, allowed := handWrittenBackoff[path]
		switch {
		case allowed && len(found) == 0:
			t.Errorf("%s no longer doubles a wait by hand: take it off handWrittenBackoff (%s)", path, owner)
		case !allowed:
			for _, d := range found {
				t.Errorf("%s: %s doubles a wait by hand; wait through internal/backoff (backoff.New(backoff.Policy{Floor, Cap, Jitter}, nil).Next())", path, d)
			}
		}
	}
	for path := range handWrittenBackoff {
		if _, ok := files[path]; !ok {
			t.Errorf("handWrittenBackoff lists %s, which is gone: take it off", path)
		}
	}
}

// TestOneBackoffSeesDoubling: the check of TestOneBackoff finds the shapes
// of hand-written backoff the code base had, and leaves constants and
// sizes alone.
func TestOneBackoffSeesDoubling(t *testing.T) {
	t.Parallel()
	found := func(src string) []string {
		t.Helper()
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "x.go", "package x\n"+src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		return doublings(fset, f)
	}
	for _, src := range []string{
		`func f() { backoff = min(2*backoff, 30*time.Second) }`,
		`func f() { s.wait = min(s.wait*2, s.maxWait) }`,
		`func f() { for backoff := time.Second; ; backoff = min(2*backoff, 15*time.Second) {} }`,
		`func f() { d := min(p.cfg.backoff<<min(attempt-1, 6), 30*time.Second) }`,
		`func f() { d := min(250*time.Millisecond<<attempt, 5*time.Second) }`,
		`func f() { retryDelay *= 2 }`,
		`func (m *run) backoff(n int) time.Duration { d := m.min; for i := 1; i < n; i++ { d *= 2 }; return d }`,
		`func f() { w := time.Duration(math.Pow(2, float64(n))) * time.Second }`,
	} {
		if len(found(src)) == 0 {
			t.Errorf("not seen as hand-written backoff: %s", src)
		}
	}
	for _, src := range []string{
		`const timeout = 2 * time.Second`,
		`func f() { next = min(2*s.batch, growth*base) }`,
		`func f() { lease = max(lease, 2*r.poll, r.op+r.poll) }`,
		`const maxLine = 64 << 10`,
		`func f() { seen |= 1 << bit; n *= 2 }`,
		`func f() { margin = max(c.SessionTimeout/4, 2*c.HeartbeatInterval) }`,
	} {
		if d := found(src); len(d) > 0 {
			t.Errorf("seen as hand-written backoff (%v): %s", d, src)
		}
	}
}

// doublings returns, as "line N: what", each place f doubles a wait: x *=
// 2 or x <<= n, 2*x or x*2, or x<<n where x is named like a wait (or sits
// in a function named like one), a duration shifted left by a variable,
// and math.Pow(2, …).
func doublings(fset *token.FileSet, f *ast.File) []string {
	var out []string
	var inspect func(fn string) func(ast.Node) bool
	inspect = func(fn string) func(ast.Node) bool {
		waitFunc := waitName.MatchString(fn)
		named := func(e ast.Expr) bool { return waitFunc || waitName.MatchString(lastName(e)) }
		return func(n ast.Node) bool {
			var what string
			switch n := n.(type) {
			case *ast.FuncDecl:
				if n.Body != nil {
					ast.Inspect(n.Body, inspect(n.Name.Name))
				}
				return false
			case *ast.AssignStmt:
				if len(n.Lhs) == 1 && ((n.Tok == token.MUL_ASSIGN && isInt(n.Rhs[0], "2")) || n.Tok == token.SHL_ASSIGN) && named(n.Lhs[0]) {
					what = lastName(n.Lhs[0]) + " " + n.Tok.String() + " …"
				}
			case *ast.BinaryExpr:
				switch {
				case n.Op == token.MUL && isInt(n.X, "2") && named(n.Y) && !isTimeUnit(n.Y),
					n.Op == token.MUL && isInt(n.Y, "2") && named(n.X) && !isTimeUnit(n.X):
					what = "2×" + lastName(n.X) + lastName(n.Y)
				case n.Op == token.SHL && !isConst(n.Y) && (named(n.X) || mentionsTimeUnit(n.X)):
					what = "a duration shifted left"
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && lastName(sel.X) == "math" && sel.Sel.Name == "Pow" && len(n.Args) == 2 && isInt(n.Args[0], "2") {
					what = "math.Pow(2, …)"
				}
			}
			if what != "" {
				out = append(out, fmt.Sprintf("line %d: %s", fset.Position(n.Pos()).Line, what))
			}
			return true
		}
	}
	ast.Inspect(f, inspect(""))
	return out
}

// lastName is the name an expression ends in: x, a.b.x, (x), x[i].
func lastName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.ParenExpr:
		return lastName(e.X)
	case *ast.IndexExpr:
		return lastName(e.X)
	}
	return ""
}

func isInt(e ast.Expr, v string) bool {
	l, ok := e.(*ast.BasicLit)
	return ok && l.Kind == token.INT && l.Value == v
}

func isConst(e ast.Expr) bool {
	_, ok := e.(*ast.BasicLit)
	return ok
}

// isTimeUnit: time.Second and the like, a constant.
func isTimeUnit(e ast.Expr) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "time" && slices.Contains([]string{"Nanosecond", "Microsecond", "Millisecond", "Second", "Minute", "Hour"}, sel.Sel.Name)
}

func mentionsTimeUnit(e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if x, ok := n.(ast.Expr); ok && isTimeUnit(x) {
			found = true
		}
		return !found
	})
	return found
}
