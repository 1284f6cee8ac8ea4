package eventschema_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/domain/schemas/derived"
	"github.com/mailplane/mailplane/internal/eventschema"
)

const (
	dW  = "0190a5b2-4c5e-7b1a-9c3d-00000000d001"
	dW2 = "0190a5b2-4c5e-7b1a-9c3d-00000000d002"
	dM  = "0190a5b2-4c5e-7b1a-9c3d-00000000c001"
	dO  = "0190a5b2-4c5e-7b1a-9c3d-00000000a001"
	dU  = "0190a5b2-4c5e-7b1a-9c3d-00000000b001"
	dT  = "2026-03-01T12:00:00Z"
)

// derivedValid is one valid data object per derived record type.
var derivedValid = map[string]string{
	domain.TypePlacementWorkerRegistered:    `{"at":"` + dT + `","reason":"worker_registered","worker_id":"` + dW + `","tier":"shared_free","egress":"cold_smtp","address":"10.0.0.1:25","stopping":false,"capacity":4}`,
	domain.TypePlacementWorkerChanged:       `{"at":"` + dT + `","reason":"worker_revived","worker_id":"` + dW + `","tier":"shared_premium","egress":"warmup_only","address":"","stopping":false,"capacity":6}`,
	domain.TypePlacementWorkerHealthChanged: `{"at":"` + dT + `","reason":"health_sampled","worker_id":"` + dW + `","from_health":"healthy","health":"blocked","capacity":1,"window_seconds":3600,"sends":1000,"hard_bounces":200,"complaints":4}`,
	domain.TypePlacementWorkerDied:          `{"at":"` + dT + `","reason":"heartbeat_expired","worker_id":"` + dW + `","last_seen":"2026-03-01T11:59:29.5Z"}`,
	domain.TypePlacementWorkerForgotten:     `{"at":"` + dT + `","reason":"retention_expired","worker_id":"` + dW + `","last_seen":"2026-02-22T11:59:29.5Z","retention_seconds":604800}`,
	domain.TypePlacementWorkerPromoted:      `{"at":"` + dT + `","reason":"pool_needed","worker_id":"` + dW + `","from_tier":"shared_free","to_tier":"shared_free","from_pool":"clean","to_pool":"risky"}`,
	domain.TypePlacementWorkerReverted:      `{"at":"` + dT + `","reason":"idle","worker_id":"` + dW + `","from_tier":"dedicated","to_tier":"shared_premium","from_pool":"clean","to_pool":"clean","org_id":"` + dO + `"}`,
	domain.TypePlacementDedicatedBound:      `{"at":"` + dT + `","reason":"dedicated_needed","worker_id":"` + dW + `","org_id":"` + dO + `"}`,
	domain.TypePlacementDedicatedReleased:   `{"at":"` + dT + `","reason":"worker_died","worker_id":"` + dW + `","org_id":"` + dO + `"}`,
	domain.TypePlacementPlanRecorded:        `{"at":"` + dT + `","reason":"plan_changed","org_id":"` + dO + `","plan":"premium","dedicated_workers":0,"paid":true,"source":"billing:evt_1"}`,
	domain.TypePlacementAssigned:            `{"at":"` + dT + `","reason":"retry","mailbox_id":"` + dM + `","org_id":"` + dO + `","worker_id":"` + dW + `","tier":"dedicated","band":"quarantine","weight_milli":400,"degraded":false}`,
	domain.TypePlacementRefused:             `{"at":"` + dT + `","reason":"no_eligible_worker","mailbox_id":"` + dM + `","org_id":"` + dO + `","tier":"shared_free","band":"clean","weight_milli":1000,"cause":"mailbox_added"}`,
	domain.TypePlacementMigrated:            `{"at":"` + dT + `","reason":"worker_stopping","mailbox_id":"` + dM + `","org_id":"` + dO + `","weight_milli":50,"from_worker":"` + dW + `","to_worker":"` + dW2 + `","from_tier":"dedicated","to_tier":"shared_premium","from_band":"clean","to_band":"clean","degraded":true}`,
	domain.TypePlacementUnassigned:          `{"at":"` + dT + `","reason":"mailbox_removed","mailbox_id":"` + dM + `","org_id":"` + dO + `","band":"clean","weight_milli":1000}`,
	domain.TypePlacementBandChanged:         `{"at":"` + dT + `","reason":"band_improved","mailbox_id":"` + dM + `","org_id":"` + dO + `","from_band":"quarantine","to_band":"risky","health":"throttled","score":40}`,
	domain.TypePlacementBandHeld:            `{"at":"` + dT + `","reason":"band_recovery_cancelled","mailbox_id":"` + dM + `","band":"risky","health":"watch"}`,
	domain.TypePlacementLivenessHeld:        `{"at":"` + dT + `","reason":"fleet_silent","scope":"fleet","silent_workers":2,"live_workers":3,"share_permille":666,"threshold_permille":500,"min_workers":3}`,
	domain.TypePlacementLivenessResumed:     `{"at":"` + dT + `","reason":"heartbeats_resumed","scope":"fleet","silent_workers":0,"live_workers":3,"share_permille":0,"threshold_permille":500,"held_since":"` + dT + `"}`,
	domain.TypeMailboxStateRecord: `{"mailbox_id":"` + dM + `","org_id":"` + dO + `","user_id":"` + dU + `","address":"ada@example.com","provider":"gmail","warmup_enabled":false,` +
		`"imap":{"host":"imap.gmail.com","port":993,"tls":"implicit","username":"ada@example.com"},` +
		`"sealed_credentials":{"key_id":"k1","alg":"A256GCM","nonce":"AAECAwQFBgcICQoL","ciphertext":"c2VhbGVk"},"enabled":true,"added_at":"` + dT + `","source_event_id":"` + dW + `"}`,
	domain.TypeSyncTierRecord:         `{"mailbox_id":"` + dM + `","tier":"cold","reason":"inactive","partition":0,"epoch":1,"owner":"host-1-0123456789ab","changed_at":"` + dT + `"}`,
	domain.TypeSyncOwnershipAcquired:  `{"partition":255,"epoch":12,"owner":"host-1-0123456789ab","at":"` + dT + `"}`,
	domain.TypeSyncOwnershipLost:      `{"partition":255,"epoch":12,"owner":"host-1-0123456789ab","reason":"lost","runners":0,"at":"` + dT + `"}`,
	domain.TypeSyncOwnershipSuspended: `{"partition":255,"epoch":12,"owner":"host-1-0123456789ab","reason":"fenced","runners":40,"at":"` + dT + `"}`,
	domain.TypeSyncTierChanged:        `{"mailbox_id":"` + dM + `","from":"hot","to":"warm","reason":"hot_budget","partition":1,"epoch":3,"owner":"host-1-0123456789ab","at":"` + dT + `"}`,
	domain.TypeSyncFailed:             `{"mailbox_id":"` + dM + `","partition":1,"epoch":3,"owner":"host-1-0123456789ab","error":"imap: login failed","attempt":1,"at":"` + dT + `"}`,
	domain.TypeOpsAction: `{"at":"` + dT + `","actor":"ada","actor_kind":"caller","action":"dlq_redrive","outcome":"refused","code":"not_redrivable",` +
		`"detail":"the consumer is not redrivable","params":{"target":"placement-engine","filter":"offset=7","count":2}}`,
}

