package projections_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/topics"
)

const catchUp = 60 * time.Second

var domainTopics = topics.DomainTopics()

// TestProjectAllTypes projects a hand-made history of every event type and
// checks the resulting rows column by column.
func TestProjectAllTypes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(1, 1)
	at := func(ev domain.Event, sec int) domain.Event {
		ev.Time = g.t0.Add(time.Duration(sec) * time.Second)
		return ev
	}
	org, user, user2, worker, worker2 := g.uuid(), g.uuid(), g.uuid(), g.uuid(), g.uuid()
	m1, m2, m3, m4 := g.uuid(), g.uuid(), g.uuid(), g.uuid()
	add := func(id string, sec int) domain.Event {
		ev := g.added(id)
		ev.Data.(*domain.MailboxAdded).OrgID = org
		ev.Data.(*domain.MailboxAdded).UserID = user
		return at(ev, sec)
	}
	until := g.t0.Add(48 * time.Hour)
	events := []domain.Event{
		at(g.event(&domain.OrgPlanChanged{OrgID: org, Plan: domain.PlanFree, Source: "b1"}), 1),
		at(g.event(&domain.OrgPlanChanged{OrgID: org, Plan: domain.PlanDedicated, DedicatedWorkers: 2, Paid: true, Source: "b2"}), 2),
		at(g.event(&domain.UserActive{UserID: user, Source: domain.ActivityLogin}), 10),
		// Older activity arriving later does not move last_active_at back.
		at(g.event(&domain.UserActive{UserID: user, Source: domain.ActivityWSPing}), 5),
		at(g.event(&domain.UserActive{UserID: user2, Source: domain.ActivityWSConnect}), 7),
		at(g.event(&domain.WorkerHeartbeat{WorkerID: worker, Egress: domain.EgressColdSMTP, Address: "10.0.0.1:25"}), 3),
		at(g.event(&domain.WorkerHealthSampled{WorkerID: worker, WindowSeconds: 3600, Sends: 100, HardBounces: 2, Complaints: 1}), 4),
		at(g.event(&domain.WorkerHeartbeat{WorkerID: worker, Tier: domain.TierSharedFree, Egress: domain.EgressOAuthAPI, Address: "10.0.0.2:25", Stopping: true}), 6),
		at(g.event(&domain.WorkerHealthSampled{WorkerID: worker2, WindowSeconds: 60, Sends: 7}), 4),
		add(m1, 20),
		at(g.event(&domain.MailboxHealthScored{MailboxID: m1, State: domain.HealthWatch, Score: 55.5, Reason: "bounces", Until: &until}), 21),
		add(m2, 22),
		at(g.event(&domain.MailboxRemoved{MailboxID: m2, Reason: "churned"}), 23),
		add(m3, 24),
		at(g.event(&domain.MailboxRemoved{MailboxID: m3, Reason: "oops"}), 25),
		add(m3, 26),
		at(g.event(&domain.MailboxHealthScored{MailboxID: m4, State: domain.HealthBlocked, Score: 1, Reason: "spam"}), 27),
	}
	e.produce(events...)

	p, reg := e.projector(e.db.Pool, projections.NewRegistry())
	start(t, p)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)

	ctx := t.Context()
	pool := e.db.Pool
	ts := func(sec int) time.Time { return g.t0.Add(time.Duration(sec) * time.Second) }

	var plan, source string
	var dedicated int
	var paid bool
	var updated time.Time
	must(t, pool.QueryRow(ctx, `SELECT plan, dedicated_workers, paid, source, updated_at FROM orgs WHERE org_id = $1`, org).
		Scan(&plan, &dedicated, &paid, &source, &updated))
	if plan != "dedicated" || dedicated != 2 || !paid || source != "b2" || !updated.Equal(ts(2)) {
		t.Errorf("org: %s %d %v %s %s", plan, dedicated, paid, source, updated)
	}

	var active time.Time
	must(t, pool.QueryRow(ctx, `SELECT last_active_at, last_source FROM users WHERE user_id = $1`, user).Scan(&active, &source))
	if !active.Equal(ts(10)) || source != "login" {
		t.Errorf("user: %s %s", active, source)
	}
	if n := count(t, pool, `SELECT count(*) FROM users`); n != 2 {
		t.Errorf("%d users, want 2", n)
	}

	var tier, egress, addr *string
	var stopping *bool
	var hb, sampledAt *time.Time
	var sends, bounces, complaints *int64
	must(t, pool.QueryRow(ctx, `SELECT tier, egress, address, stopping, last_heartbeat_at, sends, hard_bounces, complaints, sampled_at
		FROM workers WHERE worker_id = $1`, worker).Scan(&tier, &egress, &addr, &stopping, &hb, &sends, &bounces, &complaints, &sampledAt))
	if *tier != "shared_free" || *egress != "oauth_api" || *addr != "10.0.0.2:25" || !*stopping || !hb.Equal(ts(6)) ||
		*sends != 100 || *bounces != 2 || *complaints != 1 || !sampledAt.Equal(ts(4)) {
		t.Errorf("worker: %v %v %v %v %v %v %v %v %v", *tier, *egress, *addr, *stopping, hb, *sends, *bounces, *complaints, sampledAt)
	}
	// A sample without a heartbeat yet: the heartbeat columns stay NULL.
	must(t, pool.QueryRow(ctx, `SELECT tier, last_heartbeat_at, sends FROM workers WHERE worker_id = $1`, worker2).Scan(&tier, &hb, &sends))
	if tier != nil || hb != nil || *sends != 7 {
		t.Errorf("worker2: %v %v %v", tier, hb, sends)
	}

	type mbox struct {
		org, user, addr, provider, imapHost, imapTLS, imapUser *string
		port                                                   *int
		sealed                                                 []byte
		state, reason, removalReason                           *string
		score                                                  *float64
		until, removedAt, addedAt                              *time.Time
		updatedAt                                              time.Time
		lastEvent                                              string
	}
	get := func(id string) mbox {
		var m mbox
		must(t, pool.QueryRow(ctx, `SELECT org_id::text, user_id::text, address, provider, imap_host, imap_tls, imap_username, imap_port,
			sealed_credentials, health_state, health_reason, removal_reason, health_score, health_until, removed_at, added_at,
			updated_at, last_event_id::text FROM mailboxes WHERE mailbox_id = $1`, id).
			Scan(&m.org, &m.user, &m.addr, &m.provider, &m.imapHost, &m.imapTLS, &m.imapUser, &m.port, &m.sealed,
				&m.state, &m.reason, &m.removalReason, &m.score, &m.until, &m.removedAt, &m.addedAt, &m.updatedAt, &m.lastEvent))
		return m
	}
	b1 := get(m1)
	a1 := events[9].Data.(*domain.MailboxAdded)
	var sealedBack domain.SealedSecret
	must(t, json.Unmarshal(b1.sealed, &sealedBack))
	if *b1.org != org || *b1.user != user || *b1.addr != a1.Address || *b1.provider != string(a1.Provider) ||
		*b1.imapHost != "imap.example.com" || *b1.port != 993 || *b1.imapTLS != "implicit" || *b1.imapUser != a1.IMAP.Username ||
		sealedBack != *a1.SealedCredentials || *b1.state != "watch" || *b1.score != 55.5 || *b1.reason != "bounces" ||
		!b1.until.Equal(until) || b1.removedAt != nil || !b1.addedAt.Equal(ts(20)) || !b1.updatedAt.Equal(ts(21)) ||
		b1.lastEvent != events[10].ID {
		t.Errorf("m1: %+v", b1)
	}
	b2 := get(m2)
	if b2.removedAt == nil || !b2.removedAt.Equal(ts(23)) || *b2.removalReason != "churned" || *b2.addr == "" || !b2.addedAt.Equal(ts(22)) {
		t.Errorf("m2 (removed, row kept): %+v", b2)
	}
	b3 := get(m3)
	if b3.removedAt != nil || b3.removalReason != nil || !b3.addedAt.Equal(ts(26)) {
		t.Errorf("m3 (re-added): %+v", b3)
	}
	b4 := get(m4)
	if b4.addedAt != nil || b4.org != nil || *b4.state != "blocked" || b4.lastEvent != events[16].ID {
		t.Errorf("m4 (scored, never added): %+v", b4)
	}

	if got := settledCounter(t, reg, float64(len(events)), "mailplane_projector_records_applied_total", "projector", "registry"); got != float64(len(events)) {
		t.Errorf("records applied = %v, want %d", got, len(events))
	}
	if n := count(t, pool, `SELECT count(*) FROM applied_events WHERE projector = 'registry'`); n != len(events) {
		t.Errorf("applied_events = %d, want %d", n, len(events))
	}
	if got := counter(t, reg, "mailplane_projector_batch_apply_seconds", "projector", "registry"); got == 0 {
		t.Error("no batch observed")
	}
	waitFor(t, 10*time.Second, "lag gauges to reach 0", func() (bool, error) {
		return counter(t, reg, "mailplane_consumer_lag_records", "consumer", "registry") == 0 &&
			counter(t, reg, "mailplane_consumer_lag_seconds", "consumer", "registry") == 0, nil
	})
	// Every event applied is one latency sample of the registry's tier.
	if got := counter(t, reg, "mailplane_consumer_latency_seconds", "consumer", "registry", "tier", "bulk"); got != float64(len(events)) {
		t.Errorf("%v latency samples, want %d", got, len(events))
	}
}

