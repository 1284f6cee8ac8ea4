package roles

import (
	"strings"
	"testing"
)

// parkedForStacks blocks until release is closed: a goroutine whose stack
// goroutineStacks must find.
func parkedForStacks(parked chan<- struct{}, release <-chan struct{}) {
	close(parked)
	<-release
}

// The stacks logged for a relay that did not stop are those of the
// goroutines running its package, and only those.
func TestGoroutineStacksOfAPackage(t *testing.T) {
	t.Parallel()
	parked, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	go parkedForStacks(parked, release)
	<-parked
	got := goroutineStacks("roles.parkedForStacks")
	if !strings.Contains(got, "roles.parkedForStacks") || !strings.Contains(got, "chan receive") {
		t.Fatalf("the parked goroutine's stack is missing:\n%s", got)
	}
	if strings.Contains(got, "testing.tRunner") {
		t.Errorf("stacks of other goroutines (the test's own) are included:\n%s", got)
	}
	if n := strings.Count("\n"+got, "\ngoroutine "); n != 1 {
		t.Errorf("%d goroutines, want 1:\n%s", n, got)
	}
	if got := goroutineStacks("no/such/package."); got != "" {
		t.Errorf("stacks for a package nothing runs: %q", got)
	}
}
