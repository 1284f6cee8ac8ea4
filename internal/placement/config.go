package placement

import (
	"time"

	"github.com/mailplane/mailplane/domain"
)

// This file is the decider's settings and their defaults.

// Config tunes the decider. Zero fields take their defaults.
type Config struct {
	// HeartbeatInterval is how often workers heartbeat (default 10 s).
	HeartbeatInterval time.Duration
	// LivenessWindow is how long a worker stays live after its last
	// heartbeat (default 3 × HeartbeatInterval).
	LivenessWindow time.Duration
	// BandDwell is how long a mailbox's scores must stay better than its band
	// before the band improves (default 1 h).
	BandDwell time.Duration
	// HealthMinSends: a worker sample with fewer sends (but some) leaves the
	// worker's health state unchanged (default 100).
	HealthMinSends int64
	// WorkerRetention: a dead worker last seen (as its death recorded)
	// longer ago than this is forgotten at the next tick (default 7 days; at least
	// LivenessWindow and a second, at most ten years).
	WorkerRetention time.Duration
	// MaxForgetPerTick bounds the workers one tick forgets, oldest first,
	// so that a burst of made-up ids expiring together is forgotten over
	// several ticks rather than in one huge transaction (default 5000).
	MaxForgetPerTick int
	// ComplaintPPM and HardBouncePPM are the rate thresholds, in parts per
	// million of sends, for watch, throttled, quarantined and blocked.
	ComplaintPPM  [4]int64
	HardBouncePPM [4]int64
	// LivenessHoldPermille is the share of live workers, in thousandths,
	// silent at once at or above which the engine holds liveness rather
	// than declare them dead (default 550, at most 1000; see the package
	// comment, Liveness).
	LivenessHoldPermille int64
	// LivenessHoldMinWorkers: with fewer live workers liveness is never
	// held, so a one- or two-worker fleet still fails over (default 3).
	LivenessHoldMinWorkers int
	// LivenessHoldMax is the longest a hold lasts: then liveness resumes
	// whatever the share, and the workers not heard during the hold die a
	// window later (default 10 minutes; negative: no bound).
	LivenessHoldMax time.Duration
	// TierDwell is how long a live worker's tier stays as it was last
	// changed: a heartbeat asking for another tier within it is heard, not
	// recorded (default 5 minutes; negative: no dwell).
	TierDwell time.Duration
}

// Defaults of the liveness hold and the tier dwell: the default policy's
// (domain.DefaultPlacementPolicy).
const (
	DefaultLivenessHoldPermille   = domain.DefaultLivenessHoldPermille
	DefaultLivenessHoldMinWorkers = domain.DefaultLivenessHoldMinWorkers
	DefaultLivenessHoldMax        = domain.DefaultLivenessHoldMax
	DefaultTierDwell              = domain.DefaultTierDwell
)

// DefaultWorkerRetention is how long a dead worker is remembered by default.
const DefaultWorkerRetention = domain.DefaultWorkerRetention

// defaultHeartbeatInterval is the workers' heartbeat interval: the default
// liveness window (domain.DefaultLivenessWindow) is three of them.
const defaultHeartbeatInterval = domain.DefaultLivenessWindow / 3

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{}.withDefaults()
}

func (c Config) withDefaults() Config {
	d := domain.DefaultPlacementPolicy()
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = defaultHeartbeatInterval
	}
	if c.LivenessWindow <= 0 {
		c.LivenessWindow = 3 * c.HeartbeatInterval
	}
	if c.BandDwell <= 0 {
		c.BandDwell = d.BandDwell
	}
	if c.HealthMinSends <= 0 {
		c.HealthMinSends = d.WorkerHealthMinSends
	}
	if c.WorkerRetention <= 0 {
		c.WorkerRetention = DefaultWorkerRetention
	}
	// Within what a worker_forgotten decision can record (whole seconds,
	// at most ten years), and never shorter than liveness.
	c.WorkerRetention = min(max(c.WorkerRetention, c.LivenessWindow, time.Second), domain.MaxWorkerRetentionSeconds*time.Second)
	if c.MaxForgetPerTick <= 0 {
		c.MaxForgetPerTick = d.MaxForgetPerTick
	}
	if c.ComplaintPPM == [4]int64{} {
		c.ComplaintPPM = d.ComplaintPPM
	}
	if c.HardBouncePPM == [4]int64{} {
		c.HardBouncePPM = d.HardBouncePPM
	}
	if c.LivenessHoldPermille <= 0 {
		c.LivenessHoldPermille = DefaultLivenessHoldPermille
	}
	c.LivenessHoldPermille = min(c.LivenessHoldPermille, 1000)
	if c.LivenessHoldMinWorkers <= 0 {
		c.LivenessHoldMinWorkers = DefaultLivenessHoldMinWorkers
	}
	c.LivenessHoldMinWorkers = min(c.LivenessHoldMinWorkers, domain.MaxLivenessWorkers)
	if c.LivenessHoldMax == 0 {
		c.LivenessHoldMax = DefaultLivenessHoldMax
	}
	if c.TierDwell == 0 {
		c.TierDwell = DefaultTierDwell
	}
	return c
}
