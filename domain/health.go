package domain

import (
	"fmt"
	"math"
	"time"
)

// Mailbox health from observed warmup placement.
//
// Evidence. Each warmup_observed says where one warmup message sent by the
// mailbox landed (inbox or junk). The scorer counts them per hour of
// landing in a rolling window (default 7 days) ending at the evaluation's
// clock; a message landing in the future of that clock counts in the
// current hour, one older than the window is ignored.
//
// Level. With at least MinObservations (20) messages in the window, the
// spam rate junk / (inbox + junk) gives the level, the worst whose rate is
// reached: 80% blocked for 90 days, 40% blocked for 30 days, 20%
// quarantined for 7 days, 15% throttled for 3 days, 10% watch, else
// healthy. With fewer there is no level: too little evidence to judge.
//
// State. A level with a duration is a penalty: the state holds until its
// end whatever the rate does meanwhile, except that a worse level (a worse
// state, or blocked for longer) replaces it at once. When a penalty ends the
// state is re-derived from the evidence then, except that a block is
// followed by ProbationFor (3 days) throttled, unless the evidence is again
// quarantined or worse: a mailbox is healthy again only after its probation.
// A penalty ending with too little evidence leaves the mailbox healthy
// (after a block, once its probation is served). Without a penalty (healthy,
// watch) the state follows the level; too little evidence keeps it.
//
// Events. A mailbox.health_scored is emitted only when the state changes,
// or when a penalty is replaced by a longer one of the same state (blocked
// 30 → 90 days), whose until the event must carry. A penalty renewed at its
// end with the same level emits nothing.
//
// The fold is a pure function of the record, the evidence and the clock
// passed in; the clock never goes backwards for a record (LastEval).

// HealthLevel is one threshold of the spam rate.
type HealthLevel struct {
	// MinRate is the spam rate (0..1) from which the level applies.
	MinRate float64
	State   HealthState
	// For is the penalty's duration (0: no penalty, the state follows the
	// evidence).
	For time.Duration
}

// HealthPolicy is the health scorer's rules.
type HealthPolicy struct {
	// Window is the rolling evidence window (default 7 days).
	Window time.Duration
	// MinObservations is the evidence needed to derive a level (default 20).
	MinObservations int
	// Levels, worst first (rates descending).
	Levels []HealthLevel
	// ProbationFor is the throttled probation after a block (default 3
	// days).
	ProbationFor time.Duration
}

const day = 24 * time.Hour

// DefaultHealthPolicy returns the seed's spam-placement thresholds.
func DefaultHealthPolicy() HealthPolicy {
	return HealthPolicy{
		Window:          7 * day,
		MinObservations: 20,
		Levels: []HealthLevel{
			{0.80, HealthBlocked, 90 * day},
			{0.40, HealthBlocked, 30 * day},
			{0.20, HealthQuarantined, 7 * day},
			{0.15, HealthThrottled, 3 * day},
			{0.10, HealthWatch, 0},
		},
		ProbationFor: 3 * day,
	}
}

// Validate checks the policy.
func (p HealthPolicy) Validate() error {
	if p.Window < time.Hour {
		return fmt.Errorf("health window %s: must be at least 1h", p.Window)
	}
	if p.MinObservations < 1 {
		return fmt.Errorf("health min observations %d: must be at least 1", p.MinObservations)
	}
	if p.ProbationFor <= 0 {
		return fmt.Errorf("health probation %s: must be positive", p.ProbationFor)
	}
	prev := math.Inf(1)
	for _, l := range p.Levels {
		if !(l.MinRate > 0 && l.MinRate <= 1 && l.MinRate < prev) {
			return fmt.Errorf("health levels must have rates in (0, 1], strictly descending")
		}
		if severity(l.State) == 0 || l.For < 0 {
			return fmt.Errorf("health level %.2f: state %q, duration %s", l.MinRate, l.State, l.For)
		}
		prev = l.MinRate
	}
	return nil
}

