package placement

import (
	"slices"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// This file is the retry of what waits for capacity: dedicated
// shortfalls, degraded mailboxes, refused mailboxes and draining workers,
// at every tick and whenever capacity appears.

// retry places what waits for capacity: dedicated shortfalls and degraded
// mailboxes first (moving those frees shared premium room), then refused
// mailboxes (oldest first), then mailboxes on draining workers; repeated
// while a round decides something (a drain can free a released worker).
func (s *State) retry(at time.Time) {
	for range 8 {
		n := len(s.out)
		for _, o := range s.shortOrgs() {
			s.ensureDedicated(o, at)
		}
		s.upgradeDegraded(at)
		s.retryPending(at)
		s.retryDrains(at)
		if len(s.out) == n {
			return
		}
	}
}

func (s *State) upgradeDegraded(at time.Time) {
	var orgs []*placementOrg
	for _, o := range s.dedicatedOrgs {
		if o.shared > 0 && len(o.bound) > 0 {
			orgs = append(orgs, o)
		}
	}
	slices.SortFunc(orgs, func(a, b *placementOrg) int { return strings.Compare(a.id, b.id) })
	for _, o := range orgs {
		if s.bestDedicated(o, placementClassWeights[0], nil) == nil {
			continue
		}
		failed := int64(1 << 62)
		for _, m := range o.mailboxesSorted() {
			if m.worker == nil || m.worker.tier == domain.TierDedicated || m.weight >= failed {
				continue
			}
			if !s.relocate(m, moveUpgrade, m.band, domain.ReasonDedicatedAvailable, at) {
				failed = m.weight
			}
		}
	}
}

type placementFailKey struct {
	org    string // dedicated orgs only
	tier   domain.Tier
	band   domain.RiskPool
	weight int64
}

func (s *State) retryPending(at time.Time) {
	if len(s.pending) == 0 {
		return
	}
	ms := make([]*placementMailbox, 0, len(s.pending))
	for _, m := range s.pending {
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b *placementMailbox) int {
		if c := a.pendingSince.Compare(b.pendingSince); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	failed := map[placementFailKey]bool{}
	for _, m := range ms {
		if m.worker != nil {
			continue
		}
		k := placementFailKey{tier: placementWantedTier(m.org), band: m.band, weight: m.weight}
		if k.tier == domain.TierDedicated {
			k.org = m.org.id
		}
		if failed[k] {
			continue
		}
		if !s.place(m.id, m.org, m.weight, m.band, domain.ReasonRetry, false, at) {
			failed[k] = true
		}
	}
}

func (s *State) retryDrains(at time.Time) {
	if len(s.draining) == 0 {
		return
	}
	ws := make([]*placementWorker, 0, len(s.draining))
	for _, w := range s.draining {
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b *placementWorker) int { return strings.Compare(a.id, b.id) })
	for _, w := range ws {
		if s.draining[w.id] != nil {
			s.drain(w, domain.ReasonRetry, at)
		}
	}
}
