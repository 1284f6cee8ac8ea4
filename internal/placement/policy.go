package placement

import (
	"time"

	"github.com/mailplane/mailplane/domain"
)

// ConfigFromPolicy returns the decider's settings under a policy document's
// placement rules (domain.PlacementPolicy); the heartbeat interval, which is
// the workers' setting rather than a rule, keeps its default. A zero hold
// bound or tier dwell is none, which Config spells negative.
func ConfigFromPolicy(p domain.Policy) Config {
	r := p.PlacementRules
	return Config{
		LivenessWindow:         r.LivenessWindow,
		BandDwell:              r.BandDwell,
		HealthMinSends:         r.WorkerHealthMinSends,
		WorkerRetention:        r.WorkerRetention,
		MaxForgetPerTick:       r.MaxForgetPerTick,
		ComplaintPPM:           r.ComplaintPPM,
		HardBouncePPM:          r.HardBouncePPM,
		LivenessHoldPermille:   r.LivenessHoldPermille,
		LivenessHoldMinWorkers: r.LivenessHoldMinWorkers,
		LivenessHoldMax:        noneIfZero(r.LivenessHoldMax),
		TierDwell:              noneIfZero(r.TierDwell),
	}.withDefaults()
}

func noneIfZero(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
