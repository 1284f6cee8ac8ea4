package roles_test

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/internal/mailplanetest"
)

// TestSyncMemoryLimit: `mailplane sync` sets the Go runtime's soft memory
// limit before anything else and logs it: a size from the setting as
// given; the default (auto) from the container's limit or the fallback;
// GOMEMLIMIT wins over both. A malformed or dangerously small setting
// stops it at once, naming the setting, before it connects to anything.
func TestSyncMemoryLimit(t *testing.T) {
	t.Parallel()
	bin := mailplanetest.Build(t)
	base := []string{"sync", "--brokers", "127.0.0.1:1", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--ops-http", "", "--insecure-unsigned-warmup"}

	for _, bad := range []string{"10MiB", "lots", "2GiB\x1b[2J"} {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		cmd := exec.CommandContext(ctx, bin, base...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "MAILPLANE_SYNC_MEMORY_LIMIT=" + bad}
		var errb bytes.Buffer
		cmd.Stderr = &errb
		err := cmd.Run()
		cancel()
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("%q: %v, want a non-zero exit; stderr:\n%s", bad, err, errb.String())
		}
		out := errb.String()
		if !strings.Contains(out, "MAILPLANE_SYNC_MEMORY_LIMIT: invalid memory limit") || strings.Contains(out, "127.0.0.1:1") || strings.ContainsRune(out, 0x1b) {
			t.Errorf("%q: stderr:\n%s", bad, out)
		}
	}

	for name, c := range map[string]struct {
		env  []string
		args []string
		want string
	}{
		"flag":       {args: []string{"--sync-memory-limit", "700MiB"}, want: "bytes=734003200 mib=700 source=setting"},
		"env":        {env: []string{"MAILPLANE_SYNC_MEMORY_LIMIT=1GiB"}, want: "bytes=1073741824 mib=1024 source=setting"},
		"GOMEMLIMIT": {env: []string{"GOMEMLIMIT=600MiB", "MAILPLANE_SYNC_MEMORY_LIMIT=1GiB"}, want: "bytes=629145600 mib=600 source=GOMEMLIMIT"},
		"off":        {env: []string{"MAILPLANE_SYNC_MEMORY_LIMIT=off"}, want: "memory limit: none\" source=off"},
		// This machine's container has no memory limit: the fallback.
		// (Where it has one, the line says source=cgroup.)
		"default": {want: "memory limit\""},
	} {
		line := firstLine(t, bin, append(base, c.args...), c.env, "memory limit")
		if !strings.Contains(line, c.want) {
			t.Errorf("%s: logged %q, want %q", name, line, c.want)
		}
	}
}

// firstLine runs bin until it logs a line containing want, returns that
// line and stops it.
func firstLine(t *testing.T, bin string, args, env []string, want string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(stderr)
	var seen []string
	for sc.Scan() {
		if strings.Contains(sc.Text(), want) {
			return sc.Text()
		}
		seen = append(seen, sc.Text())
	}
	t.Fatalf("no line with %q; stderr:\n%s", want, strings.Join(seen, "\n"))
	return ""
}
