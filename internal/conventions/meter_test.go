package conventions_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"sort"
	"strings"
	"testing"
)

// meterByHand lists the files that still set or forget a consumer's lag
// positions themselves, waiting to meter through the consumer runtime
// (consume.Metered, consume.MeteredByEffect and Consumer.Position). The
// list only shrinks: a file that no longer does must leave it, and no
// file may join it.
var meterByHand = map[string]string{
	// Empty: every consumer is metered by the runtime.
}

// TestOneMeterOwner: a consumer's lag (the sla table's meter) is set and
// forgotten only by the consumer runtime, which knows which partitions
// the consumer owns and forgets them when they are revoked, lost or left;
// a consumer reports where its effect stands with Consumer.Position, or
// lets the runtime meter the fetch (consume.Metered).
func TestOneMeterOwner(t *testing.T) {
	t.Parallel()
	fset, files := sources(t)
	calling := map[string][]string{}
	for path, f := range files {
		if strings.HasPrefix(path, "internal/consume/") || strings.HasPrefix(path, "internal/sla/") {
			continue
		}
		if found := meterCalls(fset, f); len(found) > 0 {
			calling[path] = found
		}
	}
	var stale []string
	for path, owner := range meterByHand {
		if len(calling[path]) == 0 {
			stale = append(stale, fmt.Sprintf("%s no longer sets or forgets meter positions: take it off meterByHand (%s)", path, owner))
		}
	}
	sort.Strings(stale)
	for _, s := range stale {
		t.Error(s)
	}
	for path, found := range calling {
		if _, ok := meterByHand[path]; ok {
			continue
		}
		for _, c := range found {
			t.Errorf("%s: %s: a lag meter's positions are the runtime's; report with consume.MeteredByEffect and Consumer.Position (or consume.Metered)", path, c)
		}
	}
}

// TestOneMeterOwnerSeesCalls: the check of TestOneMeterOwner finds the
// shapes of meter calls the code base had, and leaves gauges and other
// setters alone.
func TestOneMeterOwnerSeesCalls(t *testing.T) {
	t.Parallel()
	found := func(src string) []string {
		t.Helper()
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "x.go", "package x\n"+src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		return meterCalls(fset, f)
	}
	for _, src := range []string{
		`func f() { w.lag.Set(w.kcfg.Topic(topics.MailboxState), p.id, sla.Position{Next: next}) }`,
		`func f() { s.p.meter.Set(pt.topic, pt.id, pt.position()) }`,
		`func f() { s.p.meter.Forget(topic, id) }`,
		`func f() { p.meter.ForgetAll() }`,
		`func f() { m.Set(t, 0, failed) }`,
	} {
		if len(found(src)) == 0 {
			t.Errorf("not seen as a meter call: %s", src)
		}
	}
	for _, src := range []string{
		`func f() { r.m.lag.Set(0) }`,
		`func f() { g.WithLabelValues("a").Set(1) }`,
		`func f() { h.Set("Content-Type", "text/plain") }`,
		`func f() { c.Position(topic, 0, pos) }`,
		`func f() { m.Applied(now, r.Timestamp) }`,
	} {
		if d := found(src); len(d) > 0 {
			t.Errorf("seen as a meter call (%v): %s", d, src)
		}
	}
}

// meterCalls returns, as "line N: what", each call in f shaped like a
// meter's: Set with three arguments (topic, partition, position),
// Forget with two (topic, partition), ForgetAll with none. Without type
// information the shape is the test; nothing else in the code base has
// these shapes.
func meterCalls(fset *token.FileSet, f *ast.File) []string {
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
		want, ok := map[string]int{"Set": 3, "Forget": 2, "ForgetAll": 0}[sel.Sel.Name]
		if ok && len(call.Args) == want {
			out = append(out, fmt.Sprintf("line %d: %s", fset.Position(call.Pos()).Line, sel.Sel.Name))
		}
		return true
	})
	return out
}
