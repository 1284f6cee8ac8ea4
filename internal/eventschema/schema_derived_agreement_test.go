package eventschema_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/domain/schemas/derived"
	"github.com/mailplane/mailplane/internal/eventschema"
)

// The derived schemas against the Go readers of the same records. Samples
// are generated from each schema (every property left out, set to null, to
// each JSON type, to each enum value, to each bound and past it, ...) and
// run through the schema and through the Go reader (DecodePlacementDecision,
// DecodeMailboxStateRecord, DecodeSyncTierRecord, json.Unmarshal for the
// sync audit records, which have no validation).
//
// Two directions are checked:
//
//   - what the schema accepts the Go reader accepts, except where a Go rule
//     spans fields or values JSON Schema cannot express (derivedGoStricter);
//   - what the Go reader of a decision or a mailbox.state record accepts the
//     schema accepts, except where the reader is lenient on purpose
//     (derivedSchemaStricter). The sync readers validate almost nothing, so
//     their schemas are stricter by design and this direction is not
//     checked for them.
//
// Every allowance must be used by some sample, so none outlives its cause.

const (
	dvW  = "00000001-0000-4000-8000-000000000001"
	dvW2 = "00000001-0000-4000-8000-000000000002"
	dvM  = "00000002-0000-4000-8000-000000000001"
	dvO  = "00000003-0000-4000-8000-000000000001"
	dvU  = "00000004-0000-4000-8000-000000000001"
	dvT  = "2026-03-01T12:00:00Z"
	// dvEvidence is a health score's evidence, as band_changed, migrated
	// and refused carry it.
	dvEvidence = `"evidence":{"window_seconds":604800,"window_end":"` + dvT + `","inbox":90,"junk":10,"min_observations":20,"rate":0.1,"rule":"level",` +
		`"threshold":{"rate":0.1,"state":"watch"}}`
	dvE = "0190a5b2-4c5e-7b1a-9c3d-000000000001"
)

