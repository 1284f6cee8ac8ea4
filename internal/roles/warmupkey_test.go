package roles_test

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/internal/mailplanetest"
)

// TestSyncRefusesToStartWithoutWarmupKey: `mailplane sync` without a warmup
// key exits non-zero at once, saying what to set, before it connects to
// anything; with --insecure-unsigned-warmup it goes on (here to a database
// that is not there) after logging loudly that it runs insecurely.
func TestSyncRefusesToStartWithoutWarmupKey(t *testing.T) {
	t.Parallel()
	bin := mailplanetest.Build(t)
	run := func(env []string, args ...string) (string, int) {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"sync", "--brokers", "127.0.0.1:1", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--ops-http", ""}, args...)...)
		cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return errb.String(), code
	}

	for name, env := range map[string][]string{"unset": nil, "empty": {"MAILPLANE_WARMUP_KEY="}} {
		stderr, code := run(env)
		if code == 0 || !strings.Contains(stderr, "no warmup key: set MAILPLANE_WARMUP_KEY") || !strings.Contains(stderr, "--insecure-unsigned-warmup") {
			t.Errorf("key %s: exit %d, stderr:\n%s", name, code, stderr)
		}
		if strings.Contains(stderr, "database") || strings.Contains(stderr, "127.0.0.1:1") {
			t.Errorf("key %s: it went on to connect:\n%s", name, stderr)
		}
	}

	for name, c := range map[string]struct {
		env  []string
		args []string
	}{
		"flag": {args: []string{"--insecure-unsigned-warmup"}},
		"env":  {env: []string{"MAILPLANE_INSECURE_UNSIGNED_WARMUP=true"}},
	} {
		stderr, code := run(c.env, c.args...)
		if code == 0 || strings.Contains(stderr, "no warmup key") || !strings.Contains(stderr, "INSECURE: --insecure-unsigned-warmup") {
			t.Errorf("insecure by %s: exit %d, stderr:\n%s", name, code, stderr)
		}
	}

	// With a key, no complaint about it (and no insecure warning).
	stderr, _ := run([]string{"MAILPLANE_WARMUP_KEY=a-real-secret-from-the-secret-store"})
	if strings.Contains(stderr, "warmup") {
		t.Errorf("with a key: stderr:\n%s", stderr)
	}
}
