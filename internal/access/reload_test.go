package access_test

import (
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mailplane/mailplane/internal/access"
)

// TestReloadHookSaysWhatChanged: each reload that changes the callers or
// fails is reported once, by caller name (never a token): added, removed,
// changed (another token or scopes), a file not loaded, a file with an
// invalid line. The load at start and a reload of an unchanged file are
// not reported.
func TestReloadHookSaysWhatChanged(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tokens")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	product := access.Line("product", tokProduct, []string{"publish:public"}, "/p") + "\n"
	billing := access.Line("billing", tokBilling, []string{"ops"}, "/billing") + "\n"
	write(t, path, product, t0)
	var mu sync.Mutex
	var got []access.Reload
	a, err := access.New(path, access.WithReloadHook(func(r access.Reload) { mu.Lock(); got = append(got, r); mu.Unlock() }))
	if err != nil {
		t.Fatal(err)
	}
	load := func(content string, at time.Time) {
		t.Helper()
		write(t, path, content, at)
		_, _ = a.Load()
	}
	_, _ = a.Load() // unchanged
	load(product+billing, t0.Add(time.Second))
	load(access.Line("product", tokProduct, []string{"publish:public", "fleet:read"}, "/p")+"\n", t0.Add(2*time.Second))
	load("# being rewritten\n", t0.Add(3*time.Second))
	load(product+"billing nonsense\n", t0.Add(4*time.Second))
	mu.Lock()
	defer mu.Unlock()
	want := []access.Reload{
		{Path: path, Added: []string{"billing"}},
		{Path: path, Removed: []string{"billing"}, Changed: []string{"product"}},
		{Path: path, Failed: true},
		// The line narrowed since is out until the file is fixed (Load).
		{Path: path, Removed: []string{"product"}, InvalidLines: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("%d reloads reported, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Path != w.Path || g.Failed != w.Failed || g.InvalidLines != w.InvalidLines ||
			!slices.Equal(g.Added, w.Added) || !slices.Equal(g.Removed, w.Removed) || !slices.Equal(g.Changed, w.Changed) {
			t.Errorf("reload %d: %+v, want %+v", i, g, w)
		}
		for _, s := range slices.Concat(g.Added, g.Removed, g.Changed) {
			if strings.Contains(s, tokProduct) || strings.Contains(s, tokBilling) {
				t.Errorf("reload %d names a token", i)
			}
		}
	}
}
