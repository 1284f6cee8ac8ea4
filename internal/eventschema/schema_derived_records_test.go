package eventschema_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/topics"
)

// The records the code really writes conform to the derived schemas: the
// decisions of the pure decider encoded by topics.EncodeDecision, the
// mailbox.state records of the mailboxstate codec, and the sync records as
// mailsync encodes them. Each record is checked as a whole: its value
// against the schema named by its ce_type, its topic and key against the
// schema's x-mailplane-topic and x-mailplane-key, and its headers.

func drWorker(i int) string  { return fmt.Sprintf("00000001-0000-4000-8000-%012x", i) }
func drMailbox(i int) string { return fmt.Sprintf("00000002-0000-4000-8000-%012x", i) }
func drOrg(i int) string     { return fmt.Sprintf("00000003-0000-4000-8000-%012x", i) }
func drUser(i int) string    { return fmt.Sprintf("00000004-0000-4000-8000-%012x", i) }

// drEventID is a lower-case UUIDv7.
func drEventID(i int64) string { return fmt.Sprintf("0190a5b2-4c5e-7b1a-9c3d-%012x", i) }

var drT0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// checkDerivedRecord validates one record and returns its decoded data.
func checkDerivedRecord(t *testing.T, v *eventschema.DerivedValidator, r *kgo.Record) map[string]any {
	t.Helper()
	typ, ok := topics.Header(r, topics.HeaderType)
	if !ok {
		t.Fatalf("record on %s without ce_type", r.Topic)
	}
	if ps := v.Validate(typ, r.Value); len(ps) > 0 {
		t.Fatalf("%s: the schema refuses a record the code wrote: %s\n%s", typ, ps, r.Value)
	}
	schema := derivedSchemaDoc(t, typ)
	if want := schema["x-mailplane-topic"]; r.Topic != want {
		t.Errorf("%s: record on topic %s, the schema says %v", typ, r.Topic, want)
	}
	var data map[string]any
	dec := json.NewDecoder(bytes.NewReader(r.Value))
	dec.UseNumber()
	if err := dec.Decode(&data); err != nil {
		t.Fatal(err)
	}
	key, err := derivedKey(schema["x-mailplane-key"].(string), data)
	if err != nil || string(r.Key) != key {
		t.Errorf("%s: record key %q, the schema's template gives %q (%v)", typ, r.Key, key, err)
	}
	want := map[string]string{
		topics.HeaderSpecVersion: domain.SpecVersion,
		topics.HeaderType:        typ,
		topics.HeaderSubject:     string(r.Key),
		topics.HeaderContentType: topics.ContentTypeJSON,
	}
	for h, w := range want {
		if got, _ := topics.Header(r, h); got != w {
			t.Errorf("%s: header %s = %q, want %q", typ, h, got, w)
		}
	}
	if id, _ := topics.Header(r, topics.HeaderID); !domain.IsUUIDv7(id) {
		t.Errorf("%s: ce_id %q is not a UUIDv7", typ, id)
	}
	if src, _ := topics.Header(r, topics.HeaderSource); src == "" {
		t.Errorf("%s: no ce_source", typ)
	}
	checkDataSchema(t, r, typ)
	if ts, _ := topics.Header(r, topics.HeaderTime); !drRFC3339.MatchString(ts) {
		t.Errorf("%s: ce_time %q is not RFC 3339", typ, ts)
	}
	return data
}

