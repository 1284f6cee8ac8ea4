package billing_test

import (
	"bytes"
	"cmp"
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
	"github.com/mailplane/mailplane/internal/apitest"
	"github.com/mailplane/mailplane/internal/billing"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/topics"
)

// subEvent is a subscription event of sub, of the test's org, created at c.
func subEvent(t testing.TB, id, sub string, c time.Time, status, price string) []byte {
	return orgSubEvent(t, id, sub, orgID, c, status, price)
}

// orgSubEvent is a subscription event of sub, of org, created at c.
func orgSubEvent(t testing.TB, id, sub, org string, c time.Time, status, price string) []byte {
	obj := set(set(subscriptionObject(status, item(price)), "id", sub), "metadata.org_id", org)
	ev := stripeEvent(id, billing.EventSubscriptionUpdated, obj)
	ev["created"] = c.Unix()
	return mailplanetest.MustJSON(t, ev)
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
// event is applied again and changes nothing.
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
	ir := apitest.DecodeStrict[billing.IgnoredResponse](t, b)
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
	if resp, b := e.do(req{body: newer}); resp.StatusCode != http.StatusOK || apitest.DecodeStrict[billing.IgnoredResponse](t, b).Status != "unchanged" {
		t.Fatalf("newer, retried: %d %s", resp.StatusCode, b)
	}
	e.assertNothingProduced()
	// Another subscription of the org is not held back by this one's
	// order: its first event, though created an hour before, raises the
	// org's plan, and the change is dated no earlier than the org's last.
	up, _ := e.accepted("another subscription's older event", req{body: subEvent(t, "evt_0Other", "sub_Order2", created.Add(-time.Hour), "active", "price_dedicated_2")})
	if pc := up.Data.(*domain.OrgPlanChanged); pc.Plan != domain.PlanDedicated || pc.DedicatedWorkers != 2 || !up.Time.Equal(ev.Time) {
		t.Errorf("another subscription: %+v at %s, the org's last change at %s", pc, up.Time, ev.Time)
	}
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

	a2 := orgSubEvent(t, "evt_A", "sub_Tie2", caseOrg(2), created, "canceled", "price_premium_monthly")
	b2 := orgSubEvent(t, "evt_B", "sub_Tie2", caseOrg(2), created, "active", "price_premium_monthly")
	e.accepted("A first", req{body: a2})
	e.accepted("B after A", req{body: b2})
}

// TestWebhookConcurrentDeliveries: eight events of one subscription, a
// second apart, delivered all at once. The subscription's row lock orders
// them: in the log, the plan changes produced are in strictly increasing
// created order, alternate, and end on the newest event's plan; every
// other delivery was answered 200, ignored (and recorded) or unchanged.
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
	d := e.deliverAll(bodies)
	changes := e.planChanges(d.receipts)
	for i, ev := range changes {
		if i > 0 && !ev.Time.After(changes[i-1].Time) {
			t.Fatalf("plan change created %s produced after one created %s", ev.Time, changes[i-1].Time)
		}
		if i > 0 && *ev.Data.(*domain.OrgPlanChanged) == *changes[i-1].Data.(*domain.OrgPlanChanged) {
			t.Fatalf("plan change %d repeats the one before: %+v", i, ev.Data)
		}
	}
	// The newest event cancels: the org ends free.
	if len(changes) == 0 || changes[len(changes)-1].Data.(*domain.OrgPlanChanged).Plan != domain.PlanFree {
		t.Fatalf("plan changes %v do not end free", changes)
	}
	stale := e.staleRows(sub)
	if len(stale) != len(d.ignored) || len(d.ignored)+len(d.unchanged)+len(d.receipts) != n {
		t.Fatalf("%d accepted, %d ignored, %d unchanged, %d recorded stale", len(d.receipts), len(d.ignored), len(d.unchanged), len(stale))
	}
	for id := range d.ignored {
		if _, ok := stale[id]; !ok {
			t.Errorf("ignored %s not recorded", id)
		}
	}
	var last string
	if err := e.db.Pool.QueryRow(context.Background(), `SELECT event_id FROM billing_subscriptions WHERE subscription_id = $1`, sub).Scan(&last); err != nil || last != fmt.Sprintf("evt_C%d", n-1) {
		t.Fatalf("last applied %q (%v)", last, err)
	}
}

// deliveries are the answers to deliveries made at once.
type deliveries struct {
	receipts  []api.Receipt   // of every 202
	ignored   map[string]bool // Stripe event ids answered 200 ignored
	unchanged map[string]bool // Stripe event ids answered 200 unchanged
}

// deliverAll posts every body at once, signed, and sorts the answers; any
// answer but 202, 200 ignored and 200 unchanged fails the test.
func (e *env) deliverAll(bodies [][]byte) deliveries {
	e.t.Helper()
	type answer struct {
		status int
		body   []byte
		err    error
	}
	answers := make([]answer, len(bodies))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range bodies {
		wg.Go(func() {
			<-start
			hr, err := http.NewRequest(http.MethodPost, e.Base+"/v1/webhooks/billing", bytes.NewReader(bodies[i]))
			if err != nil {
				answers[i].err = err
				return
			}
			hr.Header.Set(billing.SignatureHeader, billing.Sign(bodies[i], signedAt, secretCurrent))
			resp, err := e.HTTP.Do(hr)
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
	d := deliveries{ignored: map[string]bool{}, unchanged: map[string]bool{}}
	for i, a := range answers {
		switch {
		case a.err != nil:
			e.t.Fatalf("delivery %d: %v", i, a.err)
		case a.status == http.StatusAccepted:
			d.receipts = append(d.receipts, apitest.DecodeStrict[api.AcceptedResponse](e.t, a.body).Events...)
		case a.status == http.StatusOK:
			ir := apitest.DecodeStrict[billing.IgnoredResponse](e.t, a.body)
			switch ir.Status {
			case "ignored":
				d.ignored[ir.EventID] = true
			case "unchanged":
				d.unchanged[ir.EventID] = true
			default:
				e.t.Fatalf("delivery %d: %s", i, a.body)
			}
		default:
			e.t.Fatalf("delivery %d: %d %s", i, a.status, a.body)
		}
	}
	if got := e.produced()[topics.OrgEvents]; got != int64(len(d.receipts)) {
		e.t.Fatalf("%d records produced, %d receipts", got, len(d.receipts))
	}
	return d
}

// planChanges reads the events of receipts back, by partition in log
// order (an org's are on one partition, in its log order).
func (e *env) planChanges(receipts []api.Receipt) []domain.Event {
	e.t.Helper()
	receipts = slices.Clone(receipts)
	slices.SortFunc(receipts, func(a, b api.Receipt) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	out := make([]domain.Event, len(receipts))
	for i, rc := range receipts {
		ev, err := topics.Decode(e.brk.Fetch(rc.Topic, rc.Partition, rc.Offset))
		if err != nil {
			e.t.Fatal(err)
		}
		out[i] = ev
	}
	return out
}
