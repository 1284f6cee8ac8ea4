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

// TestPlacementLivenessHoldAndTierDwellFlags: the defaults are the
// decider's, values given reach its configuration (0 turning the bound
// or the dwell off), and values out of range are refused.
func TestPlacementLivenessHoldAndTierDwellFlags(t *testing.T) {
	parse := func(args ...string) (placement.Config, error) {
		fs := flag.NewFlagSet("engine", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		read := placementFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return read()
	}
	for _, s := range []config.Setting{config.LivenessHoldShare, config.LivenessHoldMinWorkers, config.LivenessHoldMax, config.TierDwell} {
		t.Setenv(s.Env, "")
	}
	pc, err := parse()
	want := placement.DefaultConfig()
	if err != nil || pc.LivenessHoldPermille != want.LivenessHoldPermille || pc.LivenessHoldMinWorkers != want.LivenessHoldMinWorkers ||
		pc.LivenessHoldMax != want.LivenessHoldMax || pc.TierDwell != want.TierDwell {
		t.Fatalf("defaults: %+v %v, want the decider's %+v", pc, err, want)
	}
	pc, err = parse("--placement-liveness-hold-share", "0.8", "--placement-liveness-hold-min-workers", "10",
		"--placement-liveness-hold-max", "0", "--placement-tier-dwell", "0")
	if err != nil || pc.LivenessHoldPermille != 800 || pc.LivenessHoldMinWorkers != 10 || pc.LivenessHoldMax >= 0 || pc.TierDwell >= 0 {
		t.Fatalf("set: %+v %v", pc, err)
	}
	if got := placement.NewState(pc).Config(); got.LivenessHoldMax >= 0 || got.TierDwell >= 0 {
		t.Fatalf("0 became the decider's default: %+v", got)
	}
	for _, bad := range [][]string{
		{"--placement-liveness-hold-share", "0"}, {"--placement-liveness-hold-share", "1.5"}, {"--placement-liveness-hold-share", "NaN"},
		{"--placement-liveness-hold-min-workers", "0"}, {"--placement-liveness-hold-max", "30s"}, {"--placement-liveness-hold-max", "-1m"},
		{"--placement-tier-dwell", "-1s"}, {"--placement-tier-dwell", "48h"},
	} {
		if _, err := parse(bad...); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
