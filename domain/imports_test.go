package domain_test

import (
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// domainImports returns, per Go file under package domain's directory (its
// subpackages included, testdata excluded), the paths it imports; tests
// selects the _test.go files, or the others.
func domainImports(t *testing.T, tests bool) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != "." && (n == "testdata" || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") != tests {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, s := range f.Imports {
			p, err := strconv.Unquote(s.Path.Value)
			if err != nil {
				return err
			}
			out[path] = append(out[path], p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no Go file with imports found: the walk is broken")
	}
	return out
}

// standard reports whether path is a standard library package: one the Go
// toolchain finds in GOROOT.
func standard(t *testing.T, path string) bool {
	t.Helper()
	if path == "C" {
		return false // cgo is not the standard library either
	}
	p, err := build.Default.Import(path, ".", build.FindOnly)
	return err == nil && p.Goroot
}

// TestDomainImportsOnlyStandardLibrary: domain holds the rules and the
// record catalog every other package builds on, so it depends on nothing
// but the standard library (no module, not even mailplane's own packages).
func TestDomainImportsOnlyStandardLibrary(t *testing.T) {
	t.Parallel()
	for file, paths := range domainImports(t, false) {
		for _, p := range paths {
			if !standard(t, p) {
				t.Errorf("%s imports %q, which is not in the standard library", file, p)
			}
		}
	}
}

// TestDomainTestsImportNoInternal: domain's tests check domain on its own;
// a test that needs an internal package (a validator, a writer, the
// placement engine) belongs with that package, or domain's tests would
// again depend on the code built on domain.
func TestDomainTestsImportNoInternal(t *testing.T) {
	t.Parallel()
	for file, paths := range domainImports(t, true) {
		for _, p := range paths {
			if p == "github.com/mailplane/mailplane/internal" || strings.Contains(p, "/internal/") || strings.HasPrefix(p, "internal/") {
				t.Errorf("%s imports %q, an internal package", file, p)
			}
		}
	}
}

// TestImportCheckSeesNonStandard: the standard library test tells the
// standard library from a module path, so a mistake in it cannot pass
// everything.
func TestImportCheckSeesNonStandard(t *testing.T) {
	t.Parallel()
	for p, want := range map[string]bool{
		"encoding/json": true, "time": true, "go/build": true,
		"github.com/mailplane/mailplane/topics":            false,
		"github.com/mailplane/mailplane/internal/mailsync": false,
		"github.com/twmb/franz-go/pkg/kgo":                 false,
		"C":                                                false,
	} {
		if got := standard(t, p); got != want {
			t.Errorf("standard(%q) = %v, want %v", p, got, want)
		}
	}
}
