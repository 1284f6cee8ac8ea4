package domain

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// The policy document: every tunable rule of health scoring and placement
// in one versioned JSON document (docs/operating.md, Policy). Durations are
// Go duration strings in whole seconds ("168h", "10m", "30s"); rates are
// fractions (0.2 for 20 %). DefaultPolicy is today's rules.

// PolicyVersion is the document version this code reads and writes.
const PolicyVersion = 1

// Bounds of a policy document.
const (
	// MaxPolicyBytes bounds a document's size.
	MaxPolicyBytes = 64 << 10
	// MaxPolicyLevels bounds the health levels.
	MaxPolicyLevels = 8
	// maxPolicyDuration bounds a duration string's length.
	maxPolicyDuration = 32
)

// Today's placement rules: internal/placement's Config defaults.
const (
	DefaultBandDwell              = time.Hour
	DefaultLivenessWindow         = 30 * time.Second
	DefaultLivenessHoldPermille   = 550
	DefaultLivenessHoldMinWorkers = 3
	DefaultLivenessHoldMax        = 10 * time.Minute
	DefaultTierDwell              = 5 * time.Minute
	DefaultWorkerRetention        = 7 * day
	DefaultMaxForgetPerTick       = 5000
	DefaultWorkerHealthMinSends   = 100
)

// PlacementPolicy is the placement engine's tunable rules, in the units
// internal/placement's Config takes.
type PlacementPolicy struct {
	// BandDwell: how long scores must stay better than a band before it
	// improves.
	BandDwell time.Duration
	// LivenessWindow: how long a worker stays live after its last heartbeat.
	LivenessWindow time.Duration
	// LivenessHoldPermille: the share of live workers (thousandths) silent
	// at once from which liveness is held.
	LivenessHoldPermille int64
	// LivenessHoldMinWorkers: with fewer live workers liveness is never held.
	LivenessHoldMinWorkers int
	// LivenessHoldMax: the longest a hold lasts (0: no bound).
	LivenessHoldMax time.Duration
	// TierDwell: how long a worker's tier stays as last changed (0: no
	// dwell).
	TierDwell time.Duration
	// WorkerRetention: how long a dead worker is remembered.
	WorkerRetention time.Duration
	// MaxForgetPerTick bounds the workers one tick forgets.
	MaxForgetPerTick int
	// WorkerHealthMinSends: a sample with fewer sends leaves a worker's
	// health unchanged.
	WorkerHealthMinSends int64
	// ComplaintPPM and HardBouncePPM: a worker's watch, throttled,
	// quarantined and blocked levels in parts per million of sends.
	ComplaintPPM  [4]int64
	HardBouncePPM [4]int64
}

// DefaultPlacementPolicy returns today's placement rules.
func DefaultPlacementPolicy() PlacementPolicy {
	return PlacementPolicy{
		BandDwell:              DefaultBandDwell,
		LivenessWindow:         DefaultLivenessWindow,
		LivenessHoldPermille:   DefaultLivenessHoldPermille,
		LivenessHoldMinWorkers: DefaultLivenessHoldMinWorkers,
		LivenessHoldMax:        DefaultLivenessHoldMax,
		TierDwell:              DefaultTierDwell,
		WorkerRetention:        DefaultWorkerRetention,
		MaxForgetPerTick:       DefaultMaxForgetPerTick,
		WorkerHealthMinSends:   DefaultWorkerHealthMinSends,
		ComplaintPPM:           [4]int64{1000, 3000, 5000, 10000},
		HardBouncePPM:          [4]int64{20000, 50000, 80000, 100000},
	}
}

// Policy is one version of the rules of health scoring and placement.
type Policy struct {
	Version        int
	HealthRules    HealthPolicy
	PlacementRules PlacementPolicy
}