// TestBatchBoundaries applies one random history in batches of different
// sizes: the rows must not depend on where batches split.
func TestBatchBoundaries(t *testing.T) {
	t.Parallel()
	g := newGen(2, 5)
	events := g.events(400)
	// Group by aggregate, as a partition would deliver them.
	var ordered []domain.Event
	for _, a := range []domain.Aggregate{domain.AggregateMailbox, domain.AggregateOrg, domain.AggregateUser, domain.AggregateWorker} {
		for _, ev := range events {
			if ev.Aggregate() == a {
				ordered = append(ordered, ev)
			}
		}
	}
	reg := projections.NewRegistry()
	var sums []string
	for _, size := range []int{1, 7, 100, len(ordered)} {
		db := newDB(t)
		for chunk := range slices.Chunk(ordered, size) {
			must(t, pgx.BeginFunc(t.Context(), db, func(tx pgx.Tx) error { return reg.Apply(t.Context(), tx, asRecords(chunk)) }))
		}
		sums = append(sums, registryChecksum(t, db))
	}
	for i := 1; i < len(sums); i++ {
		if sums[i] != sums[0] {
			t.Fatalf("checksums differ by batch size: %v", sums)
		}
	}
}

// TestDuplicateDelivery re-produces the same events (same ids) and then
// rewinds the Postgres offsets: the rows do not change.
func TestDuplicateDelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	events := newGen(3, 20).events(400)
	e.produce(events...)

	p, reg := e.projector(e.db.Pool, projections.NewRegistry(), projections.WithBatchSize(50))
	stop := start(t, p)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	want := registryChecksum(t, e.db.Pool)

	// A producer retry: the same events again.
	e.produce(events...)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	if got := registryChecksum(t, e.db.Pool); got != want {
		t.Fatalf("checksum changed after redelivery: %s != %s", got, want)
	}
	if got := settledCounter(t, reg, float64(len(events)), "mailplane_projector_duplicates_skipped_total", "projector", "registry"); got != float64(len(events)) {
		t.Fatalf("duplicates skipped = %v, want %d", got, len(events))
	}
	stop()

	// Offsets rewound: everything is read again and recognised.
	_, err := e.db.Pool.Exec(t.Context(), `DELETE FROM projector_offsets`)
	must(t, err)
	p2, reg2 := e.projector(e.db.Pool, projections.NewRegistry())
	start(t, p2)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	if got := registryChecksum(t, e.db.Pool); got != want {
		t.Fatalf("checksum changed after rewind: %s != %s", got, want)
	}
	if got := settledCounter(t, reg2, float64(2*len(events)), "mailplane_projector_duplicates_skipped_total", "projector", "registry"); got != float64(2*len(events)) {
		t.Fatalf("duplicates skipped after rewind = %v, want %d", got, 2*len(events))
	}
	if got := counter(t, reg2, "mailplane_projector_records_applied_total", "projector", "registry"); got != 0 {
		t.Fatalf("applied after rewind = %v, want 0", got)
	}
	if n := count(t, e.db.Pool, `SELECT count(*) FROM applied_events`); n != len(events) {
		t.Fatalf("applied_events = %d, want %d", n, len(events))
	}
}

