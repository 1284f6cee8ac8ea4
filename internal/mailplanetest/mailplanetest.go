// Package mailplanetest builds the mailplane binary for the tests that run
// it as operators do (its commands, dev mode, exit codes).
package mailplanetest

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Build builds cmd/mailplane into the test's temporary directory and
// returns the binary's path.
func Build(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("mailplanetest: no source location")
	}
	pkg := filepath.Join(filepath.Dir(file), "..", "..", "cmd", "mailplane")
	bin := filepath.Join(t.TempDir(), "mailplane")
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}