// DefaultPolicy returns today's rules: DefaultHealthPolicy and
// DefaultPlacementPolicy.
func DefaultPolicy() Policy {
	return Policy{Version: PolicyVersion, HealthRules: DefaultHealthPolicy(), PlacementRules: DefaultPlacementPolicy()}
}

// Health returns the health scorer's rules (a copy: the levels are not
// shared).
func (p Policy) Health() HealthPolicy {
	h := p.HealthRules
	h.Levels = append([]HealthLevel(nil), h.Levels...)
	return h
}

//go:embed schemas/policy/mailplane.policy.v1.json
var policySchema []byte

// PolicySchema returns the JSON Schema of the policy document.
func PolicySchema() []byte { return bytes.Clone(policySchema) }

// The document's JSON form.
type policyDoc struct {
	Version   int          `json:"version"`
	Health    healthDoc    `json:"health"`
	Placement placementDoc `json:"placement"`
}

type healthDoc struct {
	Window          string     `json:"window"`
	MinObservations int64      `json:"min_observations"`
	Probation       string     `json:"probation"`
	Levels          []levelDoc `json:"levels"`
}

type levelDoc struct {
	MinRate float64 `json:"min_rate"`
	State   string  `json:"state"`
	For     string  `json:"for"`
}

type placementDoc struct {
	BandDwell              string   `json:"band_dwell"`
	LivenessWindow         string   `json:"liveness_window"`
	LivenessHoldShare      float64  `json:"liveness_hold_share"`
	LivenessHoldMinWorkers int64    `json:"liveness_hold_min_workers"`
	LivenessHoldMax        string   `json:"liveness_hold_max"`
	TierDwell              string   `json:"tier_dwell"`
	WorkerRetention        string   `json:"worker_retention"`
	MaxForgetPerTick       int64    `json:"max_forget_per_tick"`
	WorkerHealthMinSends   int64    `json:"worker_health_min_sends"`
	WorkerComplaintRates   ratesDoc `json:"worker_complaint_rates"`
	WorkerHardBounceRates  ratesDoc `json:"worker_hard_bounce_rates"`
}

type ratesDoc struct {
	Watch       float64 `json:"watch"`
	Throttled   float64 `json:"throttled"`
	Quarantined float64 `json:"quarantined"`
	Blocked     float64 `json:"blocked"`
}

// MarshalJSON writes the policy as its document.
func (p Policy) MarshalJSON() ([]byte, error) {
	return json.Marshal(p.doc())
}

func (p Policy) doc() policyDoc {
	h, pl := p.HealthRules, p.PlacementRules
	levels := make([]levelDoc, len(h.Levels))
	for i, l := range h.Levels {
		levels[i] = levelDoc{MinRate: l.MinRate, State: string(l.State), For: FormatPolicyDuration(l.For)}
	}
	return policyDoc{
		Version: p.Version,
		Health: healthDoc{Window: FormatPolicyDuration(h.Window), MinObservations: int64(h.MinObservations),
			Probation: FormatPolicyDuration(h.ProbationFor), Levels: levels},
		Placement: placementDoc{
			BandDwell:              FormatPolicyDuration(pl.BandDwell),
			LivenessWindow:         FormatPolicyDuration(pl.LivenessWindow),
			LivenessHoldShare:      float64(pl.LivenessHoldPermille) / 1e3,
			LivenessHoldMinWorkers: int64(pl.LivenessHoldMinWorkers),
			LivenessHoldMax:        FormatPolicyDuration(pl.LivenessHoldMax),
			TierDwell:              FormatPolicyDuration(pl.TierDwell),
			WorkerRetention:        FormatPolicyDuration(pl.WorkerRetention),
			MaxForgetPerTick:       int64(pl.MaxForgetPerTick),
			WorkerHealthMinSends:   pl.WorkerHealthMinSends,
			WorkerComplaintRates:   ratesOf(pl.ComplaintPPM),
			WorkerHardBounceRates:  ratesOf(pl.HardBouncePPM),
		},
	}
}

