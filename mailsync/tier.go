package mailsync

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// Tier is how eagerly a mailbox is synced. Correctness is the same in every
// tier; only latency and socket cost differ.
type Tier string

// Tiers.
const (
	// TierHot: a persistent IDLE on INBOX, plus a poll of the special-use
	// folders every PollWarm.
	TierHot Tier = "hot"
	// TierWarm: connect, poll INBOX and the special-use folders,
	// disconnect, every PollWarm. The default.
	TierWarm Tier = "warm"
	// TierCold: the same as warm, every PollCold.
	TierCold Tier = "cold"
)

// Valid reports whether t is one of the tiers.
func (t Tier) Valid() bool { return t == TierHot || t == TierWarm || t == TierCold }

var allTiers = []Tier{TierHot, TierWarm, TierCold}

// Reasons a tier was chosen (the reason of a tier change in sync.tier and
// sync.audit).
const (
	ReasonSession    = "session"     // the user was active within the session grace
	ReasonRecentMail = "recent_mail" // newest mail within TierHotActivity
	ReasonHotBudget  = "hot_budget"  // demoted: over the worker's hot budget
	ReasonInactive   = "inactive"    // nothing within TierColdAfter
	ReasonDefault    = "default"     // warm: neither hot nor cold
	ReasonUnknown    = "unknown"     // newest mail not reported yet: tier kept
	ReasonInherited  = "inherited"   // taken from sync.tier at assignment
)

// TierPolicy holds the tier rules' windows and the hot budget.
type TierPolicy struct {
	SessionGrace time.Duration
	HotActivity  time.Duration
	ColdAfter    time.Duration
	UnknownGrace time.Duration
	// HotBudget caps hot mailboxes; 0 or less means no cap.
	HotBudget int
}

// TierInput is what the tier of one mailbox is decided from.
type TierInput struct {
	// Current is the mailbox's tier now.
	Current Tier
	// SessionAt is the user's latest activity (zero: none known).
	SessionAt time.Time
	// MailKnown says the runner reported the newest mail; NewestMail is
	// its internal date (zero with MailKnown: the mailbox has no mail).
	MailKnown  bool
	NewestMail time.Time
	// TrackedSince is when this worker started tracking the mailbox (its
	// partition was assigned, or the mailbox added).
	TrackedSince time.Time
	// AddedAt is when the mailbox was registered.
	AddedAt time.Time
}

// TierDecision is the tier a mailbox should have, and why.
type TierDecision struct {
	Tier   Tier
	Reason string
}

// EvaluateTiers decides the tier of each mailbox a worker owns; out[i] is
// the decision for in[i]. It is pure: same inputs, same decisions.
//
//   - In session (user active within SessionGrace): hot.
//   - Newest mail within HotActivity: hot.
//   - Newest mail not reported yet, for less than UnknownGrace since the
//     worker began tracking the mailbox: the current tier is kept (a new
//     owner keeps the tier it inherited until its runner knows better).
//   - Latest of newest mail, session and registration older than
//     ColdAfter: cold. Otherwise warm.
//   - Above HotBudget, hot mailboxes without a session are demoted to
//     warm, least recently active first (unknown activity counts as
//     oldest); mailboxes in session are never demoted.
func EvaluateTiers(now time.Time, p TierPolicy, in []TierInput) []TierDecision {
	out := make([]TierDecision, len(in))
	type candidate struct {
		i        int
		activity time.Time
	}
	var demotable []candidate
	hot := 0
	for i, x := range in {
		session := !x.SessionAt.IsZero() && now.Sub(x.SessionAt) <= p.SessionGrace
		recent := x.MailKnown && !x.NewestMail.IsZero() && now.Sub(x.NewestMail) <= p.HotActivity
		var d TierDecision
		switch {
		case session:
			d = TierDecision{TierHot, ReasonSession}
		case recent:
			d = TierDecision{TierHot, ReasonRecentMail}
		case !x.MailKnown && now.Sub(x.TrackedSince) < p.UnknownGrace && x.Current.Valid():
			d = TierDecision{x.Current, ReasonUnknown}
		default:
			last := x.AddedAt
			if x.MailKnown && x.NewestMail.After(last) {
				last = x.NewestMail
			}
			if x.SessionAt.After(last) {
				last = x.SessionAt
			}
			if now.Sub(last) > p.ColdAfter {
				d = TierDecision{TierCold, ReasonInactive}
			} else {
				d = TierDecision{TierWarm, ReasonDefault}
			}
		}
		out[i] = d
		if d.Tier == TierHot {
			hot++
			if !session {
				var act time.Time
				if x.MailKnown {
					act = x.NewestMail
				}
				demotable = append(demotable, candidate{i, act})
			}
		}
	}
	if p.HotBudget > 0 && hot > p.HotBudget {
		slices.SortStableFunc(demotable, func(a, b candidate) int {
			if c := a.activity.Compare(b.activity); c != 0 {
				return c
			}
			return cmp.Compare(a.i, b.i)
		})
		for _, c := range demotable[:min(hot-p.HotBudget, len(demotable))] {
			out[c.i] = TierDecision{TierWarm, ReasonHotBudget}
		}
	}
	return out
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