// HealthBucket counts one hour's warmup placements.
type HealthBucket struct {
	// Hour is the hour of landing, in hours since the Unix epoch.
	Hour  int64 `json:"hour"`
	Inbox int32 `json:"inbox"`
	Junk  int32 `json:"junk"`
}

// HealthRecord is the scorer's state of one mailbox.
type HealthRecord struct {
	MailboxID string
	// State is the current state ("" before the first change: healthy).
	State HealthState
	// Until ends the current penalty (zero: none); PenaltyFor is its
	// length, Probation whether it is the throttled probation after a
	// block.
	Until      time.Time
	PenaltyFor time.Duration
	Probation  bool
	// Score is the inbox rate in percent at the last evaluation with
	// evidence (100 before any).
	Score float64
	// Buckets are the window's hours with evidence, ascending.
	Buckets []HealthBucket
	// LastEval is the latest clock the record was evaluated at.
	LastEval time.Time
}

// CurrentState is State, healthy when never set.
func (r *HealthRecord) CurrentState() HealthState {
	if r.State == "" {
		return HealthHealthy
	}
	return r.State
}

// Counts returns the evidence in the window as of the last evaluation.
func (r *HealthRecord) Counts() (inbox, junk int) {
	for _, b := range r.Buckets {
		inbox += int(b.Inbox)
		junk += int(b.Junk)
	}
	return inbox, junk
}

// severity orders states, healthy lowest; 0 is not a state.
func severity(s HealthState) int {
	switch s {
	case HealthHealthy, "":
		return 1
	case HealthWatch:
		return 2
	case HealthThrottled:
		return 3
	case HealthQuarantined:
		return 4
	case HealthBlocked:
		return 5
	}
	return 0
}

// Observe adds an observation to r and evaluates it at now (normally the
// observation event's time). o must be valid and about r's mailbox.
func (p HealthPolicy) Observe(r HealthRecord, o *WarmupObserved, now time.Time) (HealthRecord, *MailboxHealthScored) {
	now = r.clock(now)
	landed := o.LandedAt
	if landed.After(now) {
		landed = now
	}
	if now.Sub(landed) < p.Window {
		h := hourOf(landed)
		r.Buckets = addBucket(r.Buckets, h, o.Placement == PlacedJunk)
	}
	return p.Evaluate(r, now)
}

// Evaluate re-derives r's state at now: the evidence that left the window
// is dropped and an ended penalty ends.
func (p HealthPolicy) Evaluate(r HealthRecord, now time.Time) (HealthRecord, *MailboxHealthScored) {
	now = r.clock(now)
	r.LastEval = now
	r.Buckets = p.prune(r.Buckets, now)
	if r.Score == 0 && r.State == "" {
		r.Score = 100
	}
	inbox, junk := r.Counts()
	n := inbox + junk
	var (
		lvl      HealthLevel
		evidence = n >= p.MinObservations
		rate     float64
	)
	if evidence {
		rate = float64(junk) / float64(n)
		r.Score = math.Round((1-rate)*10000) / 100
		lvl = HealthLevel{State: HealthHealthy}
		for _, l := range p.Levels {
			if rate >= l.MinRate {
				lvl = l
				break
			}
		}
	}
	before, beforeFor := r.CurrentState(), r.PenaltyFor
	var reason string
	enter := func(l HealthLevel) {
		r.State, r.Probation, r.PenaltyFor = l.State, false, l.For
		r.Until = time.Time{}
		if l.For > 0 {
			r.Until = now.Add(l.For)
		}
		reason = fmt.Sprintf("spam placement %.1f%% (%d of %d warmup messages in %s): %s", rate*100, junk, n, fmtDays(p.Window), l.State)
		if l.For > 0 {
			reason += " for " + fmtDays(l.For)
		}
	}
	switch {
	case !r.Until.IsZero() && now.Before(r.Until):
		// A penalty runs: only worse evidence changes it.
		if evidence && (severity(lvl.State) > severity(r.State) || lvl.State == r.State && lvl.For > r.PenaltyFor) {
			enter(lvl)
		}
	case !r.Until.IsZero():
		// The penalty ended.
		switch {
		case evidence && r.State == HealthBlocked && !r.Probation && severity(lvl.State) >= severity(HealthQuarantined):
			enter(lvl)
		case r.State == HealthBlocked && !r.Probation:
			r.State, r.Probation, r.PenaltyFor, r.Until = HealthThrottled, true, p.ProbationFor, now.Add(p.ProbationFor)
			reason = "block ended: throttled probation for " + fmtDays(p.ProbationFor)
		case evidence:
			enter(lvl)
			if r.State == HealthHealthy {
				reason = fmt.Sprintf("penalty ended; spam placement %.1f%% (%d of %d warmup messages in %s): healthy", rate*100, junk, n, fmtDays(p.Window))
			}
		default:
			r.State, r.Probation, r.PenaltyFor, r.Until = HealthHealthy, false, 0, time.Time{}
			reason = fmt.Sprintf("penalty ended with too little evidence (%d warmup messages in %s, %d needed): healthy", n, fmtDays(p.Window), p.MinObservations)
		}
	default:
		// No penalty: the state follows the evidence.
		if evidence && (lvl.State != r.CurrentState() || lvl.For > 0) {
			enter(lvl)
		}
	}
	after := r.CurrentState()
	if after == before && !(r.PenaltyFor > beforeFor && !r.Probation && before == HealthBlocked) {
		return r, nil
	}
	ev := &MailboxHealthScored{MailboxID: r.MailboxID, State: after, Score: r.Score, Reason: reason}
	if !r.Until.IsZero() {
		u := r.Until
		ev.Until = &u
	}
	return r, ev
}

