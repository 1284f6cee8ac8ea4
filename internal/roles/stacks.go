package roles

import (
	"bytes"
	"runtime/pprof"
	"strings"
)

// maxStacks caps what goroutineStacks returns: a log line, not a dump.
const maxStacks = 8 << 10

// goroutineStacks returns the stacks of the goroutines that run code of
// pkg (a package path such as "internal/outbox."), at most maxStacks
// bytes: what a role that does not stop in time is blocked in.
func goroutineStacks(pkg string) string {
	var all bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&all, 2)
	var out strings.Builder
	for g := range strings.SplitSeq(all.String(), "\n\n") {
		if !strings.Contains(g, pkg) {
			continue
		}
		if out.Len()+len(g) > maxStacks {
			out.WriteString("[more goroutines left out]\n")
			break
		}
		out.WriteString(g)
		out.WriteString("\n\n")
	}
	return out.String()
}
