package access_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
)

const (
	tokProduct = "mpt_product_4f3e2d1c0b0a99887766554433221100"
	tokBilling = "mpt_billing_00112233445566778899aabbccddeeff"
)

var fleet = []byte("0123456789abcdef0123456789abcdef-fleet")

func write(t *testing.T, path, content string, mtime time.Time) {
	t.Helper()
	// As operators are told to: a new file renamed over the old one, so a
	// reload never reads it half-written. Explicit mtimes: two writes
	// within the file system's timestamp granularity must still differ.
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tmp, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	good := "# callers\n\n" +
		access.Line("product", tokProduct, []string{"publish:public"}, "/product-api") + "  # the product\n" +
		access.Line("billing-ops", tokBilling, []string{"ops", "publish:org.plan_changed"}, "/billing") + "\n"
	callers, _, err := access.Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(callers) != 2 || callers[0].Name != "product" || callers[1].Source != "/billing" ||
		strings.Join(callers[1].Scopes, ",") != "ops,publish:org.plan_changed" {
		t.Fatalf("%+v", callers)
	}
	h := access.HashToken("x")
	for name, bad := range map[string]string{
		"three fields":            "a " + h + " ops\n",
		"bad name":                "A! " + h + " ops /a\n",
		"short hash":              "a abcd ops /a\n",
		"unknown scope":           "a " + h + " publish:everything /a\n",
		"wildcard":                "a " + h + " * /a\n",
		"full type in scope":      "a " + h + " publish:mailplane.mailbox.added.v1 /a\n",
		"plan without ops":        "a " + h + " publish:org.plan_changed /a\n",
		"control char in source":  "a " + h + " ops /a\x01b\n",
		"duplicate name":          "a " + h + " ops /a\na " + access.HashToken("y") + " ops /a\n",
		"duplicate token":         "a " + h + " ops /a\nb " + h + " ops /a\n",
		"empty scope in the list": "a " + h + " ops, /a\n",
	} {
		if _, _, err := access.Parse([]byte(bad)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	a, err := access.FromBytes([]byte(access.Line("product", tokProduct, []string{"publish:public"}, "/p")+"\n"),
		access.WithFleetSecret(fleet))
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := a.Authenticate(tokProduct); !ok || c.Name != "product" || c.WorkerID != "" {
		t.Fatalf("product: %+v %v", c, ok)
	}
	const wid = "0190f3c4-5d6e-7f80-9a1b-2c3d4e5f6a7b"
	if c, ok := a.Authenticate(access.WorkerToken(fleet, wid)); !ok || c.WorkerID != wid || c.Name != access.WorkerCallerName || len(c.Scopes) != 0 {
		t.Fatalf("worker: %+v %v", c, ok)
	}
	good := access.WorkerToken(fleet, wid)
	for name, tok := range map[string]string{
		"unknown":          "mpt_nobody",
		"hash as token":    access.HashToken(tokProduct),
		"forged mac":       good[:len(good)-2] + "AA",
		"other fleet":      access.WorkerToken([]byte("another-secret-another-secret-0123"), wid),
		"not a uuid":       access.WorkerToken(fleet, "worker-1"),
		"upper-case id":    access.WorkerToken(fleet, strings.ToUpper(wid)),
		"mac padded":       good + "=",
		"mac missing":      "mpw1." + wid,
		"mac of nothing":   "mpw1." + wid + ".",
		"another id, mine": "mpw1.0190f3c4-5d6e-7f80-9a1b-2c3d4e5f6a7c" + good[len("mpw1.")+len(wid):],
	} {
		if c, ok := a.Authenticate(tok); ok || c != nil {
			t.Errorf("%s: authenticated as %+v", name, c)
		}
	}
	// Without a fleet secret, no worker credential is good.
	b, err := access.FromBytes(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.Authenticate(good); ok {
		t.Error("worker credential accepted without a fleet secret")
	}
	if _, err := access.FromBytes(nil, access.WithFleetSecret([]byte("short"))); err == nil {
		t.Error("a short fleet secret was accepted")
	}
}

// TestReloadWithoutRestart: a caller added to the file is accepted and a
// revoked one refused, without a new Authenticator; a file without any
// caller line (truncated) keeps the previous callers in force and is
// counted.
func TestReloadWithoutRestart(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tokens")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	write(t, path, access.Line("product", tokProduct, []string{"publish:public"}, "/p")+"\n", t0)
	reg := prometheus.NewRegistry()
	a, err := access.New(path, access.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Watch(ctx, 10*time.Millisecond)
	if _, ok := a.Authenticate(tokBilling); ok {
		t.Fatal("billing known before it was added")
	}

	// Add.
	write(t, path, access.Line("product", tokProduct, []string{"publish:public"}, "/p")+"\n"+
		access.Line("billing", tokBilling, []string{"ops", "publish:org.plan_changed"}, "/billing")+"\n", t0.Add(time.Second))
	waitFor(t, "billing accepted", func() bool { _, ok := a.Authenticate(tokBilling); return ok })

	// A file with no caller line: both stay in force; the failure is
	// counted and shown.
	write(t, path, "# being rewritten\n", t0.Add(2*time.Second))
	waitFor(t, "the failed reload counted", func() bool {
		return reloads(t, reg, "error") == 1
	})
	for _, tok := range []string{tokProduct, tokBilling} {
		if _, ok := a.Authenticate(tok); !ok {
			t.Fatal("a file without callers dropped a caller")
		}
	}
	if got := gauge(t, reg, "mailplane_access_tokens_file_invalid"); got != 1 {
		t.Errorf("mailplane_access_tokens_file_invalid = %v after a failed reload", got)
	}

	// Revoke the product.
	write(t, path, access.Line("billing", tokBilling, []string{"ops", "publish:org.plan_changed"}, "/billing")+"\n", t0.Add(3*time.Second))
	waitFor(t, "product refused", func() bool { _, ok := a.Authenticate(tokProduct); return !ok })
	if _, ok := a.Authenticate(tokBilling); !ok {
		t.Fatal("billing lost")
	}
	if got := gauge(t, reg, "mailplane_access_tokens_file_invalid"); got != 0 {
		t.Errorf("mailplane_access_tokens_file_invalid = %v after a good file", got)
	}
}

// TestReloadRevokesBesideATypo: an edit that revokes a token and holds a
// typo is not refused whole. The revoked caller (its line deleted) is
// refused, and so is the caller whose line was narrowed with a typo; the
// untouched callers keep working; the caller the edit adds, on a valid
// line, waits for a file without errors. The typo's line is reported, the
// reload counted as partial and the file shown invalid until it is fixed.
func TestReloadRevokesBesideATypo(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tokens")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const (
		tokKeep    = "mpt_keep_0f1e2d3c4b5a69788796a5b4c3d2e1f0"
		tokAdded   = "mpt_added_1a2b3c4d5e6f708192a3b4c5d6e7f809"
		tokRotated = "mpt_rotated_99aa88bb77cc66dd55ee44ff3300"
	)
	product := access.Line("product", tokProduct, []string{"publish:public"}, "/p")
	billing := access.Line("billing", tokBilling, []string{"ops", "publish:org.plan_changed"}, "/billing")
	keep := access.Line("keep", tokKeep, []string{"fleet:read"}, "/keep")
	write(t, path, product+"\n"+billing+"\n"+keep+"\n", t0)
	reg := prometheus.NewRegistry()
	var logs strings.Builder
	var mu sync.Mutex
	a, err := access.New(path, access.WithRegisterer(reg),
		access.WithLogger(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Watch(ctx, 10*time.Millisecond)

	// The edit: product's line deleted (revoked); billing narrowed to
	// publish:org.plan_changed, which is invalid without ops (the typo, on
	// line 1); keep untouched; a new caller added on a valid line.
	write(t, path, access.Line("billing", tokBilling, []string{"publish:org.plan_changed"}, "/billing")+"\n"+
		keep+"\n"+access.Line("added", tokAdded, []string{"publish:public"}, "/added")+"\n", t0.Add(time.Second))
	waitFor(t, "the partial reload counted", func() bool { return reloads(t, reg, "partial") == 1 })
	for name, tok := range map[string]string{"revoked product": tokProduct, "billing, narrowed with a typo": tokBilling, "added beside a typo": tokAdded} {
		if c, ok := a.Authenticate(tok); ok {
			t.Errorf("%s: authenticated as %+v", name, c)
		}
	}
	if c, ok := a.Authenticate(tokKeep); !ok || c.Name != "keep" || c.Source != "/keep" {
		t.Fatalf("the untouched caller: %+v %v", c, ok)
	}
	if got := gauge(t, reg, "mailplane_access_tokens_file_invalid"); got != 1 {
		t.Errorf("mailplane_access_tokens_file_invalid = %v", got)
	}
	if got := gauge(t, reg, "mailplane_access_callers"); got != 1 {
		t.Errorf("mailplane_access_callers = %v, want 1", got)
	}
	mu.Lock()
	logged := logs.String()
	mu.Unlock()
	if !strings.Contains(logged, "line 1: caller billing:") || strings.Contains(logged, tokBilling) {
		t.Errorf("the typo is not reported by its line (or a token is logged): %s", logged)
	}

	// Another edit with an error can only keep or take away: a token
	// rotated (keep's line with another hash) beside a typo is refused,
	// old and new.
	write(t, path, access.Line("keep", tokRotated, []string{"fleet:read"}, "/keep")+"\nnot a line\n", t0.Add(2*time.Second))
	waitFor(t, "the second partial reload counted", func() bool { return reloads(t, reg, "partial") == 2 })
	for _, tok := range []string{tokKeep, tokRotated} {
		if _, ok := a.Authenticate(tok); ok {
			t.Errorf("token %s... authenticated beside a typo", tok[:8])
		}
	}

	// Fixed: the file applies whole.
	write(t, path, billing+"\n"+keep+"\n"+access.Line("added", tokAdded, []string{"publish:public"}, "/added")+"\n", t0.Add(3*time.Second))
	waitFor(t, "the added caller accepted", func() bool { _, ok := a.Authenticate(tokAdded); return ok })
	for _, tok := range []string{tokBilling, tokKeep} {
		if _, ok := a.Authenticate(tok); !ok {
			t.Errorf("token %s... refused after the fix", tok[:8])
		}
	}
	if _, ok := a.Authenticate(tokProduct); ok {
		t.Error("the revoked product came back")
	}
	if got := gauge(t, reg, "mailplane_access_tokens_file_invalid"); got != 0 {
		t.Errorf("mailplane_access_tokens_file_invalid = %v after the fix", got)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// gauge reads the unlabelled gauge name from reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// TestReloadOnSIGHUP: SIGHUP rereads the file even when its mtime and size
// did not change (an editor that restores them).
func TestReloadOnSIGHUP(t *testing.T) {
	// Not parallel: the signal goes to the whole test process. Catch it
	// here too, so that a signal sent before Watch listens does not end
	// the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	path := filepath.Join(t.TempDir(), "tokens")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tokA, tokB := "mpt_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "mpt_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	write(t, path, access.Line("a", tokA, []string{"ops"}, "/a")+"\n", t0)
	a, err := access.New(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Watch(ctx, time.Hour) // the poll never fires in this test
	// Same size, same mtime, another token.
	write(t, path, access.Line("a", tokB, []string{"ops"}, "/a")+"\n", t0)
	waitFor(t, "reload on SIGHUP", func() bool {
		_ = syscall.Kill(os.Getpid(), syscall.SIGHUP)
		_, ok := a.Authenticate(tokB)
		return ok
	})
	if _, ok := a.Authenticate(tokA); ok {
		t.Fatal("the old token still works")
	}
}

func TestNewRefusesABrokenFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tokens")
	write(t, path, "nope\n", time.Now())
	if _, err := access.New(path); err == nil {
		t.Fatal("a broken file was accepted at start")
	}
	write(t, path, "# nobody\n", time.Now())
	if _, err := access.New(path); err == nil {
		t.Fatal("a file without callers was accepted")
	}
	if _, err := access.New(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("a missing file was accepted at start")
	}
}

func TestAllScopesAreValid(t *testing.T) {
	t.Parallel()
	if msg := domain.CheckScopes(domain.AllScopes()); msg != "" {
		t.Fatal(msg)
	}
}

// reloads reads mailplane_access_reloads_total{result} from reg.
func reloads(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "mailplane_access_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no reloads series %q", result)
	return 0
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
