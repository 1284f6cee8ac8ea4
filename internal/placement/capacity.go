package placement

import (
	"time"

	"github.com/mailplane/mailplane/domain"
)

// This file is what a mailbox weighs and what a worker carries: weights
// and their classes, effective capacity (base × health × age) and the
// worker health a sample gives (see the package comment, Weight, Capacity
// and Worker health).

// placementClassWeights are the weight classes the shared-worker index keeps
// a heap for: a worker is in class c's heap when its headroom is at least
// placementClassWeights[c]. Every mailbox weight is one of them.
var placementClassWeights = domain.PlacementWeights()

const placementClasses = len(placementClassWeights)

func placementClassOf(weight int64) int {
	for c, w := range placementClassWeights {
		if weight <= w {
			return c
		}
	}
	return placementClasses - 1
}

// Weight is a mailbox's weight in thousandths. OAuth providers take
// precedence over warmup (see the package comment).
func Weight(p domain.Provider, warmup bool) int64 {
	switch {
	case p.IsOAuth():
		return domain.PlacementWeightOAuth
	case warmup:
		return domain.PlacementWeightWarmup
	default:
		return domain.PlacementWeightFull
	}
}

// BaseCapacity is an egress kind's base capacity, in mailboxes of
// weight 1.
func BaseCapacity(e domain.Egress) int64 {
	switch e {
	case domain.EgressOAuthAPI:
		return 400
	case domain.EgressWarmupOnly:
		return 25
	default:
		return 16
	}
}

// HealthPermille is the capacity multiplier of a worker health
// state, in thousandths.
func HealthPermille(h domain.HealthState) int64 {
	switch h {
	case domain.HealthWatch:
		return 750
	case domain.HealthThrottled:
		return 500
	case domain.HealthQuarantined:
		return 250
	case domain.HealthBlocked:
		return 0
	default:
		return 1000
	}
}

// Age ramp: a new worker starts at AgeRampStartPermille and reaches
// full capacity after AgeRampDays whole days.
const (
	AgeRampDays          = 14
	AgeRampStartPermille = 250
)

// AgePermille is the age multiplier, in thousandths, of a worker
// first seen age ago.
func AgePermille(age time.Duration) int64 {
	days := int64(0)
	if age > 0 {
		days = int64(age / (24 * time.Hour))
	}
	if days > AgeRampDays {
		days = AgeRampDays
	}
	return AgeRampStartPermille + (1000-AgeRampStartPermille)*days/AgeRampDays
}

// Capacity is a worker's effective capacity in mailboxes of weight
// 1: floor(base × health × age), at least 1.
func Capacity(e domain.Egress, h domain.HealthState, firstSeen, at time.Time) int64 {
	c := BaseCapacity(e) * HealthPermille(h) * AgePermille(at.Sub(firstSeen)) / 1_000_000
	if c < 1 {
		c = 1
	}
	return c
}

// TakesNew reports whether a worker in health state h takes new
// mailboxes.
func TakesNew(h domain.HealthState) bool {
	return h == domain.HealthHealthy || h == domain.HealthWatch
}

var placementHealthByRank = [...]domain.HealthState{domain.HealthHealthy, domain.HealthWatch, domain.HealthThrottled, domain.HealthQuarantined, domain.HealthBlocked}

// WorkerHealth returns a worker's health state after a sample, given its
// state before.
func (c Config) WorkerHealth(prev domain.HealthState, s *domain.WorkerHealthSampled) domain.HealthState {
	c = c.withDefaults()
	if s.Sends <= 0 {
		return domain.HealthHealthy
	}
	if s.Sends < c.HealthMinSends {
		return prev
	}
	for i := 3; i >= 0; i-- {
		if s.Complaints*1_000_000 >= s.Sends*c.ComplaintPPM[i] || s.HardBounces*1_000_000 >= s.Sends*c.HardBouncePPM[i] {
			return placementHealthByRank[i+1]
		}
	}
	return domain.HealthHealthy
}
