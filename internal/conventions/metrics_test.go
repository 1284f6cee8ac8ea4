package conventions_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"
)

// TestMetricsThroughPromreg: collectors are registered through
// internal/promreg (promreg.Register, promreg.MustRegister), so that two
// components on one registry share their series instead of panicking
// the process. The exceptions: the Go and process collectors of a new
// registry (internal/roles/roles.go), and promreg.Lenient only for
// collectors registered by a library (kprom, in internal/kafka).
func TestMetricsThroughPromreg(t *testing.T) {
	t.Parallel()
	fset, files := sources(t)
	for path, f := range files {
		if strings.HasPrefix(path, "internal/promreg/") {
			continue
		}
		for _, p := range unsharedRegistrations(fset, path, f) {
			t.Errorf("%s: %s; register through promreg.MustRegister(reg, c) or promreg.Register", path, p)
		}
	}
}

// TestMetricsThroughPromregSeesRegistrations: the check finds a direct
// registration and leaves promreg's and other packages' Register alone.
func TestMetricsThroughPromregSeesRegistrations(t *testing.T) {
	t.Parallel()
	found := func(path, src string) []string {
		t.Helper()
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "x.go", "package x\n"+src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		return unsharedRegistrations(fset, path, f)
	}
	for _, src := range []string{
		`func f() { reg.MustRegister(m.a, m.b) }`,
		`func f() { if err := r.reg.Register(c); err != nil {} }`,
		`import "github.com/prometheus/client_golang/prometheus"; func f() { prometheus.MustRegister(c) }`,
		`import "github.com/mailplane/mailplane/internal/promreg"; func f() { x := promreg.Lenient(reg) }`,
		`func f() { reg.MustRegister(collectors.NewGoCollector(), m.a) }`,
	} {
		if len(found("internal/x/x.go", src)) == 0 {
			t.Errorf("not seen as a registration outside promreg: %s", src)
		}
	}
	for _, src := range []string{
		`import "github.com/mailplane/mailplane/internal/promreg"; func f() { m.a = promreg.MustRegister(reg, m.a) }`,
		`import "github.com/mailplane/mailplane/internal/query"; func f() { _ = query.Register(srv, r, log) }`,
	} {
		if d := found("internal/x/x.go", src); len(d) > 0 {
			t.Errorf("seen as a registration outside promreg (%v): %s", d, src)
		}
	}
	if d := found("internal/roles/roles.go", `func f() { reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(o)) }`); len(d) > 0 {
		t.Errorf("the Go and process collectors of roles.go refused: %v", d)
	}
}

// unsharedRegistrations returns, as "line N: what", each call in f that
// registers collectors other than through promreg: Register or
// MustRegister called on a value (a Registerer) or on package
// prometheus, and promreg.Lenient outside internal/kafka.
func unsharedRegistrations(fset *token.FileSet, path string, f *ast.File) []string {
	imports := map[string]string{} // name in the file → import path
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		name := p[strings.LastIndex(p, "/")+1:]
		if im.Name != nil {
			name = im.Name.Name
		}
		imports[name] = p
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		line := fset.Position(call.Pos()).Line
		pkg := ""
		if id, ok := sel.X.(*ast.Ident); ok {
			pkg = imports[id.Name]
		}
		switch {
		case pkg == "github.com/mailplane/mailplane/internal/promreg" && sel.Sel.Name == "Lenient" && !strings.HasPrefix(path, "internal/kafka/"):
			out = append(out, "line "+strconv.Itoa(line)+": promreg.Lenient outside internal/kafka (a second component's series would go unmeasured)")
		case sel.Sel.Name != "Register" && sel.Sel.Name != "MustRegister":
		case pkg != "" && pkg != "github.com/prometheus/client_golang/prometheus":
			// Another package's Register (query.Register(srv, …)).
		case path == "internal/roles/roles.go" && allRuntimeCollectors(call.Args):
			// A new registry's Go and process collectors: once per
			// registry, nothing to share.
		default:
			out = append(out, "line "+strconv.Itoa(line)+": "+sel.Sel.Name+" outside promreg")
		}
		return true
	})
	return out
}

// allRuntimeCollectors: every argument is collectors.NewGoCollector(…) or
// collectors.NewProcessCollector(…).
func allRuntimeCollectors(args []ast.Expr) bool {
	for _, a := range args {
		c, ok := a.(*ast.CallExpr)
		if !ok {
			return false
		}
		sel, ok := c.Fun.(*ast.SelectorExpr)
		if !ok || lastName(sel.X) != "collectors" || (sel.Sel.Name != "NewGoCollector" && sel.Sel.Name != "NewProcessCollector") {
			return false
		}
	}
	return len(args) > 0
}