// TestRewindWhileRunning deletes the offsets under a running projector:
// the next batch notices, the partition is read again from the start, and
// every event is recognised as applied.
func TestRewindWhileRunning(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(4, 3)
	mailbox := g.mailboxes[0]
	var events []domain.Event
	for range 30 {
		events = append(events, g.event(&domain.MailboxHealthScored{MailboxID: mailbox, State: domain.HealthHealthy, Score: 90, Reason: "ok"}))
	}
	recs := e.produce(events...)

	p, reg := e.projector(e.db.Pool, projections.NewRegistry())
	start(t, p)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	want := registryChecksum(t, e.db.Pool)

	_, err := e.db.Pool.Exec(t.Context(), `DELETE FROM projector_offsets`)
	must(t, err)
	e.produce(events[0]) // a duplicate, on the same partition
	waitFor(t, catchUp, "rewound partition to be read again", func() (bool, error) {
		return counter(t, reg, "mailplane_projector_duplicates_skipped_total", "projector", "registry") == float64(len(events)+1), nil
	})
	ctx := t.Context()
	pg, err := pgOffsets(ctx, e.db.Pool, projections.RegistryName)
	must(t, err)
	if got := pg[tp{recs[0].Topic, recs[0].Partition}]; got != int64(len(events)+1) {
		t.Fatalf("offset after rewind = %d, want %d", got, len(events)+1)
	}
	if got := registryChecksum(t, e.db.Pool); got != want {
		t.Fatalf("checksum changed: %s != %s", got, want)
	}
}

// poison builds a record on the mailbox topic keyed like good (so it lands
// on good's partition) from good's encoding, changed by edit.
func poison(t *testing.T, good domain.Event, edit func(r *kgo.Record)) *kgo.Record {
	r, err := topics.Encode(good)
	must(t, err)
	edit(r)
	return r
}

func setHeader(r *kgo.Record, key, value string) {
	for i := range r.Headers {
		if r.Headers[i].Key == key {
			r.Headers[i].Value = []byte(value)
		}
	}
}

// TestPoisonRecords writes undecodable records between good ones: each goes
// to the DLQ with its reason, the good ones are projected, and a plain
// secret never reaches the DLQ.
func TestPoisonRecords(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(5, 1)
	mailbox := g.mailboxes[0]
	before := g.added(mailbox)
	after := g.event(&domain.MailboxHealthScored{MailboxID: mailbox, State: domain.HealthThrottled, Score: 20, Reason: "complaints"})

	template := g.added(mailbox)
	missing := poison(t, template, func(r *kgo.Record) { r.Headers = nil })
	badJSON := poison(t, template, func(r *kgo.Record) { r.Value = []byte(`{"mailbox_id": "` + mailbox + `",`) })
	unknown := poison(t, template, func(r *kgo.Record) { setHeader(r, topics.HeaderType, "mailplane.mailbox.exploded.v1") })
	plaintext := poison(t, template, func(r *kgo.Record) {
		var m map[string]any
		must(t, json.Unmarshal(r.Value, &m))
		delete(m, "sealed_credentials")
		m["credentials"] = map[string]string{"password": "hunter2"}
		v, err := json.Marshal(m)
		must(t, err)
		r.Value = v
	})
	first := e.produce(before)[0]
	poisons := []*kgo.Record{missing, badJSON, unknown, plaintext}
	e.produceRaw(poisons...)
	e.produce(after)

	p, reg := e.projector(e.db.Pool, projections.NewRegistry())
	start(t, p)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)

	var state string
	var addedAt *time.Time
	must(t, e.db.Pool.QueryRow(t.Context(), `SELECT health_state, added_at FROM mailboxes WHERE mailbox_id = $1`, mailbox).Scan(&state, &addedAt))
	if state != "throttled" || addedAt == nil || !addedAt.Equal(before.Time) {
		t.Fatalf("events around the poison not projected: state %s, added_at %v", state, addedAt)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	entries, err := dlq.List(ctx, e.kcfg, 0)
	must(t, err)
	if len(entries) != len(poisons) {
		t.Fatalf("%d dead letters, want %d: %+v", len(entries), len(poisons), entries)
	}
	wantCodes := []domain.Code{domain.CodeMissingHeader, domain.CodeMalformedJSON, domain.CodeUnknownType, domain.CodePlaintextSecret}
	slices.SortFunc(entries, func(a, b dlq.Entry) int { return int(a.SourceOffset - b.SourceOffset) })
	for i, en := range entries {
		src := poisons[i]
		if en.SourceTopic != e.kcfg.Topic(topics.MailboxEvents) || en.SourcePartition != first.Partition || en.SourceOffset != first.Offset+1+int64(i) ||
			en.Consumer != projections.RegistryName || en.ErrorCode != wantCodes[i] || en.Attempts != 1 || en.Error == "" ||
			string(en.Key) != mailbox {
			t.Errorf("dead letter %d: %+v", i, en)
		}
		if len(en.Headers) != len(src.Headers) {
			t.Errorf("dead letter %d: %d original headers, want %d", i, len(en.Headers), len(src.Headers))
		}
		if got := counter(t, reg, "mailplane_dlq_records_total", "projector", "registry", "code", string(wantCodes[i])); got != 1 {
			t.Errorf("dlq metric for %s = %v", wantCodes[i], got)
		}
	}
	pt := entries[3]
	if pt.ValueWithheld != dlq.WithheldPlaintextSecret || len(pt.Value) != 0 {
		t.Errorf("plaintext secret not withheld: %+v", pt)
	}
	for _, en := range entries[:3] {
		if en.ValueWithheld != "" || len(en.Value) == 0 {
			t.Errorf("value of a harmless poison record withheld: %+v", en)
		}
	}
	for _, en := range entries {
		if strings.Contains(string(en.Value), "hunter2") || strings.Contains(en.Error, "hunter2") {
			t.Fatalf("secret in the DLQ: %+v", en)
		}
	}
}

