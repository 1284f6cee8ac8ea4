package config

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"slices"
	"strconv"
	"testing"
)

// ownDefaults are the settings whose default no package holds: the
// command's own choices (addresses, dev mode's directory, log format),
// keywords (auto, imap), and the pool sizes internal/dbpools takes as
// given. Every other default is rendered from its package's value.
var ownDefaults = map[string]bool{
	"http": true, "ops-http": true, "data-dir": true, "log-level": true, "log-format": true, "source": true, "registry": true,
	"pg-serve-conns": true, "pg-runner-conns": true, "pg-work-conns": true, "kafka-tls": true, "insecure-unsigned-warmup": true,
	"sync-memory-limit": true, "sync-workers": true, "sync-runner": true, "dev-fleet": true,
}

// TestDefaultsDefinedOnce: a setting's default is written as a literal
// in the table only when no package holds it (ownDefaults); a new
// setting whose package has the default renders that package's value
// instead of copying it.
func TestDefaultsDefinedOnce(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "config.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	literal := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		c, ok := n.(*ast.CompositeLit)
		if !ok || len(c.Elts) != 4 {
			return true
		}
		if id, isIdent := c.Type.(*ast.Ident); !isIdent || id.Name != "Setting" {
			return true
		}
		flagLit, _ := c.Elts[0].(*ast.BasicLit)
		def, isLit := c.Elts[2].(*ast.BasicLit)
		if flagLit == nil || !isLit {
			return true
		}
		name, _ := strconv.Unquote(flagLit.Value)
		if v, _ := strconv.Unquote(def.Value); v != "" {
			literal[name] = true
		}
		return true
	})
	if len(literal) == 0 {
		t.Fatal("no Setting literals found in config.go")
	}
	for _, name := range slices.Sorted(maps.Keys(literal)) {
		if !ownDefaults[name] {
			t.Errorf("--%s: literal default; render the owning package's value (or, when no package holds it, add it to ownDefaults)", name)
		}
	}
	for name := range ownDefaults {
		if _, ok := settings[name]; !ok || !literal[name] {
			t.Errorf("ownDefaults names --%s, which is not a setting with a literal default", name)
		}
	}
}
