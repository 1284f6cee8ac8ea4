package roles

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/internal/mailplanetest"
)

// TestPruneHourly: the loop prunes once at start, logs what it dropped
// (with the attributes the pruner gives) or why it failed, and returns
// nil when its context ends.
func TestPruneHourly(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		n    int64
		err  error
		want string
	}{
		"rows":    {n: 3, want: `msg="pruned things" rows=3 below_offset=7`},
		"nothing": {n: 0, want: ""},
		"failure": {err: errors.New("boom"), want: `msg="pruning things failed; retrying in an hour" err=boom`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var out mailplanetest.Output
			log := slog.New(slog.NewTextHandler(&out, nil))
			ctx, cancel := context.WithCancel(context.Background())
			calls := make(chan struct{}, 1)
			run := pruneHourly("things", log, func(ctx context.Context) (int64, []any, error) {
				if _, ok := ctx.Deadline(); !ok {
					t.Error("a pruning run without a deadline")
				}
				calls <- struct{}{}
				return c.n, []any{"below_offset", 7}, c.err
			})
			done := make(chan error, 1)
			go func() { done <- run(ctx) }()
			select {
			case <-calls:
			case <-time.After(10 * time.Second):
				t.Fatal("no pruning at start")
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("returned %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("did not stop with its context")
			}
			got := out.String()
			if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
				t.Fatalf("logged %q, want %q", got, c.want)
			}
		})
	}
}