// failing wraps the registry and rejects (permanently) every batch holding
// one of bad, and fails transiently the first transient calls.
type failing struct {
	*projections.Registry
	bad       map[string]bool
	transient atomic.Int32
}

func (f *failing) Apply(ctx context.Context, tx pgx.Tx, recs []projections.Record) error {
	if f.transient.Add(-1) >= 0 {
		return errors.New("connection reset (simulated)")
	}
	for _, r := range recs {
		if f.bad[r.Event.ID] {
			return domain.Errorf(domain.CodeConflict, "event %s cannot be applied (simulated)", r.Event.ID)
		}
	}
	return f.Registry.Apply(ctx, tx, recs)
}

// TestApplyFailureGoesToDLQ has the projection reject one event: it is
// isolated, tried Attempts times, dead-lettered, and the rest applied.
func TestApplyFailureGoesToDLQ(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(6, 1)
	mailbox := g.mailboxes[0]
	var events []domain.Event
	for i := range 50 {
		events = append(events, g.event(&domain.MailboxHealthScored{MailboxID: mailbox, State: domain.HealthWatch, Score: float64(i), Reason: "r"}))
	}
	bad := events[20]
	recs := e.produce(events...)

	f := &failing{Registry: projections.NewRegistry(), bad: map[string]bool{bad.ID: true}}
	f.transient.Store(2)
	p, reg := e.projector(e.db.Pool, f, projections.WithRetry(projections.RetryPolicy{Attempts: 3, Backoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}))
	start(t, p)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)

	if n := count(t, e.db.Pool, `SELECT count(*) FROM applied_events`); n != len(events)-1 {
		t.Fatalf("applied %d, want %d", n, len(events)-1)
	}
	if n := count(t, e.db.Pool, `SELECT count(*) FROM applied_events WHERE event_id = $1`, bad.ID); n != 0 {
		t.Fatal("the rejected event is recorded as applied")
	}
	var score float64
	must(t, e.db.Pool.QueryRow(t.Context(), `SELECT health_score FROM mailboxes WHERE mailbox_id = $1`, mailbox).Scan(&score))
	if score != 49 {
		t.Fatalf("score %v, want the last event's 49", score)
	}
	entries, err := dlq.List(t.Context(), e.kcfg, 0)
	must(t, err)
	if len(entries) != 1 {
		t.Fatalf("%d dead letters, want 1", len(entries))
	}
	en := entries[0]
	if en.SourceOffset != recs[20].Offset || en.ErrorCode != domain.CodeConflict || en.Attempts != 3 || en.ValueWithheld != "" {
		t.Fatalf("dead letter: %+v", en)
	}
	if id, _ := en.Header(topics.HeaderID); id != bad.ID {
		t.Fatalf("dead letter is %s, want %s", id, bad.ID)
	}
	if got := counter(t, reg, "mailplane_projector_retries_total", "projector", "registry", "kind", "transient"); got < 2 {
		t.Fatalf("transient retries = %v, want >= 2", got)
	}
	if got := counter(t, reg, "mailplane_dlq_records_total", "projector", "registry", "code", "conflict"); got != 1 {
		t.Fatalf("dlq metric = %v", got)
	}
}