// checkDataSchema checks that r's ce_dataschema is domain.SchemaURI of its
// type and names a schema that exists: the one whose $id it is, served
// under the URI's last segment (the API's /v1/schemas/{type}, the Schema
// Registry subject).
func checkDataSchema(t *testing.T, r *kgo.Record, typ string) {
	t.Helper()
	uri, ok := topics.Header(r, topics.HeaderDataSchema)
	if !ok || uri != domain.SchemaURI(typ) {
		t.Errorf("%s: ce_dataschema %q (present %v), want %q", typ, uri, ok, domain.SchemaURI(typ))
		return
	}
	named, _ := strings.CutPrefix(uri, domain.SchemaURIPrefix)
	b, ok := eventschema.SchemaOf(named)
	if !ok {
		t.Errorf("%s: ce_dataschema %q names no schema", typ, uri)
		return
	}
	var doc struct {
		ID string `json:"$id"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || doc.ID != uri {
		t.Errorf("%s: the schema %s names has $id %q (%v)", typ, uri, doc.ID, err)
	}
}

// drRFC3339 is the strict timestamp pattern the schemas carry.
var drRFC3339 = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`)

// ---- placement decisions ----

// drDecider drives the pure decider and encodes its decisions as the engine
// does (engine.DecisionID, topics.EncodeDecision with the input as cause).
type drDecider struct {
	t       *testing.T
	v       *eventschema.DerivedValidator
	st      *placement.State
	now     time.Time
	offset  int64
	types   map[string]int
	reasons map[domain.PlacementReason]bool
	n       int
}

func newDrDecider(t *testing.T) *drDecider { return newDrDeciderWith(t, placement.Config{}) }

func newDrDeciderWith(t *testing.T, cfg placement.Config) *drDecider {
	return &drDecider{t: t, v: eventschema.Derived(), st: placement.NewState(cfg),
		now: drT0, types: map[string]int{}, reasons: map[domain.PlacementReason]bool{}}
}

func (d *drDecider) apply(ev domain.Data) []domain.PlacementDecision {
	d.t.Helper()
	if ps := ev.Validate(); len(ps) > 0 {
		d.t.Fatalf("scenario input %s invalid: %s", ev.EventType(), ps)
	}
	d.offset++
	topic, err := topics.ForType(ev.EventType())
	if err != nil {
		d.t.Fatal(err)
	}
	ds := d.st.Apply(placement.Input{At: d.now, Event: ev})
	d.encode(ds, topics.Cause{ID: drEventID(d.offset), Type: ev.EventType(), Topic: topic, Partition: 3, Offset: d.offset})
	return ds
}

func (d *drDecider) tick() []domain.PlacementDecision {
	d.t.Helper()
	ds := d.st.Apply(placement.Tick(d.now))
	d.encode(ds, topics.Cause{ID: topics.CauseTick, Type: topics.CauseTick})
	return ds
}

func (d *drDecider) encode(ds []domain.PlacementDecision, cause topics.Cause) {
	d.t.Helper()
	cause.Count = len(ds)
	key := cause.ID + "/" + cause.Position() + "/" + d.now.Format(time.RFC3339Nano)
	for i, dec := range ds {
		cause.Index = i
		r, err := topics.EncodeDecision(topics.Decision{
			ID: engine.DecisionID(dec.Meta().At, key, i), Source: engine.DefaultSource, Data: dec, Cause: cause,
		})
		if err != nil {
			d.t.Fatalf("encoding %s: %v", dec.EventType(), err)
		}
		data := checkDerivedRecord(d.t, d.v, r)
		d.checkCause(r, cause, data)
		back, err := topics.DecodeDecision(r)
		if err != nil {
			d.t.Fatalf("%s does not decode back: %v", dec.EventType(), err)
		}
		if back.Data.EventType() != dec.EventType() {
			d.t.Fatalf("decoded %s as %s", dec.EventType(), back.Data.EventType())
		}
		d.types[dec.EventType()]++
		d.reasons[dec.Meta().Reason] = true
		d.n++
	}
}

// checkCause checks the ce_cause* headers the README documents.
func (d *drDecider) checkCause(r *kgo.Record, c topics.Cause, data map[string]any) {
	d.t.Helper()
	get := func(h string) (string, bool) { return topics.Header(r, h) }
	want := map[string]string{
		topics.HeaderCauseID:    c.ID,
		topics.HeaderCauseType:  c.Type,
		topics.HeaderCauseIndex: strconv.Itoa(c.Index),
		topics.HeaderCauseCount: strconv.Itoa(c.Count),
	}
	for h, w := range want {
		if got, ok := get(h); !ok || got != w {
			d.t.Errorf("header %s = %q, want %q", h, got, w)
		}
	}
	pos, ok := get(topics.HeaderCausePosition)
	switch {
	case c.IsTick() && ok:
		d.t.Errorf("a tick's decision has %s %q", topics.HeaderCausePosition, pos)
	case !c.IsTick() && pos != fmt.Sprintf("%s/%d/%d", c.Topic, c.Partition, c.Offset):
		d.t.Errorf("%s = %q", topics.HeaderCausePosition, pos)
	}
	ts, _ := get(topics.HeaderTime)
	at, err1 := time.Parse(time.RFC3339Nano, ts)
	dataAt, err2 := time.Parse(time.RFC3339Nano, data["at"].(string))
	if err1 != nil || err2 != nil || !at.Equal(dataAt) || !r.Timestamp.Equal(dataAt) {
		d.t.Errorf("ce_time %s, timestamp %s, data at %v", ts, r.Timestamp, data["at"])
	}
}

func drMailboxAdded(mb, org int, p domain.Provider, warmup bool) *domain.MailboxAdded {
	return &domain.MailboxAdded{
		MailboxID: drMailbox(mb), OrgID: drOrg(org), UserID: drUser(org), Address: fmt.Sprintf("box%d@example.com", mb),
		Provider: p, WarmupEnabled: warmup,
		IMAP:              domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit, Username: fmt.Sprintf("box%d@example.com", mb)},
		SealedCredentials: &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAECAwQFBgcICQoL", Ciphertext: "c2VhbGVk"},
	}
}

