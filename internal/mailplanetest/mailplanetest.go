// Package mailplanetest is the support mailplane's tests share: it builds
// the mailplane binary for the tests that run it as operators do (its
// commands, dev mode, exit codes), finds free ports, waits on conditions,
// reads metrics, collects output, gives components a logger into the
// test's output and renders test values as JSON. (The HTTP API's harness
// is internal/apitest.)
package mailplanetest

import (
	"net"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
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

// FreePort returns a loopback TCP port free at the time of the call, for
// a process under test to listen on.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// WaitFor polls cond every poll until it returns nil, or fails the test
// with cond's last error once d has passed.
func WaitFor(t testing.TB, d, poll time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		time.Sleep(poll)
	}
}
