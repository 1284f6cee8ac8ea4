package query_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/internal/query"
)

// counting wraps the pool and records the transactions begun through it.
type counting struct {
	pool  *pgxpool.Pool
	n     atomic.Int32
	wrong atomic.Int32 // begun other than read-only repeatable read
}

func (c *counting) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	c.n.Add(1)
	if o.AccessMode != pgx.ReadOnly || o.IsoLevel != pgx.RepeatableRead {
		c.wrong.Add(1)
	}
	return c.pool.BeginTx(ctx, o)
}

const (
	orgID   = "0190a5b2-4c5e-7b1a-9c3d-00000000a0a1"
	boxA    = "0190a5b2-4c5e-7b1a-9c3d-00000000c0a1"
	boxB    = "0190a5b2-4c5e-7b1a-9c3d-00000000c0a2"
	unknown = "0190a5b2-4c5e-7b1a-9c3d-0000000000ff"
)

// fill folds registry events through the registry projection's own fold
// and takes the sync partition of boxA through the sync fleet's fence.
func fill(t *testing.T, pool *pgxpool.Pool, parts int) {
	t.Helper()
	ctx := t.Context()
	if err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var recs []projections.Record
	add := func(id string, d domain.Data) {
		n := len(recs)
		recs = append(recs, projections.Record{Topic: "direct", Offset: int64(n),
			Event: domain.Event{ID: id, Type: d.EventType(), Time: t0.Add(time.Duration(n) * time.Second), Data: d}})
	}
	added := func(box, addr string) *domain.MailboxAdded {
		return &domain.MailboxAdded{MailboxID: box, OrgID: orgID, UserID: "0190a5b2-4c5e-7b1a-9c3d-00000000b0a1", Address: addr,
			Provider: domain.ProviderSMTPIMAP, IMAP: domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: "implicit", Username: addr}}
	}
	add("0190a5b2-4c5e-7b1a-9c3d-000000000e01", &domain.OrgPlanChanged{OrgID: orgID, Plan: domain.PlanPremium, Paid: true, Source: "test"})
	add("0190a5b2-4c5e-7b1a-9c3d-000000000e02", added(boxA, "a@example.com"))
	add("0190a5b2-4c5e-7b1a-9c3d-000000000e03", added(boxB, "b@example.com"))
	add("0190a5b2-4c5e-7b1a-9c3d-000000000e04", &domain.MailboxDisabled{MailboxID: boxB, Cause: domain.DisableAuthFailing, Reason: "LOGIN refused"})
	// boxB's last health decision carries its evidence; boxA's last one
	// none (written before decisions carried it).
	until := time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC)
	quarantined := func(box string) *domain.MailboxHealthScored {
		end := t0
		return &domain.MailboxHealthScored{MailboxID: box, State: domain.HealthQuarantined, Score: 76, Reason: "spam placement", Until: &until,
			Evidence: &domain.HealthEvidence{WindowSeconds: 7 * 86400, WindowEnd: &end, Inbox: 73, Junk: 23, MinObservations: 20,
				Rate: 23.0 / 96, Rule: domain.HealthRuleLevel, Threshold: &domain.HealthThreshold{Rate: 0.2, State: domain.HealthQuarantined},
				PenaltySeconds: 7 * 86400}}
	}
	add("0190a5b2-4c5e-7b1a-9c3d-000000000e05", quarantined(boxB))
	add("0190a5b2-4c5e-7b1a-9c3d-000000000e06", quarantined(boxA))
	add("0190a5b2-4c5e-7b1a-9c3d-000000000e07", &domain.MailboxHealthScored{MailboxID: boxA, State: domain.HealthWatch, Score: 88, Reason: "older scorer"})
	// Two batches: the last decision, without evidence, clears the stored
	// evidence of the one before.
	last := len(recs) - 1
	for _, batch := range [][]projections.Record{recs[:last], recs[last:]} {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return projections.NewRegistry().Apply(ctx, tx, batch) }); err != nil {
			t.Fatal(err)
		}
	}
	fence := mailsync.NewFence(pool, prometheus.NewCounter(prometheus.CounterOpts{Name: "fenced"}), time.Minute)
	if _, err := fence.Acquire(ctx, "sync-test-1", []int32{query.StatePartition(boxA, parts)}); err != nil {
		t.Fatal(err)
	}
}