func (d *drDecider) hb(w int, tier domain.Tier, e domain.Egress, stopping bool) []domain.PlacementDecision {
	return d.apply(&domain.WorkerHeartbeat{WorkerID: drWorker(w), Tier: tier, Egress: e, Address: fmt.Sprintf("10.0.0.%d:25", w), Stopping: stopping})
}

func (d *drDecider) add(mb, org int, p domain.Provider, warmup bool) []domain.PlacementDecision {
	return d.apply(drMailboxAdded(mb, org, p, warmup))
}

func (d *drDecider) score(mb int, st domain.HealthState, score float64) []domain.PlacementDecision {
	return d.apply(&domain.MailboxHealthScored{MailboxID: drMailbox(mb), State: st, Score: score, Reason: "weekly sweep"})
}

func (d *drDecider) plan(org int, p domain.Plan, n int, paid bool) []domain.PlacementDecision {
	return d.apply(&domain.OrgPlanChanged{OrgID: drOrg(org), Plan: p, DedicatedWorkers: n, Paid: paid, Source: "billing:evt_" + strconv.Itoa(org)})
}

func (d *drDecider) sample(w int, sends, bounces, complaints int64) []domain.PlacementDecision {
	return d.apply(&domain.WorkerHealthSampled{WorkerID: drWorker(w), WindowSeconds: 3600, Sends: sends, HardBounces: bounces, Complaints: complaints})
}

func (d *drDecider) remove(mb int) []domain.PlacementDecision {
	return d.apply(&domain.MailboxRemoved{MailboxID: drMailbox(mb), Reason: "closed by the user"})
}

// beat heartbeats every known worker with its attributes, as live workers do.
func (d *drDecider) beat() {
	for _, w := range d.st.Snapshot().Workers {
		if !w.Live {
			continue
		}
		d.apply(&domain.WorkerHeartbeat{WorkerID: w.ID, Tier: w.BaseTier, Egress: w.Egress, Address: w.Address, Stopping: w.Stopping})
	}
}

func (d *drDecider) advance(by time.Duration) { d.now = d.now.Add(by) }

