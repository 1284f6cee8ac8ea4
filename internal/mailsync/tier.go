package mailsync

import (
	"sync"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// The tier rules live in domain (EvaluateSyncTiers); these names keep the
// sync fleet's vocabulary.

// Tier is how eagerly a mailbox is synced.
type Tier = domain.SyncTier

// Tiers.
const (
	TierHot  = domain.SyncTierHot
	TierWarm = domain.SyncTierWarm
	TierCold = domain.SyncTierCold
)

var allTiers = []Tier{TierHot, TierWarm, TierCold}

// Reasons a tier was chosen.
const (
	ReasonSession    = domain.SyncReasonSession
	ReasonRecentMail = domain.SyncReasonRecentMail
	ReasonHotBudget  = domain.SyncReasonHotBudget
	ReasonInactive   = domain.SyncReasonInactive
	ReasonDefault    = domain.SyncReasonDefault
	ReasonUnknown    = domain.SyncReasonUnknown
	ReasonInherited  = domain.SyncReasonInherited
)

// TierPolicy, TierInput and TierDecision are the tier rules' inputs and
// outputs (see domain.EvaluateSyncTiers).
type (
	TierPolicy   = domain.SyncTierPolicy
	TierInput    = domain.SyncTierInput
	TierDecision = domain.SyncTierDecision
)

// EvaluateTiers is domain.EvaluateSyncTiers.
func EvaluateTiers(now time.Time, p TierPolicy, in []TierInput) []TierDecision {
	return domain.EvaluateSyncTiers(now, p, in)
}

// tierBox holds one mailbox's current tier; a runner reads it and waits for
// the next change without the worker's lock.
type tierBox struct {
	mu      sync.Mutex
	tier    Tier
	reason  string
	changed chan struct{}
}

func newTierBox(t Tier, reason string) *tierBox {
	return &tierBox{tier: t, reason: reason, changed: make(chan struct{})}
}

func (b *tierBox) get() (Tier, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tier, b.changed
}

// current returns the tier and the reason it was last decided for.
func (b *tierBox) current() (Tier, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tier, b.reason
}

// set changes the tier and wakes the waiters; it reports whether the tier
// changed.
func (b *tierBox) set(t Tier, reason string) (from Tier, changed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	from = b.tier
	b.reason = reason
	if t == b.tier {
		return from, false
	}
	b.tier = t
	close(b.changed)
	b.changed = make(chan struct{})
	return from, true
}