func TestMailboxAndOrgFacts(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const parts = 8
	fill(t, db.Pool, parts)
	c := &counting{pool: db.Pool}
	now := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	r := query.NewReader(c, parts, query.WithClock(func() time.Time { return now }))
	ctx := t.Context()

	a, err := r.Mailbox(ctx, boxA)
	if err != nil {
		t.Fatal(err)
	}
	if n := c.n.Load(); n != 1 {
		t.Errorf("a mailbox read began %d transactions, want one snapshot", n)
	}
	if a.Registry == nil || a.Registry.Address != "a@example.com" || a.Registry.OrgID != orgID || a.Registry.DisabledAt != nil {
		t.Errorf("boxA registry: %+v", a.Registry)
	}
	if a.Sync.Partition != query.StatePartition(boxA, parts) || a.Sync.Owner != "sync-test-1" || a.Sync.Epoch != 1 || a.Sync.OwnerSince == nil {
		t.Errorf("boxA sync: %+v", a.Sync)
	}
	if a.Placement.Placed || a.Health != nil || a.Sync.LastSyncAt != nil || a.Sync.Tier != nil {
		t.Errorf("boxA has facts nobody wrote: placed %v health %+v sync %+v", a.Placement.Placed, a.Health, a.Sync)
	}
	// Empty lists are [] for scripts, never null.
	b, _ := json.Marshal(a)
	if !strings.Contains(string(b), `"history":[]`) || !strings.Contains(string(b), `"folders":[]`) {
		t.Errorf("boxA JSON: %s", b)
	}

	bb, err := r.Mailbox(ctx, boxB)
	if err != nil {
		t.Fatal(err)
	}
	if d := bb.HealthDecision; d == nil || d.State != "quarantined" || d.Until == nil || d.Evidence == nil || d.Evidence.Total != 96 ||
		d.Evidence.Rule != domain.HealthRuleLevel || d.Sentence != "quarantined until 8 Mar 2026 12:00 UTC: 23 of 96 warmup messages (24 %) landed in spam over the last 7 days; the quarantine level is 20 %" {
		t.Errorf("boxB health decision: %+v", d)
	}
	if b, _ := json.Marshal(bb.HealthDecision); !strings.Contains(string(b), `"total":96`) || !strings.Contains(string(b), `"threshold":{"rate":0.2,"state":"quarantined"}`) {
		t.Errorf("boxB health decision JSON: %s", b)
	}
	if d := a.HealthDecision; d == nil || d.State != "watch" || d.Until != nil || d.Evidence != nil || d.Sentence != "on watch" {
		t.Errorf("boxA health decision without evidence: %+v", d)
	}
	if bb.Registry == nil || bb.Registry.DisabledAt == nil || bb.Registry.DisabledReason != "auth_failing: LOGIN refused" {
		t.Errorf("boxB disabled: %+v", bb.Registry)
	}

	o, err := r.Org(ctx, orgID)
	if err != nil {
		t.Fatal(err)
	}
	if o.Plan == nil || o.Plan.Plan != "premium" || !o.Plan.Paid || o.Mailboxes != 2 || o.Disabled != 1 || o.Health["unscored"] != 2 ||
		len(o.List) != 2 || o.List[0].ID != boxA || o.List[1].DisabledReason == "" || o.Class != "free" || o.Truncated {
		t.Errorf("org: %+v", o)
	}

	w, err := r.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(w); !strings.Contains(string(b), `"workers":[]`) || !strings.Contains(string(b), `"pools":[]`) {
		t.Errorf("workers JSON of an empty fleet: %s", b)
	}
	if n := c.wrong.Load(); n != 0 {
		t.Errorf("%d transactions were not read-only repeatable read", n)
	}

	for _, tc := range []struct {
		what string
		err  error
	}{
		{"unknown mailbox", func() error { _, err := r.Mailbox(ctx, unknown); return err }()},
		{"unknown org", func() error { _, err := r.Org(ctx, unknown); return err }()},
	} {
		if domain.ErrorCode(tc.err) != domain.CodeNotFound {
			t.Errorf("%s: %v, want not_found", tc.what, tc.err)
		}
	}
	before := c.n.Load()
	for _, id := range []string{"", "x", strings.ToUpper(boxA), boxA + "\n", "<script>", boxA[:35] + "\x00", strings.Repeat("0", 4096)} {
		if _, err := r.Mailbox(ctx, id); domain.ErrorCode(err) != domain.CodeInvalid {
			t.Errorf("mailbox id %.40q: %v, want invalid", id, err)
		}
		if _, err := r.Org(ctx, id); domain.ErrorCode(err) != domain.CodeInvalid {
			t.Errorf("org id %.40q: %v, want invalid", id, err)
		}
	}
	if c.n.Load() != before {
		t.Error("an invalid id reached the database")
	}
}

// A database that does not answer is an error, not an empty answer.
func TestReaderDatabaseDown(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r := query.NewReader(pool, 8)
	if _, err := r.Mailbox(t.Context(), boxA); err == nil || errors.Is(err, query.ErrNotFound) {
		t.Errorf("mailbox with the database down: %v", err)
	}
	if _, err := r.Workers(t.Context()); err == nil {
		t.Error("workers with the database down: no error")
	}
}