// TestResumeFromPostgresOffsets restarts a projector after moving the
// group's committed offsets both ways: it resumes from Postgres regardless.
func TestResumeFromPostgresOffsets(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(7, 10)
	first := g.events(300)
	e.produce(first...)

	p, _ := e.projector(e.db.Pool, projections.NewRegistry())
	stop := start(t, p)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	stop()

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cl, err := kafka.NewClient(kafka.Config{Brokers: e.kcfg.Brokers}, kafka.KindAdmin)
	must(t, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	group := e.kcfg.Group(projections.GroupName(projections.RegistryName))

	// On leaving, the projector told Kafka where Postgres got to, for lag
	// dashboards.
	pg, err := pgOffsets(ctx, e.db.Pool, projections.RegistryName)
	must(t, err)
	committed, err := adm.FetchOffsets(ctx, group)
	must(t, err)
	for k, next := range pg {
		if o, ok := committed.Lookup(k.topic, k.partition); !ok || o.At != next {
			t.Errorf("Kafka committed offset of %s[%d] = %+v, want %d", k.topic, k.partition, o, next)
		}
	}

	second := g.events(300)
	e.produce(second...)
	// Lie to Kafka: half the partitions back to 0 (would re-read), the
	// rest to the end (would skip the second batch).
	ends := endOffsets(t, e.kcfg, domainTopics)
	offs := kadm.Offsets{}
	i := 0
	for k, end := range ends {
		at := end
		if i%2 == 0 {
			at = 0
		}
		offs.Add(kadm.Offset{Topic: e.kcfg.Topic(k.topic), Partition: k.partition, At: at, LeaderEpoch: -1})
		i++
	}
	resp, err := adm.CommitOffsets(ctx, group, offs)
	must(t, err)
	must(t, resp.Error())

	p2, reg2 := e.projector(e.db.Pool, projections.NewRegistry())
	start(t, p2)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	if n := count(t, e.db.Pool, `SELECT count(*) FROM applied_events`); n != len(first)+len(second) {
		t.Fatalf("applied %d events, want %d", n, len(first)+len(second))
	}
	settledCounter(t, reg2, float64(len(second)), "mailplane_projector_records_applied_total", "projector", "registry")
	if got := counter(t, reg2, "mailplane_projector_duplicates_skipped_total", "projector", "registry"); got != 0 {
		t.Fatalf("restart re-read %v applied events: it followed Kafka's offsets", got)
	}
	if got := counter(t, reg2, "mailplane_projector_records_applied_total", "projector", "registry"); got != float64(len(second)) {
		t.Fatalf("restart applied %v, want %d", got, len(second))
	}
}

// TestTwoMembers runs two projectors in one group over one schema while
// events flow: partitions move between them, and every event is applied
// exactly once.
func TestTwoMembers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(8, 50)
	events := g.events(2000)

	p1, _ := e.projector(e.db.Pool, projections.NewRegistry(), projections.WithBatchSize(50))
	start(t, p1)
	e.produce(events[:1000]...)
	p2, _ := e.projector(e.db.Pool, projections.NewRegistry(), projections.WithBatchSize(50))
	stop2 := start(t, p2)
	e.produce(events[1000:1500]...)
	stop2()
	e.produce(events[1500:]...)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	if n := count(t, e.db.Pool, `SELECT count(*) FROM applied_events`); n != len(events) {
		t.Fatalf("applied %d, want %d", n, len(events))
	}

	// The same log into a fresh schema by one member: identical rows.
	fresh := newDB(t)
	p3, _ := e.projector(fresh, projections.NewRegistry(), projections.WithGroup(withGroupName(testGroup, "replay")))
	start(t, p3)
	waitCaughtUp(t, e.kcfg, fresh, projections.RegistryName, domainTopics, catchUp)
	if a, b := registryChecksum(t, e.db.Pool), registryChecksum(t, fresh); a != b {
		t.Fatalf("two members and one member disagree: %s != %s", a, b)
	}
}

