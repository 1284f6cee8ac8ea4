package domain

import (
	"cmp"
	"slices"
	"time"
)

// Sync tiers: the rules deciding how eagerly each mailbox is synced. The sync
// workers (package mailsync) call EvaluateSyncTiers on a cadence and on
// events, and carry its decisions out.

// SyncTier is how eagerly a mailbox is synced (the sync fleet's tier, not
// a sending worker's Tier). Correctness is the same in every
// tier; only latency and socket cost differ.
type SyncTier string

// Tiers.
const (
	// SyncTierHot: a persistent IDLE on INBOX, plus a poll of the special-use
	// folders every PollWarm.
	SyncTierHot SyncTier = "hot"
	// SyncTierWarm: connect, poll INBOX and the special-use folders,
	// disconnect, every PollWarm. The default.
	SyncTierWarm SyncTier = "warm"
	// SyncTierCold: the same as warm, every PollCold.
	SyncTierCold SyncTier = "cold"
)

// Valid reports whether t is one of the tiers.
func (t SyncTier) Valid() bool { return t == SyncTierHot || t == SyncTierWarm || t == SyncTierCold }

// Reasons a tier was chosen (the reason of a tier change in sync.tier and
// sync.audit).
const (
	SyncReasonSession    = "session"     // the user was active within the session grace
	SyncReasonRecentMail = "recent_mail" // newest mail within TierHotActivity
	SyncReasonHotBudget  = "hot_budget"  // demoted: over the worker's hot budget
	SyncReasonInactive   = "inactive"    // nothing within TierColdAfter
	SyncReasonDefault    = "default"     // warm: neither hot nor cold
	SyncReasonUnknown    = "unknown"     // newest mail not reported yet: tier kept
	SyncReasonInherited  = "inherited"   // taken from sync.tier at assignment
)

// SyncTierPolicy holds the tier rules' windows and the hot budget.
type SyncTierPolicy struct {
	SessionGrace time.Duration
	HotActivity  time.Duration
	ColdAfter    time.Duration
	UnknownGrace time.Duration
	// HotBudget caps hot mailboxes; 0 or less means no cap.
	HotBudget int
}

// SyncTierInput is what the tier of one mailbox is decided from.
type SyncTierInput struct {
	// Current is the mailbox's tier now.
	Current SyncTier
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

// SyncTierDecision is the tier a mailbox should have, and why.
type SyncTierDecision struct {
	Tier   SyncTier
	Reason string
}

// EvaluateSyncTiers decides the tier of each mailbox a worker owns; out[i] is
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
func EvaluateSyncTiers(now time.Time, p SyncTierPolicy, in []SyncTierInput) []SyncTierDecision {
	out := make([]SyncTierDecision, len(in))
	type candidate struct {
		i        int
		activity time.Time
	}
	var demotable []candidate
	hot := 0
	for i, x := range in {
		session := !x.SessionAt.IsZero() && now.Sub(x.SessionAt) <= p.SessionGrace
		recent := x.MailKnown && !x.NewestMail.IsZero() && now.Sub(x.NewestMail) <= p.HotActivity
		var d SyncTierDecision
		switch {
		case session:
			d = SyncTierDecision{SyncTierHot, SyncReasonSession}
		case recent:
			d = SyncTierDecision{SyncTierHot, SyncReasonRecentMail}
		case !x.MailKnown && now.Sub(x.TrackedSince) < p.UnknownGrace && x.Current.Valid():
			d = SyncTierDecision{x.Current, SyncReasonUnknown}
		default:
			last := x.AddedAt
			if x.MailKnown && x.NewestMail.After(last) {
				last = x.NewestMail
			}
			if x.SessionAt.After(last) {
				last = x.SessionAt
			}
			if now.Sub(last) > p.ColdAfter {
				d = SyncTierDecision{SyncTierCold, SyncReasonInactive}
			} else {
				d = SyncTierDecision{SyncTierWarm, SyncReasonDefault}
			}
		}
		out[i] = d
		if d.Tier == SyncTierHot {
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
			out[c.i] = SyncTierDecision{SyncTierWarm, SyncReasonHotBudget}
		}
	}
	return out
}