// derivedValidData is one valid data object per derived record type.
var derivedValidData = map[string]string{
	domain.TypePlacementWorkerRegistered: `{"at":"` + dvT + `","reason":"worker_registered","worker_id":"` + dvW + `","tier":"shared_free","egress":"cold_smtp","address":"10.0.0.1:25","stopping":false,"capacity":4}`,
	domain.TypePlacementWorkerChanged: `{"at":"` + dvT + `","reason":"heartbeat","worker_id":"` + dvW + `","tier":"shared_premium","egress":"oauth_api","address":"10.0.0.1:25","stopping":true,"capacity":400,` +
		`"tier_held_until":"2026-03-01T12:05:00Z"}`,
	domain.TypePlacementWorkerHealthChanged: `{"at":"` + dvT + `","reason":"health_sampled","worker_id":"` + dvW + `","from_health":"healthy","health":"throttled",` +
		`"capacity":200,"window_seconds":3600,"sends":1000,"hard_bounces":0,"complaints":4}`,
	domain.TypePlacementWorkerDied:      `{"at":"` + dvT + `","reason":"heartbeat_expired","worker_id":"` + dvW + `","last_seen":"2026-03-01T11:59:29.5Z"}`,
	domain.TypePlacementWorkerForgotten: `{"at":"` + dvT + `","reason":"retention_expired","worker_id":"` + dvW + `","last_seen":"2026-02-22T11:59:29.5Z","retention_seconds":604800}`,
	domain.TypePlacementWorkerPromoted: `{"at":"` + dvT + `","reason":"dedicated_needed","worker_id":"` + dvW + `","from_tier":"shared_premium","to_tier":"dedicated",` +
		`"from_pool":"clean","to_pool":"clean","org_id":"` + dvO + `"}`,
	domain.TypePlacementWorkerReverted: `{"at":"` + dvT + `","reason":"idle","worker_id":"` + dvW + `","from_tier":"dedicated","to_tier":"shared_premium",` +
		`"from_pool":"clean","to_pool":"clean","org_id":"` + dvO + `"}`,
	domain.TypePlacementDedicatedBound:    `{"at":"` + dvT + `","reason":"dedicated_needed","worker_id":"` + dvW + `","org_id":"` + dvO + `"}`,
	domain.TypePlacementDedicatedReleased: `{"at":"` + dvT + `","reason":"plan_changed","worker_id":"` + dvW + `","org_id":"` + dvO + `"}`,
	domain.TypePlacementPlanRecorded:      `{"at":"` + dvT + `","reason":"plan_changed","org_id":"` + dvO + `","plan":"dedicated","dedicated_workers":2,"paid":true,"source":"billing:evt_1"}`,
	domain.TypePlacementAssigned: `{"at":"` + dvT + `","reason":"mailbox_added","mailbox_id":"` + dvM + `","org_id":"` + dvO + `","worker_id":"` + dvW + `",` +
		`"tier":"shared_premium","band":"clean","weight_milli":50,"degraded":true}`,
	domain.TypePlacementRefused: `{"at":"` + dvT + `","reason":"no_eligible_worker","mailbox_id":"` + dvM + `","org_id":"` + dvO + `","tier":"shared_free",` +
		`"band":"quarantine","weight_milli":1000,"from_worker":"` + dvW + `","from_band":"clean","cause":"band_changed",` + dvEvidence + `}`,
	domain.TypePlacementMigrated: `{"at":"` + dvT + `","reason":"worker_died","mailbox_id":"` + dvM + `","org_id":"` + dvO + `","weight_milli":400,` +
		`"from_worker":"` + dvW + `","to_worker":"` + dvW2 + `","from_tier":"shared_free","to_tier":"shared_free","from_band":"risky","to_band":"risky","degraded":false,` + dvEvidence + `}`,
	domain.TypePlacementUnassigned: `{"at":"` + dvT + `","reason":"mailbox_removed","mailbox_id":"` + dvM + `","org_id":"` + dvO + `","worker_id":"` + dvW + `",` +
		`"band":"risky","weight_milli":1000,"detail":"closed by the user"}`,
	domain.TypePlacementBandChanged: `{"at":"` + dvT + `","reason":"band_worsened","mailbox_id":"` + dvM + `","org_id":"` + dvO + `","from_band":"clean","to_band":"risky","health":"watch","score":62.5,` +
		dvEvidence + `}`,
	domain.TypePlacementBandHeld: `{"at":"` + dvT + `","reason":"band_recovery_started","mailbox_id":"` + dvM + `","band":"risky","candidate":"clean",` +
		`"since":"2026-03-01T11:00:00Z","health":"healthy"}`,
	domain.TypePlacementLivenessHeld: `{"at":"` + dvT + `","reason":"fleet_silent","scope":"fleet","silent_workers":9,"live_workers":9,` +
		`"share_permille":1000,"threshold_permille":550,"min_workers":3}`,
	domain.TypePlacementLivenessResumed: `{"at":"` + dvT + `","reason":"heartbeats_resumed","scope":"fleet","silent_workers":1,"live_workers":9,` +
		`"share_permille":111,"threshold_permille":550,"held_since":"2026-03-01T11:58:00Z"}`,
	domain.TypeMailboxStateRecord: `{"mailbox_id":"` + dvM + `","org_id":"` + dvO + `","user_id":"` + dvU + `","address":"ada@example.com","provider":"smtp_imap",` +
		`"warmup_enabled":true,"imap":{"host":"imap.example.com","port":993,"tls":"implicit","username":"ada@example.com"},` +
		`"sealed_credentials":{"key_id":"k1","alg":"A256GCM","nonce":"AAECAwQFBgcICQoL","ciphertext":"c2VhbGVk"},` +
		`"enabled":true,"added_at":"` + dvT + `","source_event_id":"` + dvE + `"}`,
	domain.TypeSyncTierRecord:         `{"mailbox_id":"` + dvM + `","tier":"hot","reason":"session","partition":3,"epoch":7,"owner":"sync-1","changed_at":"` + dvT + `"}`,
	domain.TypeSyncOwnershipAcquired:  `{"partition":3,"epoch":7,"owner":"sync-1","at":"` + dvT + `"}`,
	domain.TypeSyncOwnershipLost:      `{"partition":3,"epoch":7,"owner":"sync-1","reason":"revoked","runners":12,"at":"` + dvT + `"}`,
	domain.TypeSyncOwnershipSuspended: `{"partition":3,"epoch":7,"owner":"sync-1","reason":"watchdog","runners":12,"at":"` + dvT + `"}`,
	domain.TypeSyncTierChanged:        `{"mailbox_id":"` + dvM + `","from":"warm","to":"hot","reason":"session","partition":3,"epoch":7,"owner":"sync-1","at":"` + dvT + `"}`,
	domain.TypeSyncFailed:             `{"mailbox_id":"` + dvM + `","partition":3,"epoch":7,"owner":"sync-1","error":"imapsync: connect: connect: no IMAP server answered","category":"connect","attempt":2,"at":"` + dvT + `"}`,
	domain.TypeOpsAction: `{"at":"` + dvT + `","actor":"ops@host-1","actor_kind":"os_user","action":"projector_seek","outcome":"failed","code":"unavailable",` +
		`"detail":"broker unreachable","params":{"target":"health","to":"2026-03-01T00:00:00Z","filter":"partition=3","count":1,"dry_run":true,` +
		`"added":"ada,bob","removed":"eve","changed":"carol"}}`,
}