// TestConcurrency projects one log, with producer retries in it, one
// transaction at a time and with four in flight, in small batches while
// the log is still being written (so that lanes poll mid-round and find
// their partitions busy): identical rows, every distinct event applied
// once, every retry recognised.
func TestConcurrency(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(13, 40)
	events := g.events(3000)
	for i := 0; i < 3000; i += 10 {
		events = append(events, events[i]) // a producer retry
	}
	var sums []string
	for _, n := range []int{1, 4} {
		db := newDB(t)
		var mu sync.Mutex
		seen := map[string]int{}
		p, reg := e.projector(db, projections.NewRegistry(), projections.WithConcurrency(n), projections.WithBatchSize(60),
			projections.WithGroup(withGroupName(testGroup, fmt.Sprintf("concurrency-%d", n))),
			projections.WithCommitted(func(evs []domain.Event) {
				mu.Lock()
				defer mu.Unlock()
				for _, ev := range evs {
					seen[ev.ID]++
				}
			}))
		stop := start(t, p)
		if n == 1 {
			e.produce(events...)
		}
		waitCaughtUp(t, e.kcfg, db, projections.RegistryName, domainTopics, catchUp)
		stop()
		if got := count(t, db, `SELECT count(*) FROM applied_events`); got != 3000 {
			t.Errorf("concurrency %d: %d events applied, want 3000", n, got)
		}
		if got := counter(t, reg, "mailplane_projector_duplicates_skipped_total", "projector", "registry"); got != 300 {
			t.Errorf("concurrency %d: %v duplicates skipped, want 300", n, got)
		}
		mu.Lock()
		for id, k := range seen {
			if k != 1 {
				t.Errorf("concurrency %d: event %s committed %d times", n, id, k)
			}
		}
		if len(seen) != 3000 {
			t.Errorf("concurrency %d: %d events committed, want 3000", n, len(seen))
		}
		mu.Unlock()
		sums = append(sums, registryChecksum(t, db))
	}
	if sums[0] != sums[1] {
		t.Fatalf("one and four transactions in flight disagree: %s != %s", sums[0], sums[1])
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	kcfg := kafka.Config{Brokers: []string{"127.0.0.1:1"}}
	db := newDB(t)
	if _, err := projections.New(kcfg, nil, projections.NewRegistry()); err == nil {
		t.Error("nil pool accepted")
	}
	if _, err := projections.New(kcfg, db, nil); err == nil {
		t.Error("nil projection accepted")
	}
	if _, err := projections.New(kafka.Config{}, db, projections.NewRegistry()); err == nil {
		t.Error("no brokers accepted")
	}
}

// TestRunAndClose: Close stops a running Run (which leaves the group and
// returns nil), a second Run at once is refused, and Run after Close fails.
func TestRunAndClose(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p, _ := e.projector(e.db.Pool, projections.NewRegistry())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	e.produce(newGen(9, 2).events(20)...)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	if err := p.Run(t.Context()); err == nil {
		t.Error("a second concurrent Run was accepted")
	}
	p.Close()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	p.Close() // idempotent
	if err := p.Run(t.Context()); !errors.Is(err, projections.ErrClosed) {
		t.Fatalf("Run after Close: %v", err)
	}
}

// blocking fails transiently, as a database outage would, every batch
// touching mailbox while blocked is set.
type blocking struct {
	*projections.Registry
	mailbox string
	blocked atomic.Bool
}

func (b *blocking) Apply(ctx context.Context, tx pgx.Tx, recs []projections.Record) error {
	if b.blocked.Load() {
		for _, r := range recs {
			if r.Event.Subject == b.mailbox {
				return errors.New("database unavailable (simulated)")
			}
		}
	}
	return b.Registry.Apply(ctx, tx, recs)
}

// TestRebalanceWhileRetrying keeps one partition failing, so that many
// rounds start from a poll that returned nothing (a retry falling due),
// while records flow on other partitions and members join and leave: no
// round may wait for a rebalance that waits for the round.
func TestRebalanceWhileRetrying(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(14, 200)
	stuck := g.mailboxes[0]
	b := &blocking{Registry: projections.NewRegistry(), mailbox: stuck}
	b.blocked.Store(true)
	retry := projections.WithRetry(projections.RetryPolicy{Backoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond})
	p1, _ := e.projector(e.db.Pool, b, projections.WithBatchSize(20), retry)
	stop1 := start(t, p1)
	e.produce(g.event(&domain.MailboxHealthScored{MailboxID: stuck, State: domain.HealthHealthy, Score: 99, Reason: "ok"}))

	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			e.produce(g.events(20)...)
			time.Sleep(2 * time.Millisecond)
		}
	})
	for range 4 {
		p2, _ := e.projector(e.db.Pool, b, projections.WithBatchSize(20), retry)
		stop2 := start(t, p2)
		time.Sleep(700 * time.Millisecond)
		stop2()
		time.Sleep(300 * time.Millisecond)
	}
	close(done)
	wg.Wait()
	b.blocked.Store(false)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	stop1()
}

// TestStuckPartition keeps one partition failing while hundreds of records
// arrive for it: it is paused rather than blocking the others, its lag
// shows, and once it recovers every record is applied once.
func TestStuckPartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(10, 40)
	stuck := g.mailboxes[0]
	health := func(id string) domain.Event {
		return g.event(&domain.MailboxHealthScored{MailboxID: id, State: domain.HealthHealthy, Score: 99, Reason: "ok"})
	}
	probe := e.produce(health(stuck))[0]
	var other string
	for _, id := range g.mailboxes[1:] {
		if r := e.produce(health(id))[0]; r.Partition != probe.Partition {
			other = id
			break
		}
	}
	if other == "" {
		t.Fatal("no mailbox on another partition")
	}
	b := &blocking{Registry: projections.NewRegistry(), mailbox: stuck}
	b.blocked.Store(true)
	p, reg := e.projector(e.db.Pool, b, projections.WithBatchSize(10),
		projections.WithRetry(projections.RetryPolicy{Backoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}))
	start(t, p)

	var stuckEvents, otherEvents []domain.Event
	for range 300 {
		stuckEvents = append(stuckEvents, health(stuck))
	}
	for range 50 {
		otherEvents = append(otherEvents, health(other))
	}
	e.produce(stuckEvents...)
	e.produce(otherEvents...)
	waitFor(t, catchUp, "the healthy partition to be applied", func() (bool, error) {
		return count(t, e.db.Pool, `SELECT count(*) FROM mailboxes WHERE mailbox_id = $1`, other) == 1 &&
			count(t, e.db.Pool, `SELECT count(*) FROM applied_events WHERE event_id = $1`, otherEvents[49].ID) == 1, nil
	})
	if n := count(t, e.db.Pool, `SELECT count(*) FROM mailboxes WHERE mailbox_id = $1`, stuck); n != 0 {
		t.Fatal("the stuck mailbox was applied")
	}
	// The stuck partition's lag shows on its own series, in records and in
	// seconds that keep growing; the healthy partition's stays 0.
	stuckPart, otherPart := strconv.Itoa(int(probe.Partition)), ""
	for _, r := range e.produce(health(other)) {
		otherPart = strconv.Itoa(int(r.Partition))
	}
	waitFor(t, 10*time.Second, "lag of the stuck partition to show", func() (bool, error) {
		return counter(t, reg, "mailplane_consumer_lag_records", "consumer", "registry", "topic", e.kcfg.Topic(topics.MailboxEvents), "partition", stuckPart) >= 300, nil
	})
	first := counter(t, reg, "mailplane_consumer_lag_seconds", "consumer", "registry", "topic", e.kcfg.Topic(topics.MailboxEvents), "partition", stuckPart)
	waitFor(t, 10*time.Second, "the stuck partition's seconds behind to grow", func() (bool, error) {
		return counter(t, reg, "mailplane_consumer_lag_seconds", "consumer", "registry", "topic", e.kcfg.Topic(topics.MailboxEvents), "partition", stuckPart) > first+0.5, nil
	})
	waitFor(t, 10*time.Second, "the healthy partition to show no lag", func() (bool, error) {
		return counter(t, reg, "mailplane_consumer_lag_records", "consumer", "registry", "topic", e.kcfg.Topic(topics.MailboxEvents), "partition", otherPart) == 0, nil
	})
	b.blocked.Store(false)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	want := 1 + len(stuckEvents) + len(otherEvents)
	if n := count(t, e.db.Pool, `SELECT count(*) FROM applied_events`); n < want {
		t.Fatalf("applied %d, want at least %d", n, want)
	}
	if got := counter(t, reg, "mailplane_projector_duplicates_skipped_total", "projector", "registry"); got != 0 {
		t.Fatalf("%v duplicates", got)
	}
	if got := counter(t, reg, "mailplane_dlq_records_total"); got != 0 {
		t.Fatalf("%v dead letters from transient failures", got)
	}
}

