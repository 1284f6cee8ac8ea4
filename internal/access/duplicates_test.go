package access_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/internal/access"
)

// TestReloadDuplicateLinesKeepNothing: a reload whose invalid line names
// a caller another, valid line also names (the same name, or the same
// token) keeps neither. An operator narrowing a caller by appending its
// new line instead of editing the old one (a duplicate name), or giving
// a leaked token to another line (a duplicate token), left the old,
// unchanged line in force with its old grant: the fail-safe reload kept
// what the valid lines repeated, and the duplicate was the invalid line.
func TestReloadDuplicateLinesKeepNothing(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tokens")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const (
		tokKeep  = "mpt_keep_0f1e2d3c4b5a69788796a5b4c3d2e1f0"
		tokOther = "mpt_other_77665544332211009988aabbccddeeff"
	)
	product := access.Line("product", tokProduct, []string{"ops", "publish:public"}, "/p")
	other := access.Line("other", tokOther, []string{"publish:public"}, "/o")
	keep := access.Line("keep", tokKeep, []string{"fleet:read"}, "/keep")
	write(t, path, product+"\n"+other+"\n"+keep+"\n", t0)
	reg := prometheus.NewRegistry()
	a, err := access.New(path, access.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Watch(ctx, 10*time.Millisecond)

	// product narrowed to publish:public on a line appended below its
	// old one (a second line for the name); product's token given to
	// other as well (a second line for the token).
	write(t, path, product+"\n"+other+"\n"+keep+"\n"+
		access.Line("product", tokProduct, []string{"publish:public"}, "/p")+"\n"+
		access.Line("other2", tokOther, []string{"fleet:read"}, "/o")+"\n", t0.Add(time.Second))
	waitFor(t, "the partial reload counted", func() bool { return reloads(t, reg, "partial") == 1 })
	for name, tok := range map[string]string{"product, named twice": tokProduct, "other, its token on two lines": tokOther} {
		if c, ok := a.Authenticate(tok); ok {
			t.Errorf("%s: still authenticated as %+v", name, c)
		}
	}
	if c, ok := a.Authenticate(tokKeep); !ok || c.Name != "keep" {
		t.Fatalf("the untouched caller: %+v %v", c, ok)
	}

	// A file appended to itself repeats every line exactly: nothing is
	// ambiguous, and every caller it names stays (the reload is still
	// partial, and reported).
	good := product + "\n" + other + "\n" + keep + "\n"
	write(t, path, good, t0.Add(2*time.Second))
	waitFor(t, "the good file loaded", func() bool { _, ok := a.Authenticate(tokProduct); return ok })
	write(t, path, good+good, t0.Add(3*time.Second))
	waitFor(t, "the doubled file's partial reload counted", func() bool { return reloads(t, reg, "partial") == 2 })
	for _, tok := range []string{tokProduct, tokOther, tokKeep} {
		if _, ok := a.Authenticate(tok); !ok {
			t.Errorf("token %s... refused after the file was appended to itself", tok[:8])
		}
	}

	// At start, such a file is refused whole, as any file with an error.
	if _, err := access.New(path); err == nil {
		t.Fatal("a file naming a caller twice was accepted at start")
	}
}