// TestDerivedDecisionsConform runs a scripted sequence of domain events and
// ticks through the decider, covering every decision type, and validates
// every decision record the engine would write.
func TestDerivedDecisionsConform(t *testing.T) {
	t.Parallel()
	// (Liveness never held here: its silences must kill; the hold has a
	// fleet of its own below.)
	d := newDrDeciderWith(t, placement.Config{LivenessHoldMinWorkers: 1 << 30})
	// Shared premium workers, a premium org, three mailboxes.
	d.hb(1, domain.TierSharedPremium, domain.EgressOAuthAPI, false)
	d.hb(2, domain.TierSharedPremium, domain.EgressOAuthAPI, false)
	d.plan(1, domain.PlanPremium, 0, true)
	d.add(1, 1, domain.ProviderGmail, false)
	d.add(2, 1, domain.ProviderGmail, false)
	d.add(3, 1, domain.ProviderGmail, false)
	// Mailbox 3 goes quarantined, nothing idle: band_changed, refused off
	// its worker.
	d.score(3, domain.HealthQuarantined, 12.5)
	// A new worker: registered, promoted into quarantine, assigned.
	d.hb(3, domain.TierSharedPremium, domain.EgressColdSMTP, false)
	// Removal: unassigned, the pool worker reverts.
	d.remove(3)
	// Hysteresis: worse at once, recovery held, cancelled, improved.
	d.score(1, domain.HealthWatch, 61)
	d.advance(10 * time.Minute)
	d.beat()
	d.score(1, domain.HealthHealthy, 90)
	d.advance(10 * time.Minute)
	d.score(1, domain.HealthThrottled, 40)
	d.advance(10 * time.Minute)
	d.score(1, domain.HealthHealthy, 95)
	for range 7 {
		d.advance(10 * time.Minute)
		d.beat()
		d.score(1, domain.HealthHealthy, 97.25)
	}
	// Worker health: samples change the state and the capacity.
	d.sample(2, 10000, 0, 50)
	d.sample(2, 0, 0, 0)
	// A free worker and a free org, warmup and SMTP weights.
	d.hb(4, domain.TierSharedFree, domain.EgressWarmupOnly, false)
	d.add(4, 4, domain.ProviderSMTPIMAP, true)
	d.add(5, 4, domain.ProviderSMTPIMAP, false)
	// Dedicated: promoted, bound; a second org short of capacity gets
	// degraded placements; released, handed over, reverted.
	d.hb(5, domain.TierSharedPremium, domain.EgressOAuthAPI, false)
	d.plan(2, domain.PlanDedicated, 1, true)
	d.add(6, 2, domain.ProviderOutlook, false)
	d.plan(3, domain.PlanDedicated, 1, true)
	d.add(7, 3, domain.ProviderGmail, true)
	d.plan(2, domain.PlanPremium, 0, true)
	d.plan(3, domain.PlanFree, 0, false)
	// A worker stops (drained), resumes, changes its address and tier.
	d.hb(1, domain.TierSharedPremium, domain.EgressOAuthAPI, true)
	d.hb(1, domain.TierSharedPremium, domain.EgressOAuthAPI, false)
	d.apply(&domain.WorkerHeartbeat{WorkerID: drWorker(1), Tier: domain.TierSharedPremium, Egress: domain.EgressOAuthAPI, Address: "10.0.1.1:2525"})
	d.hb(4, domain.TierSharedPremium, domain.EgressWarmupOnly, false)
	// Liveness: every worker but 2 goes silent; a tick finds them dead.
	d.advance(25 * time.Second)
	d.hb(2, domain.TierSharedPremium, domain.EgressOAuthAPI, false)
	d.advance(10 * time.Second)
	d.tick()
	d.advance(35 * time.Second)
	d.tick()
	// Revived: the pending mailboxes are placed again.
	d.hb(1, domain.TierSharedPremium, domain.EgressOAuthAPI, false)
	d.hb(5, domain.TierSharedPremium, domain.EgressOAuthAPI, false)
	d.advance(time.Minute)
	d.tick()
	// The age ramp raises capacities.
	d.advance(15 * 24 * time.Hour)
	d.beat()
	d.tick()
	d.remove(1)
	d.remove(9) // unknown: nothing

	// The liveness hold, on a fleet of its own: three workers fall silent
	// at once (held), two come back (resumed), the third dies a window
	// later; a second silence outlasts the longest hold (expired).
	l := newDrDeciderWith(t, placement.Config{LivenessHoldMax: 2 * time.Minute})
	l.n, l.types, l.reasons = d.n, d.types, d.reasons
	l.plan(1, domain.PlanPremium, 0, true)
	for w := 1; w <= 3; w++ {
		l.hb(w, domain.TierSharedPremium, domain.EgressOAuthAPI, false)
	}
	l.add(1, 1, domain.ProviderGmail, false)
	l.advance(35 * time.Second)
	l.tick()
	l.hb(1, domain.TierSharedPremium, domain.EgressOAuthAPI, false)
	l.hb(2, domain.TierSharedPremium, domain.EgressOAuthAPI, false)
	l.advance(time.Second)
	l.tick()
	for range 4 {
		l.advance(10 * time.Second)
		l.hb(1, domain.TierSharedPremium, domain.EgressOAuthAPI, false)
		l.hb(2, domain.TierSharedPremium, domain.EgressOAuthAPI, false)
		l.tick()
	}
	l.hb(3, domain.TierSharedPremium, domain.EgressOAuthAPI, false)
	for range 20 {
		l.advance(10 * time.Second)
		l.tick()
	}
	d.n = l.n
	for _, r := range []domain.PlacementReason{domain.ReasonFleetSilent, domain.ReasonHeartbeatsResumed, domain.ReasonLivenessHoldExpired} {
		if !d.reasons[r] {
			t.Errorf("the scenario made no decision with reason %s", r)
		}
	}

	for _, typ := range domain.PlacementDecisionTypes() {
		if d.types[typ] == 0 {
			t.Errorf("the scenario made no %s", typ)
		}
	}
	t.Logf("%d decisions, %d types, %d reasons: %v", d.n, len(d.types), len(d.reasons), d.types)
}