// TestRegistryStagingAcrossTransactions applies on one connection after a
// rolled-back transaction (which takes its staging tables with it) and then
// again (staging tables reused): the prepared merges keep working.
func TestRegistryStagingAcrossTransactions(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	ctx := t.Context()
	conn, err := pool.Acquire(ctx)
	must(t, err)
	defer conn.Release()
	g := newGen(11, 3)
	reg := projections.NewRegistry()
	// New keys go straight into the tables; the keys exist from here on, so
	// the next batches go through the staging tables.
	must(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return reg.Apply(ctx, tx, asRecords(g.events(50))) }))
	tx, err := conn.Begin(ctx)
	must(t, err)
	must(t, reg.Apply(ctx, tx, asRecords(g.events(50))))
	must(t, tx.Rollback(ctx))
	for range 3 {
		must(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return reg.Apply(ctx, tx, asRecords(g.events(50))) }))
	}
	if n := count(t, pool, `SELECT (SELECT count(*) FROM mailboxes) + (SELECT count(*) FROM orgs) + (SELECT count(*) FROM users) + (SELECT count(*) FROM workers)`); n == 0 {
		t.Fatal("nothing applied")
	}
	var leftover int
	must(t, conn.QueryRow(ctx, `SELECT count(*) FROM registry_stage_mailboxes`).Scan(&leftover))
	if leftover != 0 {
		t.Fatalf("%d rows left in staging after commit", leftover)
	}
}

// TestOneTransactionPerPoll projects a backlog spread over the partitions
// of every domain topic: the records of a poll, across partitions, share a
// transaction per lane, which moves every partition's offset.
func TestOneTransactionPerPoll(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	recs := e.produce(newGen(12, 200).events(1000)...)
	parts := map[tp]bool{}
	for _, r := range recs {
		parts[tp{r.Topic, r.Partition}] = true
	}
	var txs atomic.Int32
	p, _ := e.projector(e.db.Pool, projections.NewRegistry(),
		projections.WithCommitted(func([]domain.Event) { txs.Add(1) }))
	start(t, p)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	if n := txs.Load(); n > 4 {
		t.Fatalf("%d transactions for %d records over %d partitions", n, len(recs), len(parts))
	}
	if len(parts) < 20 {
		t.Fatalf("the records landed on only %d partitions", len(parts))
	}
}

// TestApplyFailureAcrossPartitions has the projection reject one event of a
// batch spanning many partitions: only that event goes to the DLQ, every
// other one is applied, and each mailbox ends on its last event.
func TestApplyFailureAcrossPartitions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(13, 60)
	var events []domain.Event
	for i := range 300 {
		events = append(events, g.event(&domain.MailboxHealthScored{MailboxID: g.mailboxes[i%60], State: domain.HealthWatch, Score: float64(i) / 10, Reason: "r"}))
	}
	bad := events[137]
	recs := e.produce(events...)

	f := &failing{Registry: projections.NewRegistry(), bad: map[string]bool{bad.ID: true}}
	p, _ := e.projector(e.db.Pool, f, projections.WithRetry(projections.RetryPolicy{Attempts: 3, Backoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}))
	start(t, p)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)

	if n := count(t, e.db.Pool, `SELECT count(*) FROM applied_events`); n != len(events)-1 {
		t.Fatalf("applied %d, want %d", n, len(events)-1)
	}
	for i, id := range g.mailboxes {
		var score float64
		must(t, e.db.Pool.QueryRow(t.Context(), `SELECT health_score FROM mailboxes WHERE mailbox_id = $1`, id).Scan(&score))
		if want := float64(240+i) / 10; score != want {
			t.Errorf("mailbox %d: score %v, want its last event's %v", i, score, want)
		}
	}
	entries, err := dlq.List(t.Context(), e.kcfg, 0)
	must(t, err)
	if len(entries) != 1 || entries[0].SourceOffset != recs[137].Offset || entries[0].SourcePartition != recs[137].Partition || entries[0].Attempts != 3 {
		t.Fatalf("dead letters: %+v", entries)
	}
}