func ratesOf(ppm [4]int64) ratesDoc {
	return ratesDoc{float64(ppm[0]) / 1e6, float64(ppm[1]) / 1e6, float64(ppm[2]) / 1e6, float64(ppm[3]) / 1e6}
}

// FormatPolicyDuration writes d as the document does: in the largest of
// hours, minutes and seconds that holds it exactly ("168h", "90m", "30s").
func FormatPolicyDuration(d time.Duration) string {
	if d == 0 {
		return "0s"
	}
	for _, u := range []struct {
		d      time.Duration
		suffix string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if d%u.d == 0 {
			return strconv.FormatInt(int64(d/u.d), 10) + u.suffix
		}
	}
	return d.String()
}

// ParsePolicy decodes and checks a policy document strictly: unknown or
// repeated fields, nulls, numbers out of range and a document over
// MaxPolicyBytes are refused with field problems (paths such as
// "health.levels[2].min_rate").
func ParsePolicy(raw []byte) (Policy, Problems) {
	var ps Problems
	if len(raw) > MaxPolicyBytes {
		ps.Add("", CodeTooLarge, "the document is %d bytes; at most %d", len(raw), MaxPolicyBytes)
		return Policy{}, ps
	}
	d, ps := decodePolicyDoc(raw)
	if len(ps) > 0 {
		return Policy{}, ps
	}
	return d.policy()
}

var (
	policyDocType = reflect.TypeFor[policyDoc]()
	levelDocType  = reflect.TypeFor[levelDoc]()
)

// decodePolicyDoc decodes the document's shape: strictShape checks the
// objects (the levels one by one, as it does not enter arrays), the
// decoder proper the types.
func decodePolicyDoc(raw []byte) (policyDoc, Problems) {
	shaped, ps := strictShape(raw, policyDocType)
	if len(ps) > 0 {
		return policyDoc{}, unprefixData(ps, "")
	}
	// The levels first, so that a field the decoder proper would refuse
	// without a path is reported at its level.
	var levels struct {
		Health struct{ Levels []json.RawMessage }
	}
	if json.Unmarshal(shaped, &levels) == nil {
		if n := len(levels.Health.Levels); n > MaxPolicyLevels {
			ps.Add("health.levels", CodeOutOfRange, "%d levels; at most %d", n, MaxPolicyLevels)
			return policyDoc{}, ps
		}
		for i, l := range levels.Health.Levels {
			if _, lps := strictShape(l, levelDocType); len(lps) > 0 {
				ps = append(ps, unprefixData(lps, "health.levels["+strconv.Itoa(i)+"]")...)
			}
		}
		if len(ps) > 0 {
			return policyDoc{}, ps
		}
	}
	var d policyDoc
	dec := json.NewDecoder(bytes.NewReader(shaped))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return policyDoc{}, decodeProblems(err)
	}
	if dec.More() {
		ps.Add("", CodeMalformedJSON, "trailing data after the document")
		return policyDoc{}, ps
	}
	return d, nil
}

// unprefixData rewrites strictShape's "data" paths under prefix.
func unprefixData(ps Problems, prefix string) Problems {
	out := make(Problems, len(ps))
	for i, p := range ps {
		rest := strings.TrimPrefix(strings.TrimPrefix(p.Field, "data"), ".")
		switch {
		case prefix == "":
			p.Field = rest
		case rest == "":
			p.Field = prefix
		default:
			p.Field = prefix + "." + rest
		}
		out[i] = p
	}
	return out
}

// decodeProblems turns a decoder error into a problem.
func decodeProblems(err error) Problems {
	var ps Problems
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &te):
		ps.Add(te.Field, CodeInvalidType, "must be a JSON %s (or is out of its range)", te.Type.Kind())
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		ps.Add("", CodeUnknownField, "%s", strings.TrimPrefix(err.Error(), "json: "))
	default:
		ps.Add("", CodeMalformedJSON, "not a JSON document: %v", err)
	}
	return ps
}

