package billing_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/billing"
	"github.com/mailplane/mailplane/topics"
)

// subEvent is a subscription event of sub created at c.
func subEvent(t testing.TB, id, sub string, c time.Time, status, price string) []byte {
	ev := stripeEvent(id, billing.EventSubscriptionUpdated, set(subscriptionObject(status, item(price)), "id", sub))
	ev["created"] = c.Unix()
	return mustJSON(t, ev)
}

// staleRows returns the recorded stale events of sub, by event id.
func (e *env) staleRows(sub string) map[string]string {
	e.t.Helper()
	rows, err := e.db.Pool.Query(context.Background(),
		`SELECT event_id, applied_event_id FROM billing_stale_events WHERE subscription_id = $1`, sub)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var id, applied string
		if err := rows.Scan(&id, &applied); err != nil {
			e.t.Fatal(err)
		}
		out[id] = applied
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// TestWebhookOlderEventIgnored: Stripe delivers an upgrade, then the older
// event that preceded it (a cancellation, created a minute earlier). The
// older one is answered 200 ignored, recorded, counted, and nothing is
// produced for it: the org stays on the newer plan. A retry of the newer
// event is applied again (same event id: it dedupes downstream).
func TestWebhookOlderEventIgnored(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	e := newEnv(t, testConfig(), billing.WithRegisterer(reg))
	const sub = "sub_Order1"
	newer := subEvent(t, "evt_2Upgrade", sub, created, "active", "price_premium_monthly")
	older := subEvent(t, "evt_1Cancel", sub, created.Add(-time.Minute), "canceled", "price_premium_monthly")

	ev, _ := e.accepted("newer", req{body: newer})
	if pc := ev.Data.(*domain.OrgPlanChanged); pc.Plan != domain.PlanPremium {
		t.Fatalf("newer event: plan %s", pc.Plan)
	}
	e.start = e.endOffsets()
	resp, b := e.do(req{body: older})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("older event: status %d: %s", resp.StatusCode, b)
	}
	ir := decodeStrict[billing.IgnoredResponse](t, b)
	if ir.Status != "ignored" || ir.EventID != "evt_1Cancel" {
		t.Errorf("older event: %s", b)
	}
	e.assertNothingProduced()
	if got := e.staleRows(sub); len(got) != 1 || got["evt_1Cancel"] != "evt_2Upgrade" {
		t.Errorf("stale events recorded: %v", got)
	}
	if got := counterValue(t, reg, "mailplane_billing_stale_events_total"); got != 1 {
		t.Errorf("mailplane_billing_stale_events_total = %v", got)
	}
	// Delivered again, still ignored, still recorded once.
	if resp, b := e.do(req{body: older}); resp.StatusCode != http.StatusOK {
		t.Fatalf("older event again: %d %s", resp.StatusCode, b)
	}
	e.assertNothingProduced()
	if got := e.staleRows(sub); len(got) != 1 {
		t.Errorf("stale events recorded: %v", got)
	}
	retry, _ := e.accepted("newer, retried", req{body: newer})
	if retry.ID != ev.ID {
		t.Errorf("retry id %s, first %s", retry.ID, ev.ID)
	}
	// Another subscription is not held back by this one's order.
	e.accepted("another subscription's older event", req{body: subEvent(t, "evt_0Other", "sub_Order2", created.Add(-time.Hour), "active", "price_premium_monthly")})
}

func counterValue(t testing.TB, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// TestWebhookSameCreatedTieBreak: two events created in the same second are
// ordered by event id, whichever arrives first.
func TestWebhookSameCreatedTieBreak(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testConfig())
	a := subEvent(t, "evt_A", "sub_Tie1", created, "canceled", "price_premium_monthly")
	b := subEvent(t, "evt_B", "sub_Tie1", created, "active", "price_premium_monthly")
	e.accepted("B first", req{body: b})
	e.start = e.endOffsets()
	if resp, body := e.do(req{body: a}); resp.StatusCode != http.StatusOK {
		t.Fatalf("A after B: %d %s", resp.StatusCode, body)
	}
	e.assertNothingProduced()

	a2 := subEvent(t, "evt_A", "sub_Tie2", created, "canceled", "price_premium_monthly")
	b2 := subEvent(t, "evt_B", "sub_Tie2", created, "active", "price_premium_monthly")
	e.accepted("A first", req{body: a2})
	e.accepted("B after A", req{body: b2})
}

