package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
)

// TestTokenCommand: the printed line, added to a tokens file, makes the
// printed token authenticate as the caller with its scopes and source;
// scopes the server would refuse are refused here already.
func TestTokenCommand(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := Token([]string{"--name", "reports", "--scopes", "publish:mailbox.warmup_observed", "--source", "/delivery-reports"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	tok, line := strings.TrimSpace(lines[1]), strings.TrimSpace(lines[len(lines)-1])
	if !strings.HasPrefix(tok, "mpt_") || strings.Contains(line, tok) {
		t.Fatalf("output:\n%s", out.String())
	}
	a, err := access.FromBytes([]byte(line + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	c, ok := a.Authenticate(tok)
	if !ok || c.Name != "reports" || c.Source != "/delivery-reports" ||
		c.PublishScopeMissing(domain.TypeWarmupObserved) != "" || c.PublishScopeMissing(domain.TypeMailboxHealthScored) == "" {
		t.Fatalf("caller %+v %v", c, ok)
	}
	for _, args := range [][]string{
		{"--name", "x", "--scopes", "publish:org.plan_changed", "--source", "/b"}, // without ops
		{"--name", "x", "--scopes", "*", "--source", "/b"},
		{"--name", "x", "--scopes", "publish:public", "--source", ""},
		{"--name", "", "--scopes", "publish:public", "--source", "/b"},
	} {
		if err := Token(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}

// TestWorkerTokenCommand prints the credential the API accepts for that
// worker id, from the environment's fleet secret or a dev data dir's.
func TestWorkerTokenCommand(t *testing.T) {
	t.Parallel()
	const id = "0190a5b2-4c5e-7b1a-9c3d-00000000d001"
	dir := t.TempDir()
	secret := "dev-fleet-secret-0123456789abcdef0123"
	if err := os.WriteFile(filepath.Join(dir, "worker-fleet.key"), []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Token([]string{"worker", "--worker-id", id, "--data-dir", dir, "--worker-fleet-secret", ""}, &out); err != nil {
		t.Fatal(err)
	}
	a, err := access.FromBytes(nil, access.WithFleetSecret([]byte(secret)))
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := a.Authenticate(strings.TrimSpace(out.String())); !ok || c.WorkerID != id {
		t.Fatalf("worker token %q: %+v %v", out.String(), c, ok)
	}
	if err := Token([]string{"worker", "--worker-id", "not-a-uuid", "--data-dir", dir}, &bytes.Buffer{}); err == nil {
		t.Error("a bad worker id was accepted")
	}
	if err := Token([]string{"worker", "--worker-id", id, "--data-dir", t.TempDir(), "--worker-fleet-secret", ""}, &bytes.Buffer{}); err == nil {
		t.Error("no secret, yet a token")
	}
}
