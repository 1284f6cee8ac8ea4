package topics_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/domain/schemas/derived"
	"github.com/mailplane/mailplane/topics"
)

// uncataloged are the topics whose records have no type of their own: dead
// letters keep the original record's, and the dedupe changelog is private
// to the mailbox.state processor.
var uncataloged = []string{topics.DLQ, topics.MailboxStateDedupe}

// TestEveryTopicRecordTypeHasOneGoTypeAndOneSchema walks the topic catalog:
// every record type on every topic is on that topic only, has exactly one
// Go type in domain's catalog and exactly one schema (a domain event's in
// domain/schemas, a derived record's in domain/schemas/derived, annotated
// with this topic), and every type in domain's catalog is on a topic.
func TestEveryTopicRecordTypeHasOneGoTypeAndOneSchema(t *testing.T) {
	t.Parallel()
	topicOf := map[string]string{}
	goTypes := map[reflect.Type]string{}
	for _, spec := range topics.Catalog(topics.Config{}) {
		types := topics.RecordTypes(spec.Name)
		if len(types) == 0 {
			if !slices.Contains(uncataloged, spec.Name) {
				t.Errorf("topic %s has no record types", spec.Name)
			}
			continue
		}
		if slices.Contains(uncataloged, spec.Name) {
			t.Errorf("topic %s is listed as uncataloged but has record types %v", spec.Name, types)
		}
		for _, typ := range types {
			if other, ok := topicOf[typ]; ok {
				t.Errorf("%s is on two topics, %s and %s", typ, other, spec.Name)
			}
			topicOf[typ] = spec.Name
			d, ok := domain.NewRecord(typ)
			if !ok {
				t.Errorf("%s (on %s) has no Go type in domain", typ, spec.Name)
				continue
			}
			if d.EventType() != typ {
				t.Errorf("%s: its Go type %T says it is %s", typ, d, d.EventType())
			}
			rt := reflect.TypeOf(d)
			if other, ok := goTypes[rt]; ok {
				t.Errorf("%T is the Go type of both %s and %s", d, other, typ)
			}
			goTypes[rt] = typ
			checkOneSchema(t, spec.Name, typ)
		}
	}
	for _, typ := range domain.RecordTypes() {
		if _, ok := topicOf[typ]; !ok {
			t.Errorf("%s is in domain's catalog but on no topic", typ)
		}
	}
	for _, typ := range derived.Types() {
		if _, ok := topicOf[typ]; !ok {
			t.Errorf("derived schema %s has no record type on any topic", typ)
		}
	}
	names, err := fs.Glob(domain.SchemaFiles(), "*.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if typ := strings.TrimSuffix(n, ".json"); !slices.Contains(domain.EventTypes(), typ) {
			t.Errorf("domain schema %s has no domain event type", n)
		}
	}
	if len(topicOf) < 30 {
		t.Fatalf("only %d record types found on the topics; the walk is broken", len(topicOf))
	}
}

// checkOneSchema: typ has a schema in exactly one place, the right one for
// its kind, and a derived schema names the topic its records are on.
func checkOneSchema(t *testing.T, topic, typ string) {
	t.Helper()
	_, inDomain := domain.Schema(typ)
	b, inDerived := derived.Schema(typ)
	event := slices.Contains(domain.EventTypes(), typ)
	switch {
	case inDomain && inDerived:
		t.Errorf("%s has two schemas, in domain/schemas and in domain/schemas/derived", typ)
	case event && !inDomain:
		t.Errorf("domain event %s has no schema in domain/schemas", typ)
	case !event && !inDerived:
		t.Errorf("derived record %s has no schema in domain/schemas/derived", typ)
	case inDerived:
		var doc struct {
			Topic string `json:"x-mailplane-topic"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if doc.Topic != topic {
			t.Errorf("%s: its schema says topic %q, the catalog puts it on %s", typ, doc.Topic, topic)
		}
	}
}

// TestRecordTypesOwnedByDomain: the only Go types that are a record's data
// (that have an EventType method) are domain's, so a record type cannot
// grow a second definition in the package that writes it.
func TestRecordTypesOwnedByDomain(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..")
	found := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (n == "testdata" || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || fn.Name.Name != "EventType" {
				continue
			}
			found++
			if dir := filepath.ToSlash(filepath.Dir(path)); dir != "../domain" {
				t.Errorf("%s: %s declares a record type's EventType outside domain", path, recvName(fn))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 30 {
		t.Fatalf("only %d EventType methods found; the walk is broken", found)
	}
}

func recvName(fn *ast.FuncDecl) string {
	x := fn.Recv.List[0].Type
	if s, ok := x.(*ast.StarExpr); ok {
		x = s.X
	}
	if id, ok := x.(*ast.Ident); ok {
		return id.Name
	}
	return "a type"
}
