package workerapi

import (
	"strconv"
	"testing"
)

// TestRememberedWorkersBounded: the set of remembered ids stays within
// its bound however many ids pass, and an id seen again and again (a live
// worker) is never the one forgotten.
func TestRememberedWorkersBounded(t *testing.T) {
	t.Parallel()
	s := newRecentSet(100)
	s.add("live")
	for i := range 10_000 {
		s.add("id-" + strconv.Itoa(i))
		if !s.touch("live") {
			t.Fatalf("the live worker was forgotten after %d others", i)
		}
		if s.len() > 100 {
			t.Fatalf("%d ids remembered, bound 100", s.len())
		}
	}
	if s.touch("id-0") {
		t.Errorf("an id not seen for 10,000 others is still remembered")
	}
	if !s.touch("id-9999") {
		t.Errorf("the last id is not remembered")
	}
}