// TestWebhookConcurrentDeliveries: eight events of one subscription, a
// second apart, delivered all at once. The subscription's row lock orders
// them: in the log, the plan changes produced are in strictly increasing
// created order and end with the newest; every other delivery was
// answered 200 ignored and recorded.
func TestWebhookConcurrentDeliveries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testConfig())
	const n = 8
	const sub = "sub_Concurrent"
	bodies := make([][]byte, n)
	for i := range n {
		status := "active"
		if i%2 == 1 {
			status = "canceled"
		}
		bodies[i] = subEvent(t, fmt.Sprintf("evt_C%d", i), sub, created.Add(time.Duration(i)*time.Second), status, "price_premium_monthly")
	}
	type answer struct {
		status int
		body   []byte
		err    error
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			hr, err := http.NewRequest(http.MethodPost, e.base+"/v1/webhooks/billing", bytes.NewReader(bodies[i]))
			if err != nil {
				answers[i].err = err
				return
			}
			hr.Header.Set(billing.SignatureHeader, billing.Sign(bodies[i], signedAt, secretCurrent))
			resp, err := e.http.Do(hr)
			if err != nil {
				answers[i].err = err
				return
			}
			defer resp.Body.Close()
			answers[i].status = resp.StatusCode
			answers[i].body, answers[i].err = io.ReadAll(resp.Body)
		})
	}
	close(start)
	wg.Wait()

	var receipts []api.Receipt
	ignored := map[string]bool{}
	for i, a := range answers {
		switch {
		case a.err != nil:
			t.Fatalf("delivery %d: %v", i, a.err)
		case a.status == http.StatusAccepted:
			receipts = append(receipts, decodeStrict[api.AcceptedResponse](t, a.body).Events[0])
		case a.status == http.StatusOK:
			ignored[decodeStrict[billing.IgnoredResponse](t, a.body).EventID] = true
		default:
			t.Fatalf("delivery %d: %d %s", i, a.status, a.body)
		}
	}
	if got := e.produced()[topics.OrgEvents]; got != int64(len(receipts)) {
		t.Fatalf("%d records produced, %d deliveries accepted", got, len(receipts))
	}
	slices.SortFunc(receipts, func(a, b api.Receipt) int { return int(a.Offset - b.Offset) })
	var prev time.Time
	for _, rc := range receipts {
		ev, err := topics.Decode(e.fetch(rc.Topic, rc.Partition, rc.Offset))
		if err != nil {
			t.Fatal(err)
		}
		if !ev.Time.After(prev) {
			t.Fatalf("plan change created %s produced after one created %s", ev.Time, prev)
		}
		prev = ev.Time
	}
	if newest := created.Add((n - 1) * time.Second); !prev.Equal(newest) {
		t.Fatalf("the last plan change produced was created %s, want the newest %s", prev, newest)
	}
	stale := e.staleRows(sub)
	if len(stale) != len(ignored) || len(ignored)+len(receipts) != n {
		t.Fatalf("%d accepted, %d ignored, %d recorded stale", len(receipts), len(ignored), len(stale))
	}
	for id := range ignored {
		if _, ok := stale[id]; !ok {
			t.Errorf("ignored %s not recorded", id)
		}
	}
	var last string
	if err := e.db.Pool.QueryRow(context.Background(), `SELECT event_id FROM billing_subscriptions WHERE subscription_id = $1`, sub).Scan(&last); err != nil || last != fmt.Sprintf("evt_C%d", n-1) {
		t.Fatalf("last applied %q (%v)", last, err)
	}
}
