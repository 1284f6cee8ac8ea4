package billing_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/apitest"
	"github.com/mailplane/mailplane/internal/billing"
)

// TestWebhookEventFromTheFutureRefused: a signed event whose created is
// more than domain.MaxFutureSkew ahead of the server's clock is refused
// 400 time_in_future and moves nothing, so it cannot pin its
// subscription's high-water mark. Before, one that changed no plan was
// applied (200 unchanged) and its created, a year ahead, became the mark:
// the customer's cancellation a few seconds later was ignored as older,
// and the org kept premium.
func TestWebhookEventFromTheFutureRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testConfig())
	const sub = "sub_Future1"
	ev, _ := e.accepted("premium", req{body: subEvent(t, "evt_1Premium", sub, created, "active", "price_premium_monthly")})
	if pc := ev.Data.(*domain.OrgPlanChanged); pc.Plan != domain.PlanPremium {
		t.Fatalf("plan %s", pc.Plan)
	}
	e.start = e.endOffsets()
	future := subEvent(t, "evt_2Future", sub, now.Add(365*24*time.Hour), "active", "price_premium_monthly")
	resp, b := e.do(req{body: future})
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("an event created a year ahead: %d %s", resp.StatusCode, b)
	}
	er := apitest.DecodeStrict[api.ErrorResponse](t, b)
	if er.Error.Code != domain.CodeTimeInFuture || len(er.Problems) != 1 || er.Problems[0].Field != "created" {
		t.Errorf("response %+v", er)
	}
	e.assertNothingProduced()

	// Within the skew it is applied as before.
	resp, b = e.do(req{body: subEvent(t, "evt_3Skewed", sub, now.Add(domain.MaxFutureSkew-time.Second), "active", "price_premium_monthly")})
	if resp.StatusCode != http.StatusOK || apitest.DecodeStrict[billing.IgnoredResponse](t, b).Status != "unchanged" {
		t.Fatalf("an event created within the skew: %d %s", resp.StatusCode, b)
	}
	ev, _ = e.accepted("canceled", req{body: subEvent(t, "evt_4Cancel", sub, now.Add(domain.MaxFutureSkew), "canceled", "price_premium_monthly")})
	if pc := ev.Data.(*domain.OrgPlanChanged); pc.Plan != domain.PlanFree {
		t.Fatalf("after the cancellation: plan %s", pc.Plan)
	}
}
