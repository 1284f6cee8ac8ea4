package mailsync

import (
	"sync"

	"github.com/mailplane/mailplane/domain"
)

// The tier rules, and the sync records' types, live in domain
// (EvaluateSyncTiers, SyncTier, SyncTierRecord, ...); the worker carries the
// decisions out.

var allTiers = []domain.SyncTier{domain.SyncTierHot, domain.SyncTierWarm, domain.SyncTierCold}

// tierBox holds one mailbox's current tier; a runner reads it and waits for
// the next change without the worker's lock.
type tierBox struct {
	mu      sync.Mutex
	tier    domain.SyncTier
	reason  string
	changed chan struct{}
}

func newTierBox(t domain.SyncTier, reason string) *tierBox {
	return &tierBox{tier: t, reason: reason, changed: make(chan struct{})}
}

func (b *tierBox) get() (domain.SyncTier, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tier, b.changed
}

// current returns the tier and the reason it was last decided for.
func (b *tierBox) current() (domain.SyncTier, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tier, b.reason
}

// set changes the tier and wakes the waiters; it reports whether the tier
// changed.
func (b *tierBox) set(t domain.SyncTier, reason string) (from domain.SyncTier, changed bool) {
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