// derivedSample is one generated sample: kind says what was done to which
// path of the valid data.
type derivedSample struct {
	kind, path, name, data string
}

// derivedEdit returns base with the value at a dotted path replaced or,
// when del, removed.
func derivedEdit(base, path string, v any, del bool) string {
	var m map[string]any
	dec := json.NewDecoder(strings.NewReader(base))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		panic(err)
	}
	keys := strings.Split(path, ".")
	obj := m
	for _, k := range keys[:len(keys)-1] {
		obj = obj[k].(map[string]any)
	}
	if del {
		delete(obj, keys[len(keys)-1])
	} else {
		obj[keys[len(keys)-1]] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func derivedGenerate(typ string, schema map[string]any) []derivedSample {
	base := derivedValidData[typ]
	var out []derivedSample
	add := func(kind, path string, v any) {
		out = append(out, derivedSample{kind, path, fmt.Sprintf("%s %s %v", path, kind, v), derivedEdit(base, path, v, false)})
	}
	var walk func(prefix string, n map[string]any)
	walk = func(prefix string, n map[string]any) {
		props, _ := n["properties"].(map[string]any)
		names := make([]string, 0, len(props))
		for name := range props {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			p := props[name].(map[string]any)
			path := prefix + name
			out = append(out, derivedSample{"without", path, path + " without", derivedEdit(base, path, nil, true)})
			add("null", path, nil)
			add("string", path, "x")
			add("empty", path, "")
			add("integer", path, 7)
			add("fraction", path, 7.5)
			add("boolean", path, true)
			add("object", path, map[string]any{})
			add("array", path, []any{})
			if enum, ok := p["enum"].([]any); ok {
				for _, e := range enum {
					add("enum", path, e)
					if s, ok := e.(string); ok {
						add("enum upper", path, strings.ToUpper(s))
					}
				}
			}
			for _, k := range []string{"minimum", "maximum"} {
				b, ok := p[k].(json.Number)
				if !ok {
					continue
				}
				n, ok := new(big.Int).SetString(b.String(), 10)
				if !ok {
					panic(path + ": a bound that is not an integer")
				}
				for _, d := range []int64{-1, 0, 1} {
					add("bound", path, json.Number(new(big.Int).Add(n, big.NewInt(d)).String()))
				}
				if p["type"] == "number" {
					f, _ := b.Float64()
					add("bound", path, f-0.001)
					add("bound", path, f+0.001)
				}
			}
			if p["type"] == "string" {
				for _, c := range hostileRunes {
					for _, v := range hostileVariants(schemaValueAt(base, path), c) {
						add("hostile", path, v)
					}
				}
			}
			if ml, ok := p["maxLength"].(json.Number); ok && (p["pattern"] == nil || p["pattern"] == domain.TextPattern) {
				l, _ := ml.Int64()
				for _, c := range []string{"x", "é", "😀"} {
					add("length", path, strings.Repeat(c, int(l)))
					add("length", path, strings.Repeat(c, int(l)+1))
				}
			}
			switch {
			case p["format"] == "date-time":
				for _, ts := range []string{"2026-03-01T12:00:00.123456789+02:00", "2026-03-01T12:00:00-00:30", "9999-12-31T23:59:59Z",
					"2026-03-01t12:00:00Z", "2026-03-01T12:00:00z", "2026-03-01 12:00:00Z", "2026-03-01T12:00Z", "2026-02-30T12:00:00Z",
					"2026-03-01T24:00:00Z", "2026-03-01T12:00:00+0200", "2026-03-01T12:00:00.Z", "2026-03-01"} {
					add("time", path, ts)
				}
				add("zero time", path, "0001-01-01T00:00:00Z")
			case p["pattern"] != nil && strings.Contains(p["pattern"].(string), "{12}$"):
				add("uuid", path, strings.ToUpper(dvM))
				add("uuid", path, "0190a5b2-4c5e-4b1a-9c3d-00000000c001")
				add("uuid", path, "{"+dvM+"}")
				add("uuid", path, dvM[:35])
			}
			if p["type"] == "object" {
				add("extra", path+".extra", 1)
				walk(path+".", p)
			}
		}
	}
	walk("", schema)
	add("extra", "extra", 1)
	add("extra", "Extra", "x")
	out = append(out,
		derivedSample{"trailing", "", "trailing data", base + ` {}`},
		derivedSample{"shape", "", "null data", `null`},
		derivedSample{"shape", "", "array data", `[]`},
		derivedSample{"shape", "", "empty object", `{}`},
		derivedSample{"shape", "", "truncated", base[:len(base)/2]},
	)
	return out
}

// derivedGoAccepts runs data through the Go reader of typ's records.
func derivedGoAccepts(typ, data string) error {
	key := func() []byte {
		var m map[string]any
		if json.Unmarshal([]byte(data), &m) == nil {
			if id, ok := m["mailbox_id"].(string); ok && id != "" {
				return []byte(id)
			}
		}
		return []byte(dvM)
	}
	switch typ {
	case domain.TypeMailboxStateRecord:
		_, live, err := domain.DecodeMailboxStateRecord(typ, key(), []byte(data))
		if err == nil && !live {
			err = fmt.Errorf("read as a tombstone")
		}
		return err
	case domain.TypeSyncTierRecord:
		_, ok, err := domain.DecodeSyncTierRecord(typ, key(), []byte(data))
		if err == nil && !ok {
			err = fmt.Errorf("read as a tombstone")
		}
		return err
	}
	if slices.Contains(domain.PlacementDecisionTypes(), typ) {
		_, err := domain.DecodePlacementDecision(typ, []byte(data))
		return err
	}
	d, ok := domain.NewRecord(typ)
	if !ok {
		return fmt.Errorf("no Go type for %s", typ)
	}
	if err := json.Unmarshal([]byte(data), d); err != nil {
		return err
	}
	return d.Validate().Err()
}

// derivedGoValidates reports whether the Go side validates typ's records
// beyond their JSON shape, so that the schema must not be stricter.
func derivedGoValidates(typ string) bool {
	return slices.Contains(domain.PlacementDecisionTypes(), typ) || typ == domain.TypeMailboxStateRecord
}

// derivedGoStricter: the schema accepts, the Go reader refuses. Each is a
// Go rule JSON Schema cannot express.
var derivedGoStricter = map[string]func(typ string, s derivedSample) bool{
	"a decision's, a state record's and an operator audit record's times are never the zero time (the schema checks the format only)": func(typ string, s derivedSample) bool {
		return s.kind == "zero time" && (derivedGoValidates(typ) || typ == domain.TypeOpsAction)
	},
	"band_changed: to_band differs from from_band": func(typ string, s derivedSample) bool {
		return typ == domain.TypePlacementBandChanged && s.kind == "enum" &&
			(s.path == "to_band" && strings.Contains(s.data, `"to_band":"clean"`) || s.path == "from_band" && strings.Contains(s.data, `"from_band":"risky"`))
	},
	"migrated: to_worker differs from from_worker": func(typ string, s derivedSample) bool {
		return typ == domain.TypePlacementMigrated && s.kind == "same worker"
	},
	"liveness: silent_workers is at most live_workers and share_permille is their ratio": func(typ string, s derivedSample) bool {
		return (typ == domain.TypePlacementLivenessHeld || typ == domain.TypePlacementLivenessResumed) &&
			slices.Contains([]string{"silent_workers", "live_workers", "share_permille"}, s.path)
	},
	"liveness_resumed: held_since is not after at": func(typ string, s derivedSample) bool {
		return typ == domain.TypePlacementLivenessResumed && (s.path == "held_since" || s.path == "at") && s.kind == "time"
	},
	"worker_changed: tier_held_until is not before at": func(typ string, s derivedSample) bool {
		return typ == domain.TypePlacementWorkerChanged && (s.path == "tier_held_until" || s.path == "at") && s.kind == "time"
	},
}

// derivedSchemaStricter: the Go reader accepts, the schema refuses. Each is
// leniency of the reader that the writer never relies on.
var derivedSchemaStricter = map[string]func(typ string, s derivedSample, goRequires bool) bool{
	"the readers decode leniently: null reads as absent": func(typ string, s derivedSample, goRequires bool) bool {
		return s.kind == "null" && !goRequires
	},
	"the readers tolerate unknown fields (a newer writer may add some) and match names case-insensitively": func(typ string, s derivedSample, _ bool) bool {
		return s.kind == "extra"
	},
	"the readers take an explicit empty string for an optional field the writer omits when empty": func(typ string, s derivedSample, goRequires bool) bool {
		return s.kind == "empty" && !goRequires && slices.Contains([]string{"org_id", "from_worker", "worker_id", "detail", "candidate"}, s.path)
	},
	"the readers decode the first JSON value and ignore what follows": func(typ string, s derivedSample, _ bool) bool {
		return s.kind == "trailing"
	},
	"band_changed: Go does not range-check score (it comes from a validated health_scored, 0 to 100)": func(typ string, s derivedSample, _ bool) bool {
		return typ == domain.TypePlacementBandChanged && s.path == "score"
	},
	"the decision-log readers read free text written before the text rule with CleanText (the log cannot skip a record); the engine writes none": func(typ string, s derivedSample, _ bool) bool {
		return s.kind == "hostile" && slices.Contains(domain.PlacementDecisionTypes(), typ) && slices.Contains([]string{"address", "source", "detail"}, s.path)
	},
	"mailbox.state: Go does not check source_event_id (the processor copies a validated ce_id)": func(typ string, s derivedSample, _ bool) bool {
		return typ == domain.TypeMailboxStateRecord && s.path == "source_event_id"
	},
}

func TestDerivedValidDataIsValid(t *testing.T) {
	t.Parallel()
	v := eventschema.Derived()
	for _, typ := range derived.Types() {
		d, ok := derivedValidData[typ]
		if !ok {
			t.Errorf("%s has no valid sample", typ)
			continue
		}
		if err := derivedGoAccepts(typ, d); err != nil {
			t.Errorf("%s: Go refuses the valid data: %v", typ, err)
		}
		if ps := v.Validate(typ, []byte(d)); len(ps) > 0 {
			t.Errorf("%s: schema refuses the valid data: %s", typ, ps)
		}
	}
}

func TestDerivedSchemaAgreesWithGoReaders(t *testing.T) {
	t.Parallel()
	v := eventschema.Derived()
	used := map[string]int{}
	checked := 0
	for _, typ := range derived.Types() {
		samples := derivedGenerate(typ, derivedSchemaDoc(t, typ))
		if typ == domain.TypePlacementMigrated {
			samples = append(samples, derivedSample{"same worker", "to_worker", "to_worker = from_worker",
				derivedEdit(derivedValidData[typ], "to_worker", dvW, false)})
		}
		for _, s := range samples {
			checked++
			goErr := derivedGoAccepts(typ, s.data)
			sps := v.Validate(typ, []byte(s.data))
			switch {
			case len(sps) == 0 && goErr != nil:
				if reason := derivedAllowed(derivedGoStricter, func(f func(string, derivedSample) bool) bool { return f(typ, s) }); reason != "" {
					used[reason]++
					continue
				}
				t.Errorf("%s: the schema accepts what Go refuses: %s\n  data: %.300s\n  go:   %v", typ, s.name, s.data, goErr)
			case len(sps) > 0 && goErr == nil && derivedGoValidates(typ):
				goRequires := s.path != "" && derivedGoAccepts(typ, derivedEdit(derivedValidData[typ], s.path, nil, true)) != nil
				if reason := derivedAllowed(derivedSchemaStricter, func(f func(string, derivedSample, bool) bool) bool { return f(typ, s, goRequires) }); reason != "" {
					used[reason]++
					continue
				}
				t.Errorf("%s: Go accepts what the schema refuses: %s\n  data:   %.300s\n  schema: %s", typ, s.name, s.data, sps)
			}
			for _, p := range sps {
				if p.Code != domain.CodeSchema && p.Code != domain.CodeMalformedJSON && p.Code != domain.CodeRequired {
					t.Errorf("%s: %s: schema problem with code %s: %s", typ, s.name, p.Code, p)
				}
			}
		}
	}
	for reason := range derivedGoStricter {
		if used[reason] == 0 {
			t.Errorf("allowance never used (remove it): %s", reason)
		}
	}
	for reason := range derivedSchemaStricter {
		if used[reason] == 0 {
			t.Errorf("allowance never used (remove it): %s", reason)
		}
	}
	t.Logf("%d samples; known disagreements: %v", checked, used)
}

func derivedAllowed[F any](table map[string]F, match func(F) bool) string {
	reasons := make([]string, 0, len(table))
	for r := range table {
		reasons = append(reasons, r)
	}
	slices.Sort(reasons)
	for _, r := range reasons {
		if match(table[r]) {
			return r
		}
	}
	return ""
}

// TestDerivedRequiredMirrorsGo: for the records Go validates, a field is
// required by the schema exactly when the Go reader refuses its absence.
func TestDerivedRequiredMirrorsGo(t *testing.T) {
	t.Parallel()
	for _, typ := range derived.Types() {
		if !derivedGoValidates(typ) {
			continue
		}
		var walk func(prefix string, n map[string]any)
		walk = func(prefix string, n map[string]any) {
			props, _ := n["properties"].(map[string]any)
			required := stringList(n["required"])
			for name, p := range props {
				path := prefix + name
				goRequires := derivedGoAccepts(typ, derivedEdit(derivedValidData[typ], path, nil, true)) != nil
				dependent := false
				if dr, ok := n["dependentRequired"].(map[string]any); ok {
					for _, v := range dr {
						dependent = dependent || slices.Contains(stringList(v), name)
					}
				}
				if r := slices.Contains(required, name); r != goRequires && !(dependent && goRequires) {
					t.Errorf("%s: %s: required in schema = %v, Go refuses its absence = %v", typ, path, r, goRequires)
				}
				if pm := p.(map[string]any); pm["type"] == "object" {
					walk(path+".", pm)
				}
			}
		}
		walk("", derivedSchemaDoc(t, typ))
	}
	// The decoded valid samples carry every property their schema names, so
	// the required checks above ran on each.
	for _, typ := range derived.Types() {
		var m map[string]any
		if err := json.NewDecoder(bytes.NewReader([]byte(derivedValidData[typ]))).Decode(&m); err != nil {
			t.Fatal(err)
		}
		for name := range derivedSchemaDoc(t, typ)["properties"].(map[string]any) {
			if _, ok := m[name]; !ok {
				t.Errorf("%s: the valid sample lacks %s", typ, name)
			}
		}
	}
}
