package domain

import (
	"fmt"
	"math"
	"strconv"
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
// is dropped and an ended penalty ends. The event it returns carries the
// evidence the state was decided from (decide).
func (p HealthPolicy) Evaluate(r HealthRecord, now time.Time) (HealthRecord, *MailboxHealthScored) {
	now = r.clock(now)
	r.LastEval = now
	r.Buckets = p.prune(r.Buckets, now)
	if r.Score == 0 && r.State == "" {
		r.Score = 100
	}
	w := p.weigh(r.Buckets)
	if w.enough {
		r.Score = math.Round((1-w.rate)*10000) / 100
	}
	before, beforeFor := r.CurrentState(), r.PenaltyFor
	reason, evidence := p.decide(&r, w, now)
	after := r.CurrentState()
	if after == before && !(r.PenaltyFor > beforeFor && !r.Probation && before == HealthBlocked) {
		return r, nil
	}
	ev := &MailboxHealthScored{MailboxID: r.MailboxID, State: after, Score: r.Score, Reason: reason, Evidence: evidence}
	if !r.Until.IsZero() {
		u := r.Until
		ev.Until = &u
	}
	return r, ev
}

// healthWeighing is the window's evidence as the scorer weighs it.
type healthWeighing struct {
	inbox, junk, n int
	// rate is junk / n (0 without observations); enough says n reaches
	// MinObservations, and only then is lvl the level reached (healthy
	// below every level).
	rate   float64
	enough bool
	lvl    HealthLevel
}

func (p HealthPolicy) weigh(bs []HealthBucket) healthWeighing {
	var w healthWeighing
	for _, b := range bs {
		w.inbox += int(b.Inbox)
		w.junk += int(b.Junk)
	}
	w.n = w.inbox + w.junk
	if w.n > 0 {
		w.rate = float64(w.junk) / float64(w.n)
	}
	w.enough = w.n >= p.MinObservations
	if w.enough {
		w.lvl = HealthLevel{State: HealthHealthy}
		for _, l := range p.Levels {
			if w.rate >= l.MinRate {
				w.lvl = l
				break
			}
		}
	}
	return w
}

// decide applies the rules to r at now and returns the reason and the
// evidence of the state it leaves r in (both meaningful only when the state
// changed): the one place a state is decided, so the evidence is made of
// exactly the numbers the decision was.
func (p HealthPolicy) decide(r *HealthRecord, w healthWeighing, now time.Time) (string, *HealthEvidence) {
	var (
		reason   string
		evidence *HealthEvidence
	)
	enter := func(l HealthLevel) {
		r.State, r.Probation, r.PenaltyFor = l.State, false, l.For
		r.Until = time.Time{}
		if l.For > 0 {
			r.Until = now.Add(l.For)
		}
		reason = fmt.Sprintf("spam placement %.1f%% (%d of %d warmup messages in %s): %s", w.rate*100, w.junk, w.n, fmtDays(p.Window), l.State)
		if l.For > 0 {
			reason += " for " + fmtDays(l.For)
		}
		evidence = p.evidence(w, now, HealthRuleLevel, l)
	}
	switch {
	case !r.Until.IsZero() && now.Before(r.Until):
		// A penalty runs: only worse evidence changes it.
		if w.enough && (severity(w.lvl.State) > severity(r.State) || w.lvl.State == r.State && w.lvl.For > r.PenaltyFor) {
			enter(w.lvl)
		}
	case !r.Until.IsZero():
		// The penalty ended.
		switch {
		case w.enough && r.State == HealthBlocked && !r.Probation && severity(w.lvl.State) >= severity(HealthQuarantined):
			enter(w.lvl)
		case r.State == HealthBlocked && !r.Probation:
			r.State, r.Probation, r.PenaltyFor, r.Until = HealthThrottled, true, p.ProbationFor, now.Add(p.ProbationFor)
			reason = "block ended: throttled probation for " + fmtDays(p.ProbationFor)
			evidence = p.evidence(w, now, HealthRuleProbation, HealthLevel{State: HealthThrottled, For: p.ProbationFor})
		case w.enough:
			enter(w.lvl)
			if r.State == HealthHealthy {
				reason = fmt.Sprintf("penalty ended; spam placement %.1f%% (%d of %d warmup messages in %s): healthy", w.rate*100, w.junk, w.n, fmtDays(p.Window))
			}
		default:
			r.State, r.Probation, r.PenaltyFor, r.Until = HealthHealthy, false, 0, time.Time{}
			reason = fmt.Sprintf("penalty ended with too little evidence (%d warmup messages in %s, %d needed): healthy", w.n, fmtDays(p.Window), p.MinObservations)
			evidence = p.evidence(w, now, HealthRuleTooFew, HealthLevel{State: HealthHealthy})
		}
	default:
		// No penalty: the state follows the evidence.
		if w.enough && (w.lvl.State != r.CurrentState() || w.lvl.For > 0) {
			enter(w.lvl)
		}
	}
	return reason, evidence
}

// evidence records w at now under rule, l being the state entered: for a
// level, the level reached (healthy: below every level, the lowest level
// given as the threshold not reached).
func (p HealthPolicy) evidence(w healthWeighing, now time.Time, rule HealthRule, l HealthLevel) *HealthEvidence {
	end := now
	e := &HealthEvidence{
		WindowSeconds: int64(p.Window / time.Second), WindowEnd: &end,
		Inbox: int64(w.inbox), Junk: int64(w.junk), MinObservations: int64(p.MinObservations),
		Rate: w.rate, Rule: rule, PenaltySeconds: int64(l.For / time.Second),
	}
	if rule != HealthRuleLevel {
		return e
	}
	if l.State == HealthHealthy {
		e.Rule = HealthRuleBelowLevels
		if len(p.Levels) == 0 {
			return e
		}
		l = p.Levels[len(p.Levels)-1]
	}
	e.Threshold = &HealthThreshold{Rate: l.MinRate, State: l.State}
	return e
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

// HealthRule names the rule that decided a health state.
type HealthRule string

// Health rules.
const (
	// HealthRuleLevel: the window's spam rate reached a level (Threshold,
	// ThresholdState).
	HealthRuleLevel HealthRule = "level"
	// HealthRuleBelowLevels: enough observations, a rate below every level
	// (Threshold is the lowest level's): healthy.
	HealthRuleBelowLevels HealthRule = "below_levels"
	// HealthRuleTooFew: a penalty ended with fewer observations than
	// MinObservations: healthy, nothing to judge by.
	HealthRuleTooFew HealthRule = "too_few_observations"
	// HealthRuleProbation: a block ended: throttled for the probation.
	HealthRuleProbation HealthRule = "probation"
)

var healthRules = []HealthRule{HealthRuleLevel, HealthRuleBelowLevels, HealthRuleTooFew, HealthRuleProbation}

// Bounds of HealthEvidence (the schema of mailbox.health_scored says the
// same).
const (
	MaxHealthWindowSeconds   = 366 * 24 * 3600
	MaxHealthPenaltySeconds  = 10 * 366 * 24 * 3600
	MaxHealthMinObservations = 1_000_000
)

// HealthEvidence is what a health state was decided from: the warmup
// observations in the scoring window ending at WindowEnd (the scorer's
// clock: the time the log received the observation, or the ticker's), their
// spam rate, and the rule that fired. The scorer fills it from the very
// numbers it decided on (HealthPolicy.Evaluate).
type HealthEvidence struct {
	WindowSeconds int64      `json:"window_seconds"`
	WindowEnd     *time.Time `json:"window_end"`
	// Inbox and Junk count the window's warmup messages by where they
	// landed; MinObservations is how many a level needs.
	Inbox           int64 `json:"inbox"`
	Junk            int64 `json:"junk"`
	MinObservations int64 `json:"min_observations"`
	// Rate is Junk / (Inbox + Junk), 0 without observations.
	Rate float64    `json:"rate"`
	Rule HealthRule `json:"rule"`
	// Threshold is the level that was reached (rule level) or the lowest
	// level, not reached (below_levels); nil for the other rules.
	Threshold *HealthThreshold `json:"threshold,omitempty"`
	// PenaltySeconds is the length of the penalty entered (0: none).
	PenaltySeconds int64 `json:"penalty_seconds,omitempty"`
}

// HealthThreshold is one level of the spam rate: from Rate (0..1) on, the
// state is State.
type HealthThreshold struct {
	Rate  float64     `json:"rate"`
	State HealthState `json:"state"`
}

// Total is the window's warmup messages.
func (e *HealthEvidence) Total() int64 { return e.Inbox + e.Junk }

// Validate returns every problem of e, field paths relative to it. Every
// field is bounded: besides the scorer, a caller granted
// publish:mailbox.health_scored may publish the event, and a writer
// straight to the topic may write anything.
func (e *HealthEvidence) Validate() Problems {
	var ps Problems
	checkRange(&ps, "window_seconds", e.WindowSeconds, 3600, MaxHealthWindowSeconds)
	if e.WindowEnd == nil {
		ps.Add("window_end", CodeRequired, "is required")
	}
	checkRange(&ps, "inbox", e.Inbox, 0, MaxCount)
	checkRange(&ps, "junk", e.Junk, 0, MaxCount)
	checkRange(&ps, "min_observations", e.MinObservations, 1, MaxHealthMinObservations)
	if math.IsNaN(e.Rate) || e.Rate < 0 || e.Rate > 1 {
		ps.Add("rate", CodeOutOfRange, "must be between 0 and 1")
	}
	checkEnum(&ps, "rule", e.Rule, true, healthRules...)
	if t := e.Threshold; t != nil {
		if math.IsNaN(t.Rate) || t.Rate <= 0 || t.Rate > 1 {
			ps.Add("threshold.rate", CodeOutOfRange, "must be above 0 and at most 1")
		}
		checkEnum(&ps, "threshold.state", t.State, true, HealthHealthy, HealthWatch, HealthThrottled, HealthQuarantined, HealthBlocked)
	}
	checkRange(&ps, "penalty_seconds", e.PenaltySeconds, 0, MaxHealthPenaltySeconds)
	return ps
}

// ExplainHealth is the one sentence a support agent can give a customer
// about a mailbox's health state: the state, until when, and what it was
// decided from, e.g. "quarantined until 12 Dec 2026: 23 of 96 warmup
// messages (24 %) landed in spam over the last 7 days; the quarantine level
// is 20 %". It says nothing but the state, the time and the evidence's
// numbers (no id, address, credential or free text). e nil (a decision
// older than its evidence) gives the state alone.
func ExplainHealth(state HealthState, until *time.Time, e *HealthEvidence) string {
	if state == "" {
		state = HealthHealthy
	}
	head := healthWords[state]
	if head == "" {
		head = "in an unknown health state"
	}
	if until != nil && !until.IsZero() {
		head += " until " + until.UTC().Format("2 Jan 2006 15:04 UTC")
	}
	if e == nil {
		return head
	}
	window := fmtDays(time.Duration(e.WindowSeconds) * time.Second)
	var threshold float64
	if e.Threshold != nil {
		threshold = e.Threshold.Rate
	}
	landed := fmt.Sprintf("%d of %d warmup messages (%s) landed in spam over the last %s",
		e.Junk, e.Total(), fmtPercent(e.Rate, threshold), window)
	switch {
	case e.Rule == HealthRuleProbation:
		return fmt.Sprintf("%s: on probation after a block ended; meanwhile %s", head, landed)
	case e.Rule == HealthRuleTooFew:
		return fmt.Sprintf("%s: too few observations to judge: %d of the %d warmup messages needed over the last %s",
			head, e.Total(), e.MinObservations, window)
	case e.Threshold == nil:
		return head + ": " + landed
	case e.Rule == HealthRuleBelowLevels:
		return fmt.Sprintf("%s: %s, below the %s level of %s", head, landed, levelWords[e.Threshold.State], fmtLevel(threshold))
	}
	return fmt.Sprintf("%s: %s; the %s level is %s", head, landed, levelWords[e.Threshold.State], fmtLevel(threshold))
}

var healthWords = map[HealthState]string{
	HealthHealthy: "healthy", HealthWatch: "on watch", HealthThrottled: "throttled",
	HealthQuarantined: "quarantined", HealthBlocked: "blocked",
}

var levelWords = map[HealthState]string{
	HealthHealthy: "healthy", HealthWatch: "watch", HealthThrottled: "throttle",
	HealthQuarantined: "quarantine", HealthBlocked: "block",
}

// fmtPercent writes rate (0..1) as a percentage, whole when that does not
// put it on the other side of threshold (a rate of 19.6 % below a level of
// 20 % reads "19.6 %", not "20 %"); threshold 0 (none): whole.
func fmtPercent(rate, threshold float64) string {
	var s string
	for prec := 0; prec <= 3; prec++ {
		s = strconv.FormatFloat(rate*100, 'f', prec, 64)
		shown, _ := strconv.ParseFloat(s, 64)
		if threshold == 0 || (shown/100 >= threshold) == (rate >= threshold) {
			break
		}
	}
	return s + " %"
}

// fmtLevel writes a level's rate as a percentage, to a hundredth at most
// (12.5 %, 20 %).
func fmtLevel(rate float64) string {
	return strconv.FormatFloat(math.Round(rate*10000)/100, 'f', -1, 64) + " %"
}