// set returns data with field (top level, or "a.b") set to the JSON literal
// v, or removed when v is "".
func set(data, field, v string) string {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(data), &m); err != nil {
		panic(err)
	}
	if outer, inner, ok := strings.Cut(field, "."); ok {
		m[outer] = json.RawMessage(set(string(m[outer]), inner, v))
	} else if v == "" {
		delete(m, field)
	} else {
		m[field] = json.RawMessage(v)
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestDerivedCompilesEveryType(t *testing.T) {
	t.Parallel()
	v, err := eventschema.NewDerived()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := v.Types(), derived.Types(); !slices.Equal(got, want) || len(got) != 26 {
		t.Errorf("types %v, want the %d of package derived", got, len(want))
	}
	if first, second := eventschema.Derived(), eventschema.Derived(); first != second {
		t.Error("Derived compiles more than once")
	}
	// The two validators stay apart: the domain one knows no derived type,
	// and the derived one no domain event type.
	for _, typ := range derived.Types() {
		if slices.Contains(eventschema.Default().Types(), typ) {
			t.Errorf("the domain event validator has %s", typ)
		}
	}
	if ps := eventschema.Default().Validate(domain.TypePlacementAssigned, []byte(derivedValid[domain.TypePlacementAssigned])); !ps.Has(domain.CodeUnknownType) {
		t.Errorf("domain validator on a decision: %s", ps)
	}
	if ps := eventschema.Derived().Validate(domain.TypeUserActive, []byte(`{}`)); !ps.Has(domain.CodeUnknownType) {
		t.Errorf("derived validator on a domain event: %s", ps)
	}
}

func TestDerivedValidate(t *testing.T) {
	t.Parallel()
	v := eventschema.Derived()
	refused := derivedValid[domain.TypePlacementRefused]
	held := derivedValid[domain.TypePlacementBandHeld]
	state := derivedValid[domain.TypeMailboxStateRecord]
	cases := []struct {
		name, typ, data string
		want            []string // "field code", sorted
	}{
		{"short decision type", "placement.refused", refused, nil},
		{"short state type", "mailbox.state", state, nil},
		{"short sync types", "sync.tier", derivedValid[domain.TypeSyncTierRecord], nil},
		{"short audit type", "sync.ownership_lost", derivedValid[domain.TypeSyncOwnershipLost], nil},
		{"unknown type", "mailplane.placement.nope.v1", refused, []string{"type unknown_type"}},
		{"empty type", "", refused, []string{"type unknown_type"}},
		{"empty data", domain.TypePlacementRefused, "  ", []string{"data required"}},
		{"malformed", domain.TypePlacementRefused, `{"at":`, []string{"data malformed_json"}},
		{"trailing data", domain.TypePlacementRefused, refused + ` {}`, []string{"data malformed_json"}},
		{"repeated name", domain.TypePlacementRefused, strings.Replace(refused, `"tier"`, `"band":"risky","tier"`, 1), []string{"data.band malformed_json"}},
		{"from_worker needs from_band", domain.TypePlacementRefused, set(refused, "from_worker", `"`+dW+`"`), []string{"data.from_band schema"}},
		{"from_worker with from_band", domain.TypePlacementRefused, set(set(refused, "from_worker", `"`+dW+`"`), "from_band", `"risky"`), nil},
		{"candidate needs since", domain.TypePlacementBandHeld, set(held, "candidate", `"clean"`), []string{"data.since schema"}},
		{"candidate with since", domain.TypePlacementBandHeld, set(set(held, "candidate", `"clean"`), "since", `"2026-03-01T11:00:00.5+01:00"`), nil},
		{"nested path", domain.TypeMailboxStateRecord, set(state, "imap.port", `0`), []string{"data.imap.port schema"}},
		{"nested additional", domain.TypeMailboxStateRecord, set(state, "sealed_credentials.password", `"x"`), []string{"data.sealed_credentials.password schema"}},
		{"plain credentials", domain.TypeMailboxStateRecord, set(state, "credentials", `{"password":"hunter2"}`), []string{"data.credentials schema"}},
		{"date-time asserted", domain.TypeSyncFailed, set(derivedValid[domain.TypeSyncFailed], "at", `"2026-02-29T00:00:00Z"`), []string{"data.at schema"}},
		{"every violation", domain.TypePlacementAssigned, `{"at":"x","reason":"because","mailbox_id":"` + strings.ToUpper(dM) + `","weight_milli":500,"degraded":"no"}`,
			[]string{"data.at schema", "data.band schema", "data.degraded schema", "data.mailbox_id schema", "data.org_id schema", "data.reason schema", "data.tier schema", "data.weight_milli schema", "data.worker_id schema"}},
	}
	for _, c := range cases {
		got := v.Validate(c.typ, []byte(c.data))
		var gotFC []string
		for _, p := range got {
			gotFC = append(gotFC, p.Field+" "+string(p.Code))
			if p.Message == "" {
				t.Errorf("%s: problem without a message: %+v", c.name, p)
			}
		}
		slices.Sort(gotFC)
		gotFC = slices.Compact(gotFC)
		if !slices.Equal(gotFC, c.want) {
			t.Errorf("%s: got %v (%s), want %v", c.name, gotFC, got, c.want)
		}
	}
}

// TestDerivedRejectsInvalid: for every type, its valid sample passes and a
// few invalid ones are refused with a problem at the field concerned.
func TestDerivedRejectsInvalid(t *testing.T) {
	t.Parallel()
	type bad struct{ field, value string } // value "" removes the field
	common := map[string][]bad{
		"decision": {{"at", ""}, {"at", `"2026-03-01 12:00:00"`}, {"reason", `"whim"`}, {"reason", `""`}, {"extra", `1`}},
		"sync":     {{"partition", `-1`}, {"epoch", `0`}, {"owner", `""`}, {"owner", `"` + strings.Repeat("o", 256) + `"`}, {"extra", `1`}},
	}
	perType := map[string][]bad{
		domain.TypePlacementWorkerRegistered:    {{"tier", `"dedicated"`}, {"capacity", `0`}, {"capacity", `2147483649`}, {"address", `"` + strings.Repeat("a", 256) + `"`}, {"worker_id", ""}},
		domain.TypePlacementWorkerChanged:       {{"egress", `"smtp"`}, {"stopping", `"yes"`}, {"capacity", ""}, {"tier", `""`}},
		domain.TypePlacementWorkerHealthChanged: {{"health", `"sick"`}, {"from_health", ""}, {"sends", `1099511627777`}, {"window_seconds", `2592001`}, {"complaints", `-1`}},
		domain.TypePlacementWorkerDied:          {{"last_seen", ""}, {"last_seen", `"yesterday"`}, {"worker_id", `"` + strings.ToUpper(dW) + `"`}},
		domain.TypePlacementWorkerForgotten:     {{"last_seen", ""}, {"retention_seconds", `0`}, {"retention_seconds", `1.5`}, {"retention_seconds", ""}, {"worker_id", `"w-1"`}},
		domain.TypePlacementWorkerPromoted:      {{"to_pool", `"dirty"`}, {"from_tier", ""}, {"org_id", `""`}, {"to_tier", `"premium"`}},
		domain.TypePlacementWorkerReverted:      {{"to_tier", `"dedicated"`}, {"to_pool", ""}, {"org_id", `"org-1"`}},
		domain.TypePlacementDedicatedBound:      {{"org_id", ""}, {"org_id", `null`}, {"worker_id", `7`}},
		domain.TypePlacementDedicatedReleased:   {{"org_id", ""}, {"worker_id", `"` + dW[:35] + `"`}, {"org_id", `"{` + dO + `}"`}},
		domain.TypePlacementPlanRecorded:        {{"plan", `"gold"`}, {"dedicated_workers", `1001`}, {"source", `"` + strings.Repeat("s", 201) + `"`}, {"paid", `1`}},
		domain.TypePlacementAssigned:            {{"weight_milli", `1`}, {"weight_milli", `1000.5`}, {"band", `"clean "`}, {"worker_id", ""}},
		domain.TypePlacementRefused:             {{"cause", ""}, {"cause", `"because"`}, {"from_worker", `""`}, {"tier", `"any"`}},
		domain.TypePlacementMigrated:            {{"to_worker", ""}, {"from_band", `"CLEAN"`}, {"degraded", `null`}, {"to_tier", `["dedicated"]`}},
		domain.TypePlacementUnassigned:          {{"worker_id", `""`}, {"detail", `""`}, {"detail", `"` + strings.Repeat("d", 501) + `"`}, {"weight_milli", ""}},
		domain.TypePlacementBandChanged:         {{"score", `100.5`}, {"score", `-0.5`}, {"health", ""}, {"to_band", `"worse"`}},
		domain.TypePlacementBandHeld:            {{"candidate", `""`}, {"since", `"2026-03-01"`}, {"band", ""}},
		domain.TypePlacementLivenessHeld:        {{"scope", `"zone"`}, {"live_workers", `0`}, {"share_permille", `1001`}, {"min_workers", ""}},
		domain.TypePlacementLivenessResumed:     {{"held_since", ""}, {"threshold_permille", `0`}, {"silent_workers", `-1`}, {"scope", ""}},
		domain.TypeMailboxStateRecord: {{"added_at", ""}, {"address", `"ada"`}, {"provider", `"yahoo"`}, {"imap.tls", `"ssl"`}, {"sealed_credentials", ""},
			{"sealed_credentials.alg", `"none"`}, {"source_event_id", `"` + dU[:14] + "4" + dU[15:] + `"`}, {"enabled", `"true"`}},
		domain.TypeSyncTierRecord:         {{"tier", `"lukewarm"`}, {"reason", `"why"`}, {"changed_at", ""}, {"mailbox_id", `"mb-1"`}},
		domain.TypeSyncOwnershipAcquired:  {{"at", ""}, {"partition", `2147483648`}, {"epoch", `1.5`}},
		domain.TypeSyncOwnershipLost:      {{"reason", `"watchdog"`}, {"runners", `-1`}, {"reason", ""}},
		domain.TypeSyncOwnershipSuspended: {{"reason", `"revoked"`}, {"runners", ""}, {"at", `"2026-03-01T12:00:00"`}},
		domain.TypeSyncTierChanged:        {{"from", `"tepid"`}, {"to", ""}, {"reason", `"session "`}},
		domain.TypeOpsAction: {{"actor", ""}, {"actor", `"` + strings.Repeat("a", 257) + `"`}, {"actor", `"ada\u001b[2J"`}, {"actor_kind", `"root"`},
			{"action", `"reboot"`}, {"outcome", `"maybe"`}, {"code", `"Not Redrivable"`}, {"params.count", `-1`}, {"params.token", `"s3cret"`},
			{"params.target", `"a\u202eb"`}, {"at", ""}, {"at", `"2026-03-01 12:00:00Z"`}, {"extra", `1`}},
		domain.TypeSyncFailed: {{"attempt", `0`}, {"error", `"` + strings.Repeat("e", 502) + `"`}, {"mailbox_id", ""}, {"error", `null`}},
	}
	v := eventschema.Derived()
	for _, typ := range derived.Types() {
		valid, ok := derivedValid[typ]
		if !ok {
			t.Errorf("%s: no valid sample", typ)
			continue
		}
		if ps := v.Validate(typ, []byte(valid)); len(ps) > 0 {
			t.Errorf("%s: valid sample refused: %s", typ, ps)
		}
		family := "sync"
		if slices.Contains(domain.PlacementDecisionTypes(), typ) {
			family = "decision"
		} else if typ == domain.TypeMailboxStateRecord || typ == domain.TypeOpsAction {
			family = ""
		}
		samples := append(slices.Clone(perType[typ]), common[family]...)
		if len(perType[typ]) < 3 {
			t.Errorf("%s: %d invalid samples of its own, want at least 3", typ, len(perType[typ]))
		}
		for _, b := range samples {
			data := set(valid, b.field, b.value)
			ps := v.Validate(typ, []byte(data))
			if len(ps) == 0 {
				t.Errorf("%s: %s = %s accepted", typ, b.field, b.value)
				continue
			}
			if !slices.ContainsFunc(ps, func(p domain.Problem) bool { return p.Field == "data."+b.field }) {
				t.Errorf("%s: %s = %s: problems %s are not at data.%s", typ, b.field, b.value, ps, b.field)
			}
		}
	}
}

// TestDerivedGoZeroValuesConform: what the Go types marshal with only the
// fields their validation requires (zero values elsewhere, omitempty fields
// omitted) conforms, so optional fields are optional in the schemas too.
func TestDerivedGoZeroValuesConform(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.FixedZone("", -3*3600))
	meta := domain.PlacementMeta{At: at, Reason: domain.ReasonRetry}
	data := []domain.Data{
		&domain.PlacementWorkerRegistered{PlacementMeta: meta, WorkerID: dW, Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Capacity: 1},
		&domain.PlacementWorkerChanged{PlacementMeta: meta, WorkerID: dW, Tier: domain.TierSharedPremium, Egress: domain.EgressOAuthAPI, Capacity: 1 << 31},
		&domain.PlacementWorkerHealthChanged{PlacementMeta: meta, WorkerID: dW, FromHealth: domain.HealthWatch, Health: domain.HealthHealthy, Capacity: 3},
		&domain.PlacementWorkerDied{PlacementMeta: meta, WorkerID: dW, LastSeen: at.Add(-time.Hour)},
		&domain.PlacementWorkerForgotten{PlacementMeta: meta, WorkerID: dW, LastSeen: at.Add(-200 * time.Hour), RetentionSeconds: 1},
		&domain.PlacementWorkerPromoted{PlacementMeta: meta, WorkerID: dW, FromTier: domain.TierSharedFree, ToTier: domain.TierSharedFree, FromPool: domain.RiskClean, ToPool: domain.RiskQuarantine},
		&domain.PlacementWorkerReverted{PlacementMeta: meta, WorkerID: dW, FromTier: domain.TierSharedFree, ToTier: domain.TierSharedFree, FromPool: domain.RiskRisky, ToPool: domain.RiskClean},
		&domain.PlacementDedicatedBound{PlacementMeta: meta, WorkerID: dW, OrgID: dO},
		&domain.PlacementDedicatedReleased{PlacementMeta: meta, WorkerID: dW, OrgID: dO},
		&domain.PlacementPlanRecorded{PlacementMeta: meta, OrgID: dO, Plan: domain.PlanFree},
		&domain.PlacementAssigned{PlacementMeta: meta, MailboxID: dM, OrgID: dO, WorkerID: dW, Tier: domain.TierSharedFree, Band: domain.RiskClean, Weight: domain.PlacementWeightFull},
		&domain.PlacementRefused{PlacementMeta: meta, MailboxID: dM, OrgID: dO, Tier: domain.TierDedicated, Band: domain.RiskRisky, Weight: domain.PlacementWeightOAuth, Cause: domain.ReasonPlanChanged},
		&domain.PlacementMigrated{PlacementMeta: meta, MailboxID: dM, OrgID: dO, Weight: domain.PlacementWeightWarmup, FromWorker: dW, ToWorker: dW2,
			FromTier: domain.TierSharedFree, ToTier: domain.TierSharedFree, FromBand: domain.RiskClean, ToBand: domain.RiskRisky},
		&domain.PlacementUnassigned{PlacementMeta: meta, MailboxID: dM, OrgID: dO, Band: domain.RiskQuarantine, Weight: domain.PlacementWeightFull},
		&domain.PlacementBandChanged{PlacementMeta: meta, MailboxID: dM, OrgID: dO, FromBand: domain.RiskRisky, ToBand: domain.RiskClean, Health: domain.HealthHealthy},
		&domain.PlacementBandHeld{PlacementMeta: meta, MailboxID: dM, Band: domain.RiskRisky, Health: domain.HealthWatch},
		&domain.PlacementLivenessHeld{PlacementMeta: meta, Scope: domain.LivenessScopeFleet, Live: 1, ThresholdPermille: 1, MinWorkers: 1},
		&domain.PlacementLivenessResumed{PlacementMeta: meta, Scope: domain.LivenessScopeFleet, Live: 1, ThresholdPermille: 1, HeldSince: at},
		&domain.SyncTierRecord{MailboxID: dM, Tier: domain.SyncTierWarm, Reason: domain.SyncReasonDefault, Epoch: 1, Owner: "o", ChangedAt: at},
		&domain.SyncOwnershipAcquired{Epoch: 1, Owner: "o", At: at},
		&domain.SyncOwnershipLost{Epoch: 1, Owner: "o", Reason: domain.SyncLostRevoked, At: at},
		&domain.SyncOwnershipSuspended{Epoch: 1, Owner: "o", Reason: domain.SyncSuspendedWatchdog, At: at},
		&domain.SyncTierChanged{MailboxID: dM, From: domain.SyncTierWarm, To: domain.SyncTierCold, Reason: domain.SyncReasonInactive, Epoch: 1, Owner: "o", At: at},
		&domain.SyncFailed{MailboxID: dM, Epoch: 1, Owner: "o", Attempt: 1, At: at},
		&domain.OpsAction{At: at, Actor: "a", ActorKind: domain.OpsActorOSUser, Action: domain.OpsRebuildSwap, Outcome: domain.OpsOK},
		&domain.OpsAction{At: at, Actor: "a", ActorKind: domain.OpsActorCaller, Action: domain.OpsConsoleLogin, Outcome: domain.OpsOK, Params: &domain.OpsParams{}},
	}
	seen := map[string]bool{}
	v := eventschema.Derived()
	for _, d := range data {
		if ps := d.Validate(); len(ps) > 0 {
			t.Fatalf("%s: test data invalid: %s", d.EventType(), ps)
		}
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if ps := v.Validate(d.EventType(), b); len(ps) > 0 {
			t.Errorf("%s: Go writes %s, which the schema refuses: %s", d.EventType(), b, ps)
		}
		seen[d.EventType()] = true
	}
	m := domain.MailboxStateRecord{MailboxID: dM, OrgID: dO, UserID: dU, Address: "a@b.c", Provider: domain.ProviderSMTPIMAP,
		IMAP:              domain.IMAPEndpoint{Host: "h", Port: 1, TLS: domain.TLSNone, Username: "u"},
		SealedCredentials: &domain.SealedSecret{KeyID: "k", Alg: domain.SealAlg, Nonce: "AA==", Ciphertext: "AA=="}, AddedAt: at}
	if ps := m.Validate(); len(ps) > 0 {
		t.Fatal(ps)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	// source_event_id is written even when empty, and Mailbox.Validate does
	// not check it; the processor always sets it to the event's ce_id, a
	// UUIDv7, which is what the schema documents.
	var obj map[string]any
	_ = json.Unmarshal(b, &obj)
	delete(obj, "source_event_id")
	b, _ = json.Marshal(obj)
	if ps := v.Validate(domain.TypeMailboxStateRecord, b); len(ps) > 0 {
		t.Errorf("mailbox.state: Go writes %s, which the schema refuses: %s", b, ps)
	}
	seen[domain.TypeMailboxStateRecord] = true
	for _, typ := range derived.Types() {
		if !seen[typ] {
			t.Errorf("%s not covered", typ)
		}
	}
}

func TestNewDerivedFromFSErrors(t *testing.T) {
	t.Parallel()
	typ := domain.TypeSyncFailed
	cases := map[string]fstest.MapFS{
		"missing file": {},
		"not JSON":     {typ + ".json": {Data: []byte(`{`)}},
		"bad schema":   {typ + ".json": {Data: []byte(`{"type": 7}`)}},
	}
	for name, fsys := range cases {
		if _, err := eventschema.NewDerivedFromFS(fsys, []string{typ}); err == nil {
			t.Errorf("%s: compiled", name)
		}
	}
	v, err := eventschema.NewDerivedFromFS(fstest.MapFS{typ + ".json": {Data: []byte(`{"type":"object"}`)}}, []string{typ})
	if err != nil {
		t.Fatal(err)
	}
	if ps := v.Validate("sync.failed", []byte(`{"any":1}`)); len(ps) > 0 {
		t.Errorf("permissive schema refused: %s", ps)
	}
	if ps := v.Validate(domain.TypeSyncTierRecord, []byte(`{}`)); !ps.Has(domain.CodeUnknownType) {
		t.Errorf("type without a schema: %s", ps)
	}
}
