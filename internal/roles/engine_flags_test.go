package roles

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/placement"
)

// TestPlacementWorkerRetentionFlag: the flag's default is the decider's
// default retention, a value given reaches the decider's configuration,
// and a retention under a minute or over ten years is refused.
func TestPlacementWorkerRetentionFlag(t *testing.T) {
	parse := func(args ...string) (placement.Config, error) {
		fs := flag.NewFlagSet("engine", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		read := placementFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return read()
	}
	t.Setenv(config.WorkerRetention.Env, "")
	pc, err := parse()
	if err != nil || pc.WorkerRetention != placement.DefaultWorkerRetention {
		t.Fatalf("default: %+v %v, want %s", pc, err, placement.DefaultWorkerRetention)
	}
	pc, err = parse("--placement-worker-retention", "36h")
	if err != nil || pc.WorkerRetention != 36*time.Hour {
		t.Fatalf("36h: %+v %v", pc, err)
	}
	for _, bad := range []string{"0s", "-1h", "59s", "100000h"} {
		if _, err := parse("--placement-worker-retention", bad); err == nil {
			t.Errorf("--placement-worker-retention %s accepted", bad)
		}
	}
}