// Ranges of the document's fields.
const (
	maxHealthWindow   = 90 * day
	maxPenalty        = 365 * day
	maxPolicyCount    = 1_000_000
	maxMinSends       = 1_000_000_000
	maxPlacementDwell = 30 * day
	maxLiveness       = time.Hour
	maxHoldOrDwell    = day
)

// policy converts and checks the decoded document.
func (d policyDoc) policy() (Policy, Problems) {
	var ps Problems
	if d.Version != PolicyVersion {
		ps.Add("version", CodeInvalid, "must be %d", PolicyVersion)
	}
	p := Policy{Version: d.Version}
	p.HealthRules = d.Health.rules(&ps)
	p.PlacementRules = d.Placement.rules(&ps)
	if len(ps) > 0 {
		return Policy{}, ps
	}
	// The scorer's own check, which no valid document may fail.
	if err := p.HealthRules.Validate(); err != nil {
		ps.Add("health", CodeInvalid, "%v", err)
		return Policy{}, ps
	}
	return p, nil
}

func (h healthDoc) rules(ps *Problems) HealthPolicy {
	r := HealthPolicy{
		Window:          policyDuration(ps, "health.window", h.Window, time.Hour, maxHealthWindow),
		MinObservations: int(policyCount(ps, "health.min_observations", h.MinObservations, maxPolicyCount)),
		ProbationFor:    policyDuration(ps, "health.probation", h.Probation, time.Second, maxPenalty),
	}
	if len(h.Levels) == 0 {
		ps.Add("health.levels", CodeRequired, "at least one level")
	}
	prev := math.Inf(1)
	for i, l := range h.Levels {
		path := "health.levels[" + strconv.Itoa(i) + "]"
		if !(l.MinRate > 0 && l.MinRate <= 1) {
			ps.Add(path+".min_rate", CodeOutOfRange, "must be a fraction in (0, 1]")
		} else if l.MinRate >= prev {
			ps.Add(path+".min_rate", CodeInvalid, "levels must be worst first: rates strictly descending")
		}
		prev = l.MinRate
		st := HealthState(l.State)
		if checkText(ps, path+".state", l.State, true, 16) && (st == HealthHealthy || severity(st) == 0) {
			ps.Add(path+".state", CodeInvalid, "must be one of watch, throttled, quarantined, blocked")
		}
		r.Levels = append(r.Levels, HealthLevel{MinRate: l.MinRate, State: st,
			For: policyDuration(ps, path+".for", l.For, 0, maxPenalty)})
	}
	return r
}

func (p placementDoc) rules(ps *Problems) PlacementPolicy {
	const f = "placement."
	r := PlacementPolicy{
		BandDwell:              policyDuration(ps, f+"band_dwell", p.BandDwell, time.Second, maxPlacementDwell),
		LivenessWindow:         policyDuration(ps, f+"liveness_window", p.LivenessWindow, time.Second, maxLiveness),
		LivenessHoldPermille:   policyFraction(ps, f+"liveness_hold_share", p.LivenessHoldShare, 1e3),
		LivenessHoldMinWorkers: int(policyCount(ps, f+"liveness_hold_min_workers", p.LivenessHoldMinWorkers, maxPolicyCount)),
		LivenessHoldMax:        policyDuration(ps, f+"liveness_hold_max", p.LivenessHoldMax, 0, maxPlacementDwell),
		TierDwell:              policyDuration(ps, f+"tier_dwell", p.TierDwell, 0, maxHoldOrDwell),
		WorkerRetention:        policyDuration(ps, f+"worker_retention", p.WorkerRetention, time.Minute, MaxWorkerRetentionSeconds*time.Second),
		MaxForgetPerTick:       int(policyCount(ps, f+"max_forget_per_tick", p.MaxForgetPerTick, maxPolicyCount)),
		WorkerHealthMinSends:   policyCount(ps, f+"worker_health_min_sends", p.WorkerHealthMinSends, maxMinSends),
		ComplaintPPM:           p.WorkerComplaintRates.ppm(ps, f+"worker_complaint_rates"),
		HardBouncePPM:          p.WorkerHardBounceRates.ppm(ps, f+"worker_hard_bounce_rates"),
	}
	// As the engine's settings have it (internal/roles, placementFlags).
	if r.LivenessHoldMax > 0 && r.LivenessHoldMax < time.Minute {
		ps.Add(f+"liveness_hold_max", CodeOutOfRange, "must be 0s (no bound) or at least 1m")
	}
	if r.LivenessWindow > 0 && r.WorkerRetention > 0 && r.WorkerRetention < r.LivenessWindow {
		ps.Add(f+"worker_retention", CodeOutOfRange, "must be at least the liveness window")
	}
	return r
}

