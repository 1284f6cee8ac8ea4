package conventions_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// maxFuncLines is the longest a function of production code may be.
const maxFuncLines = 99

// sources parses every non-test Go file of the module.
func sources(t *testing.T) (*token.FileSet, map[string]*ast.File) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "var") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		files[filepath.ToSlash(rel)] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 100 {
		t.Fatalf("read %d files from %s: not the module", len(files), root)
	}
	return fset, files
}

// TestFunctionsAreShort: no function of production code runs to 100 lines.
func TestFunctionsAreShort(t *testing.T) {
	t.Parallel()
	fset, files := sources(t)
	for path, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFuncLines {
				t.Errorf("%s: %s is %d lines; split it by what it does (at most %d)", path, fd.Name.Name, n, maxFuncLines)
			}
		}
	}
}

// TestOneKafkaKit: franz-go clients are built only in internal/kafka, so
// every client gets the same connection settings, metrics and logging.
func TestOneKafkaKit(t *testing.T) {
	t.Parallel()
	_, files := sources(t)
	for path, f := range files {
		if strings.HasPrefix(path, "internal/kafka/") {
			continue
		}
		kgo := ""
		for _, im := range f.Imports {
			if p, _ := strconv.Unquote(im.Path.Value); p == "github.com/twmb/franz-go/pkg/kgo" {
				kgo = "kgo"
				if im.Name != nil {
					kgo = im.Name.Name
				}
			}
		}
		if kgo == "" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == kgo && (sel.Sel.Name == "NewClient" || sel.Sel.Name == "NewGroupTransactSession") {
				t.Errorf("%s: %s.%s outside internal/kafka; build the client with the kit (kafka.NewClient and friends)", path, kgo, sel.Sel.Name)
			}
			return true
		})
	}
}

// TestPackageNames: packages are named for what they do.
func TestPackageNames(t *testing.T) {
	t.Parallel()
	_, files := sources(t)
	for path, f := range files {
		switch f.Name.Name {
		case "util", "utils", "common", "helpers", "misc", "shared":
			t.Errorf("%s: package %s says nothing of what it does", path, f.Name.Name)
		}
	}
}
