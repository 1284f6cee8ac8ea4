package conventions_test

import (
	"go/ast"
	"sort"
	"strings"
	"testing"
)

// pollExceptions may poll a franz-go client outside internal/consume for
// good: one-shot reads to a known end (internal/kafka/read.go, ReadToEnd
// and friends) and the test helpers of internal/kafkatest.
var pollExceptions = map[string]bool{
	"internal/kafka/read.go":          true,
	"internal/kafkatest/kafkatest.go": true,
}

// notYetOnConsume are consumers still polling by hand, waiting to move onto
// internal/consume (issue 24, point 1). Shrink it as each moves; never
// grow it: a new consumer is a handler and a declaration on the runtime.
var notYetOnConsume = map[string]bool{
	// Empty: the seven consumers run on internal/consume.
}

// TestOneConsumeRuntime: records are polled only by the consumer runtime
// (internal/consume), which owns polling, rebalances, shutdown and the
// policies every consumer shares; a poll loop written by hand elsewhere
// fails here. Entries of the allowlist that no longer poll fail too, so
// the list shrinks as consumers move.
func TestOneConsumeRuntime(t *testing.T) {
	t.Parallel()
	_, files := sources(t)
	polling := map[string]bool{}
	for path, f := range files {
		if strings.HasPrefix(path, "internal/consume/") {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && (sel.Sel.Name == "PollFetches" || sel.Sel.Name == "PollRecords") {
				polling[path] = true
			}
			return true
		})
	}
	var stale []string
	for path := range notYetOnConsume {
		if !polling[path] {
			stale = append(stale, path)
		}
	}
	sort.Strings(stale)
	for _, path := range stale {
		t.Errorf("%s no longer polls by hand: take it off notYetOnConsume", path)
	}
	for path := range polling {
		if !pollExceptions[path] && !notYetOnConsume[path] {
			t.Errorf("%s polls a Kafka client by hand; declare a consumer on internal/consume instead (a handler and a source)", path)
		}
	}
}