func (r ratesDoc) ppm(ps *Problems, path string) [4]int64 {
	names := [4]string{"watch", "throttled", "quarantined", "blocked"}
	vals := [4]float64{r.Watch, r.Throttled, r.Quarantined, r.Blocked}
	var out [4]int64
	for i, v := range vals {
		out[i] = policyFraction(ps, path+"."+names[i], v, 1e6)
		if i > 0 && out[i] > 0 && out[i-1] > 0 && out[i] <= out[i-1] {
			ps.Add(path+"."+names[i], CodeInvalid, "must be above %s: rates strictly ascending", names[i-1])
		}
	}
	return out
}

// policyDuration parses a duration, a whole number of one unit (h, m or
// s, as "168h"), in [min, max].
func policyDuration(ps *Problems, field, s string, min, max time.Duration) time.Duration {
	if !checkText(ps, field, s, true, maxPolicyDuration) {
		return 0
	}
	d, ok := parsePolicyDuration(s)
	switch {
	case !ok:
		ps.Add(field, CodeInvalid, "must be a whole number of hours, minutes or seconds such as 168h, 10m or 30s")
	case d < min || d > max:
		ps.Add(field, CodeOutOfRange, "must be between %s and %s", FormatPolicyDuration(min), FormatPolicyDuration(max))
	default:
		return d
	}
	return 0
}

// parsePolicyDuration reads the schema's pattern ^(0|[1-9][0-9]{0,9})[hms]$.
func parsePolicyDuration(s string) (time.Duration, bool) {
	if len(s) < 2 || len(s) > 11 {
		return 0, false
	}
	digits, unit := s[:len(s)-1], time.Second
	switch s[len(s)-1] {
	case 'h':
		unit = time.Hour
	case 'm':
		unit = time.Minute
	case 's':
	default:
		return 0, false
	}
	if !hasDigitsOnly(digits) || (digits[0] == '0' && digits != "0") {
		return 0, false
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return 0, false
	}
	if n > int64(math.MaxInt64/unit) {
		return math.MaxInt64, true // out of every range
	}
	return time.Duration(n) * unit, true
}

// policyCount checks a count in [1, max].
func policyCount(ps *Problems, field string, v, max int64) int64 {
	if v < 1 || v > max {
		ps.Add(field, CodeOutOfRange, "must be between 1 and %d", max)
		return 0
	}
	return v
}

// policyFraction checks a fraction in (0, 1] that is a whole number of
// 1/per and returns that number.
func policyFraction(ps *Problems, field string, v, per float64) int64 {
	if !(v > 0 && v <= 1) {
		ps.Add(field, CodeOutOfRange, "must be a fraction in (0, 1]")
		return 0
	}
	n := math.Round(v * per)
	if math.Abs(v*per-n) > 1e-6 || n < 1 {
		ps.Add(field, CodeInvalid, "must be a whole number of 1/%g", per)
		return 0
	}
	return int64(n)
}