// TestDerivedDecisionsConformRandom feeds random valid domain events and
// ticks to the decider and validates every decision.
func TestDerivedDecisionsConformRandom(t *testing.T) {
	t.Parallel()
	for seed := range uint64(4) {
		d := newDrDecider(t)
		rng := rand.New(rand.NewPCG(seed, 42))
		tiers := []domain.Tier{domain.TierSharedFree, domain.TierSharedPremium, ""}
		egress := []domain.Egress{domain.EgressColdSMTP, domain.EgressOAuthAPI, domain.EgressWarmupOnly}
		providers := []domain.Provider{domain.ProviderSMTPIMAP, domain.ProviderGmail, domain.ProviderOutlook}
		health := []domain.HealthState{domain.HealthHealthy, domain.HealthWatch, domain.HealthThrottled, domain.HealthQuarantined, domain.HealthBlocked}
		plans := []domain.Plan{domain.PlanFree, domain.PlanPremium, domain.PlanDedicated}
		for range 600 {
			switch rng.IntN(10) {
			case 0, 1:
				d.hb(1+rng.IntN(8), tiers[rng.IntN(3)], egress[rng.IntN(3)], rng.IntN(8) == 0)
			case 2, 3:
				d.add(1+rng.IntN(40), 1+rng.IntN(5), providers[rng.IntN(3)], rng.IntN(3) == 0)
			case 4:
				d.remove(1 + rng.IntN(40))
			case 5, 6:
				d.score(1+rng.IntN(40), health[rng.IntN(5)], float64(rng.IntN(1001))/10)
			case 7:
				n := 0
				p := plans[rng.IntN(3)]
				if p == domain.PlanDedicated {
					n = 1 + rng.IntN(3)
				}
				d.plan(1+rng.IntN(5), p, n, rng.IntN(5) > 0)
			case 8:
				sends := int64(rng.IntN(3)) * 5000
				d.sample(1+rng.IntN(8), sends, sends*int64(rng.IntN(12))/100, sends*int64(rng.IntN(12))/1000)
			case 9:
				d.advance(time.Duration(rng.IntN(90)) * time.Second)
				if rng.IntN(3) == 0 {
					d.beat()
				}
				d.tick()
			}
		}
		if d.n == 0 {
			t.Fatalf("seed %d: no decisions", seed)
		}
	}
}