// TestLockedRowHoldsUpOnlyItsPartition has another session hold a row the
// projector must update: the transaction gives up on the lock, and the
// other partitions are applied while that one waits.
func TestLockedRowHoldsUpOnlyItsPartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(14, 40)
	health := func(id string, score float64) domain.Event {
		return g.event(&domain.MailboxHealthScored{MailboxID: id, State: domain.HealthHealthy, Score: score, Reason: "ok"})
	}
	locked := g.mailboxes[0]
	probe := e.produce(health(locked, 1))[0]
	var others []string
	for _, id := range g.mailboxes[1:] {
		if r := e.produce(health(id, 1))[0]; r.Partition != probe.Partition {
			others = append(others, id)
		}
	}
	p, _ := e.projector(e.db.Pool, projections.NewRegistry(),
		projections.WithRetry(projections.RetryPolicy{Backoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}))
	start(t, p)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)

	// An operator's open transaction holds the row.
	ctx := t.Context()
	conn, err := e.db.Pool.Acquire(ctx)
	must(t, err)
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	must(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM mailboxes WHERE mailbox_id = $1 FOR UPDATE`, locked)
	must(t, err)

	e.produce(health(locked, 2))
	for _, id := range others {
		e.produce(health(id, 2))
	}
	waitFor(t, 20*time.Second, "the other partitions to be applied", func() (bool, error) {
		return count(t, e.db.Pool, `SELECT count(*) FROM mailboxes WHERE health_score = 2`) == len(others), nil
	})
	if n := count(t, e.db.Pool, `SELECT count(*) FROM mailboxes WHERE mailbox_id = $1 AND health_score = 2`, locked); n != 0 {
		t.Fatal("the locked row was updated under its lock")
	}
	must(t, tx.Rollback(ctx))
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	if n := count(t, e.db.Pool, `SELECT count(*) FROM mailboxes WHERE mailbox_id = $1 AND health_score = 2`, locked); n != 1 {
		t.Fatal("the locked row was not updated once free")
	}
}

// hanging hangs, as a stuck database would, every Apply touching mailbox,
// until its context ends.
type hanging struct {
	*projections.Registry
	mailbox string
	entered chan struct{}
	once    sync.Once
}

func (h *hanging) Apply(ctx context.Context, tx pgx.Tx, recs []projections.Record) error {
	for _, r := range recs {
		if r.Event.Subject == h.mailbox {
			h.once.Do(func() { close(h.entered) })
			<-ctx.Done()
			return ctx.Err()
		}
	}
	return h.Registry.Apply(ctx, tx, recs)
}

// TestHungApplyDoesNotBlockRebalance hangs a member's transaction: a second
// member joining still gets its share of the partitions (the transaction is
// canceled after the revoke grace), and stopping the hung member is quick.
func TestHungApplyDoesNotBlockRebalance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(15, 40)
	health := func(id string) domain.Event {
		return g.event(&domain.MailboxHealthScored{MailboxID: id, State: domain.HealthHealthy, Score: 1, Reason: "ok"})
	}
	h := &hanging{Registry: projections.NewRegistry(), mailbox: g.mailboxes[0], entered: make(chan struct{})}
	p1, _ := e.projector(e.db.Pool, h, projections.WithRevokeGrace(200*time.Millisecond), projections.WithTxTimeout(10*time.Minute),
		projections.WithRetry(projections.RetryPolicy{Backoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}))
	stop1 := start(t, p1)
	e.produce(health(h.mailbox))
	select {
	case <-h.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the hanging Apply was never called")
	}

	p2, reg2 := e.projector(e.db.Pool, projections.NewRegistry())
	start(t, p2)
	for _, id := range g.mailboxes[1:] {
		e.produce(health(id))
	}
	waitFor(t, 30*time.Second, "the second member to apply events", func() (bool, error) {
		return counter(t, reg2, "mailplane_projector_records_applied_total", "projector", "registry") > 0, nil
	})

	began := time.Now()
	stop1()
	if d := time.Since(began); d > 10*time.Second {
		t.Fatalf("stopping the hung member took %s", d)
	}
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
}

// asRecords gives events positions of their own, for applying them
// directly (the projector passes the log's).
func asRecords(events []domain.Event) []projections.Record {
	recs := make([]projections.Record, len(events))
	for i, ev := range events {
		recs[i] = projections.Record{Event: ev, Topic: "direct", Offset: int64(i)}
	}
	return recs
}

// positioned records where the projector says each event stands in the
// log.
type positioned struct {
	*projections.Registry
	mu  sync.Mutex
	got map[string]projections.Record
}

func (p *positioned) Apply(ctx context.Context, tx pgx.Tx, recs []projections.Record) error {
	p.mu.Lock()
	for _, r := range recs {
		p.got[r.Event.ID] = r
	}
	p.mu.Unlock()
	return p.Registry.Apply(ctx, tx, recs)
}

// TestApplyCarriesRecordPositions: each event reaches Apply with the topic,
// partition and offset it was produced at.
func TestApplyCarriesRecordPositions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(12, 8)
	events := g.events(200)
	produced := e.produce(events...)

	proj := &positioned{Registry: projections.NewRegistry(), got: map[string]projections.Record{}}
	p, _ := e.projector(e.db.Pool, proj)
	start(t, p)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)

	proj.mu.Lock()
	defer proj.mu.Unlock()
	for i, ev := range events {
		r, ok := proj.got[ev.ID]
		switch {
		case !ok:
			t.Fatalf("event %s never reached Apply", ev.ID)
		case r.Event.ID != ev.ID || r.Topic != produced[i].Topic || r.Partition != produced[i].Partition || r.Offset != produced[i].Offset:
			t.Fatalf("event %s at %s/%d@%d, produced at %s/%d@%d", ev.ID, r.Topic, r.Partition, r.Offset,
				produced[i].Topic, produced[i].Partition, produced[i].Offset)
		}
	}
}