// NextCheck is when r must be evaluated again without new evidence: the end
// of its penalty, or for watch the hour its oldest evidence leaves the
// window (zero: not before new evidence).
func (p HealthPolicy) NextCheck(r HealthRecord) time.Time {
	if !r.Until.IsZero() {
		return r.Until
	}
	if r.CurrentState() != HealthHealthy && len(r.Buckets) > 0 {
		return time.Unix((r.Buckets[0].Hour+1)*3600, 0).UTC().Add(p.Window)
	}
	return time.Time{}
}

func (r *HealthRecord) clock(now time.Time) time.Time {
	now = now.Round(0).UTC()
	if now.Before(r.LastEval) {
		return r.LastEval
	}
	return now
}

func hourOf(t time.Time) int64 { return t.Unix() / 3600 }

// prune drops the buckets whose hour ended a window or more before now.
func (p HealthPolicy) prune(bs []HealthBucket, now time.Time) []HealthBucket {
	i := 0
	for i < len(bs) && now.Sub(time.Unix((bs[i].Hour+1)*3600, 0)) >= p.Window {
		i++
	}
	if i == 0 {
		return bs
	}
	return append([]HealthBucket(nil), bs[i:]...)
}

// addBucket counts one placement in hour h, keeping bs ascending. It
// returns a new slice: records are values.
func addBucket(bs []HealthBucket, h int64, junk bool) []HealthBucket {
	out := make([]HealthBucket, 0, len(bs)+1)
	added := false
	for _, b := range bs {
		if !added && b.Hour >= h {
			if b.Hour != h {
				out = append(out, HealthBucket{Hour: h})
			}
			added = true
			if b.Hour == h {
				out = append(out, b)
				countIn(&out[len(out)-1], junk)
				continue
			}
			countIn(&out[len(out)-1], junk)
		}
		out = append(out, b)
	}
	if !added {
		out = append(out, HealthBucket{Hour: h})
		countIn(&out[len(out)-1], junk)
	}
	return out
}

func countIn(b *HealthBucket, junk bool) {
	if junk {
		b.Junk++
	} else {
		b.Inbox++
	}
}

func fmtDays(d time.Duration) string {
	if d%day == 0 {
		if d == day {
			return "1 day"
		}
		return fmt.Sprintf("%d days", d/day)
	}
	return d.String()
}