// ---- mailbox.state ----

// TestDerivedMailboxStateConforms encodes mailbox.state records with the
// mailboxstate codec, as the processor folds mailbox.added events.
func TestDerivedMailboxStateConforms(t *testing.T) {
	t.Parallel()
	v := eventschema.Derived()
	cases := []*domain.MailboxAdded{
		drMailboxAdded(1, 1, domain.ProviderSMTPIMAP, false),
		drMailboxAdded(2, 1, domain.ProviderGmail, true),
		drMailboxAdded(3, 2, domain.ProviderOutlook, false),
	}
	long := drMailboxAdded(4, 2, domain.ProviderSMTPIMAP, true)
	long.Address = strings.Repeat("é", 242) + "@example.com"
	long.IMAP = domain.IMAPEndpoint{Host: "10.0.0.1", Port: 143, TLS: domain.TLSNone, Username: strings.Repeat("u", 320)}
	long.SealedCredentials = &domain.SealedSecret{KeyID: strings.Repeat("k", 64), Alg: domain.SealAlg, Nonce: strings.Repeat("A", 62) + "==", Ciphertext: strings.Repeat("B", 8192)}
	cases = append(cases, long)
	starttls := drMailboxAdded(5, 3, domain.ProviderSMTPIMAP, false)
	starttls.IMAP.TLS = domain.TLSStartTLS
	cases = append(cases, starttls)
	for i, a := range cases {
		e := domain.Event{ID: drEventID(int64(100 + i)), Type: domain.TypeMailboxAdded, Source: "test", Time: drT0.Add(time.Duration(i) * time.Second), Data: a}
		if ps := e.Validate(); len(ps) > 0 {
			t.Fatalf("case %d: the input event is invalid: %s", i, ps)
		}
		m := mailboxstate.FromAdded(e, a)
		r, err := mailboxstate.Record(topics.MailboxState, m, e.Time)
		if err != nil {
			t.Fatal(err)
		}
		data := checkDerivedRecord(t, v, r)
		if data["source_event_id"] != e.ID {
			t.Errorf("source_event_id %v, want %s", data["source_event_id"], e.ID)
		}
		if id, _ := topics.Header(r, topics.HeaderID); id != e.ID {
			t.Errorf("ce_id %s, want the event's %s", id, e.ID)
		}
		if src, _ := topics.Header(r, topics.HeaderSource); src != mailboxstate.Source {
			t.Errorf("ce_source %s", src)
		}
		if _, live, err := mailboxstate.Decode(r); err != nil || !live {
			t.Errorf("case %d does not decode back: %v", i, err)
		}
	}
	// A tombstone has no value to validate; its headers are as documented.
	r := mailboxstate.Tombstone(topics.MailboxState, drMailbox(1), drEventID(200), drT0)
	if r.Value != nil || string(r.Key) != drMailbox(1) || r.Topic != topics.MailboxState {
		t.Errorf("tombstone %+v", r)
	}
	if typ, _ := topics.Header(r, topics.HeaderType); typ != domain.TypeMailboxStateRecord {
		t.Errorf("tombstone ce_type %q", typ)
	}
	if _, live, err := mailboxstate.Decode(r); err != nil || live {
		t.Errorf("tombstone: live %v, %v", live, err)
	}
}

// ---- sync.tier and sync.audit ----

// drSyncRecord encodes d as mailsync does (mailsync's encodeRecord: a
// CloudEvent in binary mode, ce_source "mailplane/sync/<owner>").
func drSyncRecord(t *testing.T, topic, owner string, at time.Time, d domain.Data) *kgo.Record {
	t.Helper()
	r, err := topics.EncodeTo(topic, domain.Event{
		ID: drEventID(at.UnixNano() % 1e12), Type: d.EventType(), Source: "mailplane/sync/" + owner,
		Time: at, Subject: d.AggregateID(), Data: d,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestDerivedSyncRecordsConform validates sync.tier and sync.audit records
// built from the tier decisions of domain.EvaluateSyncTiers and the values
// the worker writes.
func TestDerivedSyncRecordsConform(t *testing.T) {
	t.Parallel()
	v := eventschema.Derived()
	now := drT0.Add(30 * 24 * time.Hour)
	policy := domain.SyncTierPolicy{SessionGrace: 15 * time.Minute, HotActivity: 2 * time.Hour, ColdAfter: 168 * time.Hour, UnknownGrace: time.Minute, HotBudget: 4}
	in := []domain.SyncTierInput{
		{Current: domain.SyncTierWarm, SessionAt: now.Add(-time.Minute), TrackedSince: drT0, AddedAt: drT0},                                 // session
		{Current: domain.SyncTierWarm, MailKnown: true, NewestMail: now.Add(-time.Hour), TrackedSince: drT0, AddedAt: drT0},                 // recent mail
		{Current: domain.SyncTierWarm, MailKnown: true, NewestMail: now.Add(-90 * time.Minute), TrackedSince: drT0, AddedAt: drT0},          // recent, demoted
		{Current: domain.SyncTierHot, MailKnown: true, NewestMail: now.Add(-100 * time.Minute), TrackedSince: drT0, AddedAt: drT0},          // recent, demoted
		{Current: domain.SyncTierWarm, MailKnown: true, TrackedSince: drT0, AddedAt: drT0},                                                  // inactive
		{Current: domain.SyncTierHot, MailKnown: true, NewestMail: now.Add(-48 * time.Hour), TrackedSince: drT0, AddedAt: drT0},             // default
		{Current: domain.SyncTierCold, TrackedSince: now.Add(-time.Second), AddedAt: drT0},                                                  // unknown
		{Current: domain.SyncTierCold, MailKnown: true, NewestMail: now.Add(-200 * time.Hour), TrackedSince: drT0, AddedAt: drT0},           // inactive
		{Current: domain.SyncTierHot, SessionAt: now.Add(-5 * time.Minute), MailKnown: true, TrackedSince: drT0, AddedAt: now},              // session
		{Current: domain.SyncTierWarm, SessionAt: now.Add(-time.Hour), MailKnown: true, NewestMail: now, TrackedSince: drT0, AddedAt: drT0}, // recent
	}
	decided := domain.EvaluateSyncTiers(now, policy, in)
	owner := "sync-7f9c4d-12345-0123456789ab"
	reasons := map[string]bool{}
	types := map[string]bool{}
	for i, dec := range decided {
		reasons[dec.Reason] = true
		mb := drMailbox(i + 1)
		part, epoch := int32(i%4), int64(1+i)
		tr := drSyncRecord(t, topics.SyncTier, owner, now, &domain.SyncTierRecord{MailboxID: mb, Tier: dec.Tier, Reason: dec.Reason,
			Partition: part, Epoch: epoch, Owner: owner, ChangedAt: now})
		checkDerivedRecord(t, v, tr)
		if rec, ok, err := mailsync.DecodeTierRecord(tr); err != nil || !ok || rec.Tier != dec.Tier {
			t.Errorf("sync.tier record does not decode back: %+v %v %v", rec, ok, err)
		}
		types[domain.TypeSyncTierRecord] = true
		if dec.Tier != in[i].Current {
			types[domain.TypeSyncTierChanged] = true
			checkDerivedRecord(t, v, drSyncRecord(t, topics.SyncAudit, owner, now, &domain.SyncTierChanged{MailboxID: mb, From: in[i].Current, To: dec.Tier,
				Reason: dec.Reason, Partition: part, Epoch: epoch, Owner: owner, At: now}))
		}
	}
	// The worker also writes inherited tiers' records on assignment.
	checkDerivedRecord(t, v, drSyncRecord(t, topics.SyncTier, owner, now, &domain.SyncTierRecord{MailboxID: drMailbox(99), Tier: domain.SyncTierCold,
		Reason: domain.SyncReasonInherited, Partition: 255, Epoch: 1, Owner: owner, ChangedAt: now}))
	for _, r := range []string{domain.SyncReasonSession, domain.SyncReasonRecentMail, domain.SyncReasonHotBudget, domain.SyncReasonInactive, domain.SyncReasonDefault, domain.SyncReasonUnknown} {
		if !reasons[r] {
			t.Errorf("no tier decision with reason %s", r)
		}
	}

	audit := []domain.Data{
		&domain.SyncOwnershipAcquired{Partition: 0, Epoch: 1, Owner: owner, At: now},
		&domain.SyncOwnershipAcquired{Partition: 255, Epoch: 1 << 40, Owner: owner, At: now},
		&domain.SyncOwnershipLost{Partition: 3, Epoch: 7, Owner: owner, Reason: domain.SyncLostRevoked, Runners: 12, At: now},
		&domain.SyncOwnershipLost{Partition: 3, Epoch: 7, Owner: owner, Reason: domain.SyncLostLost, Runners: 0, At: now},
		&domain.SyncOwnershipSuspended{Partition: 4, Epoch: 2, Owner: owner, Reason: domain.SyncSuspendedWatchdog, Runners: 3, At: now},
		&domain.SyncOwnershipSuspended{Partition: 4, Epoch: 2, Owner: owner, Reason: domain.SyncSuspendedFenced, Runners: 0, At: now},
		&domain.SyncFailed{MailboxID: drMailbox(1), Partition: 4, Epoch: 2, Owner: owner, Error: "imap: dial tcp 10.0.0.1:993: connection refused", Attempt: 1, At: now},
		// The worker cuts errors to 500 bytes and appends "…".
		&domain.SyncFailed{MailboxID: drMailbox(2), Partition: 4, Epoch: 2, Owner: owner, Error: strings.Repeat("e", 500) + "…", Attempt: 9, At: now},
		&domain.SyncFailed{MailboxID: drMailbox(3), Partition: 4, Epoch: 2, Owner: owner, Error: strings.Repeat("é", 250) + "…", Attempt: 2, At: now},
		&domain.SyncFailed{MailboxID: drMailbox(4), Partition: 4, Epoch: 2, Owner: owner, Error: "", Attempt: 3, At: now},
	}
	for _, d := range audit {
		checkDerivedRecord(t, v, drSyncRecord(t, topics.SyncAudit, owner, now, d))
		types[d.EventType()] = true
	}
	if len(types) != 6 {
		t.Errorf("covered %d sync types, want 6", len(types))
	}
	// A removed mailbox's sync.tier record is a tombstone: no value, no
	// headers (mailsync's tierTombstone), decoded as such.
	if rec, ok, err := mailsync.DecodeTierRecord(&kgo.Record{Topic: topics.SyncTier, Key: []byte(drMailbox(1))}); ok || err != nil || rec.MailboxID != drMailbox(1) {
		t.Errorf("tombstone: %+v %v %v", rec, ok, err)
	}
}
