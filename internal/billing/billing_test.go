package billing_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/apitest"
	"github.com/mailplane/mailplane/internal/billing"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/topics"
)

// TestWebhookProducesPlanChanges posts a signed event of every kind and
// reads the org.plan_changed back from the org topic.
func TestWebhookProducesPlanChanges(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testConfig())

	expanded := item("price_unmapped")
	expanded["price"].(map[string]any)["product"] = map[string]any{"id": "prod_Premium", "object": "product", "name": "Premium"}
	legacy := subscriptionObject("active")
	legacy["items"] = map[string]any{"object": "list", "data": []any{}}
	legacy["plan"] = map[string]any{"id": "price_premium_monthly", "object": "plan", "product": "prod_Other"}

	cases := []struct {
		name string
		id   string
		typ  string
		obj  map[string]any
		want domain.OrgPlanChanged
	}{
		{"created, active premium", "evt_1Created", billing.EventSubscriptionCreated,
			subscriptionObject("active", item("price_premium_monthly")),
			domain.OrgPlanChanged{Plan: domain.PlanPremium, Paid: true}},
		{"updated, trialing dedicated:2", "evt_2Trial", billing.EventSubscriptionUpdated,
			subscriptionObject("trialing", item("price_dedicated_2")),
			domain.OrgPlanChanged{Plan: domain.PlanDedicated, DedicatedWorkers: 2, Paid: true}},
		{"updated, past_due keeps the plan", "evt_3PastDue", billing.EventSubscriptionUpdated,
			subscriptionObject("past_due", item("price_premium_monthly")),
			domain.OrgPlanChanged{Plan: domain.PlanPremium, Paid: true}},
		{"updated, dedicated plus an add-on worker and an unmapped item", "evt_4Addon", billing.EventSubscriptionUpdated,
			subscriptionObject("active", item("price_premium_monthly"), item("price_dedicated_2"), item("price_dedicated_addon"), item("price_support")),
			domain.OrgPlanChanged{Plan: domain.PlanDedicated, DedicatedWorkers: 3, Paid: true}},
		{"updated, mapped by expanded product", "evt_5Product", billing.EventSubscriptionUpdated,
			subscriptionObject("active", expanded),
			domain.OrgPlanChanged{Plan: domain.PlanPremium, Paid: true}},
		{"updated, legacy plan", "evt_6Legacy", billing.EventSubscriptionUpdated, legacy,
			domain.OrgPlanChanged{Plan: domain.PlanPremium, Paid: true}},
		{"updated, active free price", "evt_7Free", billing.EventSubscriptionUpdated,
			subscriptionObject("active", item("price_free")),
			domain.OrgPlanChanged{Plan: domain.PlanFree}},
		{"updated, canceled", "evt_8Canceled", billing.EventSubscriptionUpdated,
			subscriptionObject("canceled", item("price_dedicated_2")),
			domain.OrgPlanChanged{Plan: domain.PlanFree}},
		{"updated, unpaid", "evt_9Unpaid", billing.EventSubscriptionUpdated,
			subscriptionObject("unpaid", item("price_premium_monthly")),
			domain.OrgPlanChanged{Plan: domain.PlanFree}},
		{"updated, incomplete_expired", "evt_10Expired", billing.EventSubscriptionUpdated,
			subscriptionObject("incomplete_expired", item("price_premium_monthly")),
			domain.OrgPlanChanged{Plan: domain.PlanFree}},
		{"created, incomplete (not paid yet)", "evt_11Incomplete", billing.EventSubscriptionCreated,
			subscriptionObject("incomplete", item("price_premium_monthly")),
			domain.OrgPlanChanged{Plan: domain.PlanFree}},
		{"updated, paused", "evt_12Paused", billing.EventSubscriptionUpdated,
			subscriptionObject("paused", item("price_premium_monthly")),
			domain.OrgPlanChanged{Plan: domain.PlanFree}},
		// A deletion ends the subscription whatever the object says, and
		// needs no price mapping.
		{"deleted", "evt_13Deleted", billing.EventSubscriptionDeleted,
			subscriptionObject("canceled", item("price_no_longer_sold")),
			domain.OrgPlanChanged{Plan: domain.PlanFree}},
		{"deleted, upper-case org id", "evt_14Upper", billing.EventSubscriptionDeleted,
			set(subscriptionObject("active", item("price_premium_monthly")), "metadata.org_id", strings.ToUpper(orgID)),
			domain.OrgPlanChanged{Plan: domain.PlanFree}},
	}
	for i, c := range cases {
		// A subscription each: the cases share one created time, and on one
		// subscription only the newest event applies.
		// And an org each: the org's plan is derived from all of its
		// subscriptions, and each case checks what one subscription grants.
		org := caseOrg(i)
		obj := set(c.obj, "id", fmt.Sprintf("sub_Case%d", i))
		if obj["metadata"].(map[string]any)["org_id"] == strings.ToUpper(orgID) {
			obj = set(obj, "metadata.org_id", strings.ToUpper(org))
		} else {
			obj = set(obj, "metadata.org_id", org)
		}
		body := mailplanetest.MustJSON(t, stripeEvent(c.id, c.typ, obj))
		ev, rc := e.accepted(c.name, req{body: body})
		if rc.Topic != e.ns.Topic(topics.OrgEvents) || rc.Type != domain.TypeOrgPlanChanged {
			t.Errorf("%s: receipt %+v", c.name, rc)
		}
		want := c.want
		want.OrgID, want.Source = org, "stripe:"+c.id
		got, ok := ev.Data.(*domain.OrgPlanChanged)
		if !ok || *got != want {
			t.Errorf("%s: data %+v, want %+v", c.name, ev.Data, want)
		}
		if ev.ID != billing.EventID(c.id, created.Unix()) || rc.ID != ev.ID || !domain.IsUUIDv7(ev.ID) {
			t.Errorf("%s: id %s, want %s", c.name, ev.ID, billing.EventID(c.id, created.Unix()))
		}
		if !ev.Time.Equal(created) || ev.Subject != org || ev.Source != billing.DefaultSource {
			t.Errorf("%s: time %s subject %s source %s", c.name, ev.Time, ev.Subject, ev.Source)
		}
	}
	if got := e.produced(); len(got) != 1 || got[topics.OrgEvents] != int64(len(cases)) {
		t.Errorf("produced %v, want %d on %s only", got, len(cases), topics.OrgEvents)
	}
}

// TestWebhookRetryProducesOnce: Stripe retries an event with a new
// signature; the org's plan is already what the event makes it, so the
// retry is answered 200 unchanged and nothing more is produced. Another
// event that changes the plan gets an event id of its own.
func TestWebhookRetryProducesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testConfig())
	body := mailplanetest.MustJSON(t, stripeEvent("evt_1Retry", billing.EventSubscriptionUpdated, subscriptionObject("active", item("price_premium_monthly"))))
	first, _ := e.accepted("first delivery", req{body: body})
	e.start = e.endOffsets()
	resp, b := e.do(req{body: body, sig: ptr(billing.Sign(body, now.Add(-time.Second), secretCurrent))})
	if ir := apitest.DecodeStrict[billing.IgnoredResponse](t, b); resp.StatusCode != http.StatusOK || ir.Status != "unchanged" || ir.EventID != "evt_1Retry" {
		t.Fatalf("retry: %d %s", resp.StatusCode, b)
	}
	e.assertNothingProduced()
	other, _ := e.accepted("another event", req{body: mailplanetest.MustJSON(t, stripeEvent("evt_2Other", billing.EventSubscriptionUpdated,
		subscriptionObject("active", item("price_dedicated_2"))))})
	if other.ID == first.ID {
		t.Error("two Stripe events got the same event id")
	}
}

// TestWebhookIgnoresOtherTypes: Stripe sends what the endpoint subscribes
// to; anything but subscription events is acknowledged and dropped.
func TestWebhookIgnoresOtherTypes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testConfig())
	for _, typ := range []string{"invoice.paid", "customer.subscription.trial_will_end", "checkout.session.completed"} {
		body := mailplanetest.MustJSON(t, stripeEvent("evt_Ignored", typ, map[string]any{"id": "in_1", "object": "invoice"}))
		resp, b := e.do(req{body: body})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", typ, resp.StatusCode, b)
		}
		ir := apitest.DecodeStrict[billing.IgnoredResponse](t, b)
		if ir.Status != "ignored" || ir.EventType != typ || ir.EventID != "evt_Ignored" {
			t.Errorf("%s: %s", typ, b)
		}
	}
	// Unsigned, an event of any type is refused all the same.
	resp, b := e.do(req{body: mailplanetest.MustJSON(t, stripeEvent("evt_Ignored", "invoice.paid", map[string]any{})), sig: ptr("")})
	if resp.StatusCode != http.StatusBadRequest || apitest.DecodeStrict[api.ErrorResponse](t, b).Error.Code != billing.CodeInvalidSignature {
		t.Errorf("unsigned ignored type: %d %s", resp.StatusCode, b)
	}
	e.assertNothingProduced()
}

// TestWebhookSecretRotation: during a rotation the endpoint holds both
// secrets and Stripe signs with both; either alone verifies, a retired
// one does not.
func TestWebhookSecretRotation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testConfig(secretCurrent, secretOld))
	body := mailplanetest.MustJSON(t, stripeEvent("evt_1Rotation", billing.EventSubscriptionUpdated, subscriptionObject("active", item("price_premium_monthly"))))
	for _, c := range []struct {
		name   string
		sig    string
		status int
	}{
		// The first verified delivery produces; the same event verified
		// again is applied and changes nothing (200 unchanged, not 400).
		{"both secrets", billing.Sign(body, signedAt, secretOld, secretCurrent), http.StatusAccepted},
		{"the new secret only", billing.Sign(body, signedAt, secretCurrent), http.StatusOK},
		{"the old secret only", billing.Sign(body, signedAt, secretOld), http.StatusOK},
		{"a retired secret and a wrong one", billing.Sign(body, signedAt, secretRetired, "whsec_wrong"), http.StatusBadRequest},
	} {
		resp, b := e.do(req{body: body, sig: ptr(c.sig)})
		if resp.StatusCode != c.status {
			t.Errorf("%s: %d %s", c.name, resp.StatusCode, b)
		}
	}
	if got := e.produced(); got[topics.OrgEvents] != 1 {
		t.Errorf("produced %v, want 1 on %s", got, topics.OrgEvents)
	}
}

// After the rotation the old secret is dropped. (A test of its own: one
// environment per test, as a real broker is shared one test at a time.)
func TestWebhookSecretRetired(t *testing.T) {
	t.Parallel()
	body := mailplanetest.MustJSON(t, stripeEvent("evt_1Rotation", billing.EventSubscriptionUpdated, subscriptionObject("active", item("price_premium_monthly"))))
	after := newEnv(t, testConfig(secretCurrent))
	resp, b := after.do(req{body: body, sig: ptr(billing.Sign(body, signedAt, secretOld))})
	if resp.StatusCode != http.StatusBadRequest || apitest.DecodeStrict[api.ErrorResponse](t, b).Error.Code != billing.CodeInvalidSignature {
		t.Errorf("old secret after the rotation: %d %s", resp.StatusCode, b)
	}
	after.assertNothingProduced()
}

type wantProblem struct {
	field string
	code  domain.Code
}

// TestWebhookBadInput posts bad webhooks of every kind and checks status,
// code, problems, and that no domain topic grew.
func TestWebhookBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testConfig(), billing.WithMaxBodyBytes(8<<10))

	good := stripeEvent("evt_1Bad", billing.EventSubscriptionUpdated, subscriptionObject("active", item("price_premium_monthly")))
	body := mailplanetest.MustJSON(t, good)
	signed := func(b []byte) req { return req{body: b} }
	signedAs := func(b []byte, sig string) req { return req{body: b, sig: ptr(sig)} }
	js := func(m map[string]any) []byte { return mailplanetest.MustJSON(t, m) }
	tampered := []byte(strings.Replace(string(body), "price_premium_monthly", "price_dedicated_2", 1))
	big := set(good, "data.object.metadata.notes", strings.Repeat("x", 9<<10))

	cases := []struct {
		name     string
		req      req
		status   int
		code     domain.Code
		problems []wantProblem
	}{
		// Signature.
		{"no signature header", signedAs(body, ""), 400, billing.CodeInvalidSignature, nil},
		{"a bearer token instead of a signature", req{body: body, sig: ptr(""), headers: map[string]string{"Authorization": "Bearer " + apiToken}},
			400, billing.CodeInvalidSignature, nil},
		{"header without a timestamp", signedAs(body, "v1="+strings.Repeat("ab", 32)), 400, billing.CodeInvalidSignature, nil},
		{"header without v1", signedAs(body, "t="+itoa(signedAt.Unix())+",v0="+strings.Repeat("ab", 32)), 400, billing.CodeInvalidSignature, nil},
		{"header not key=value", signedAs(body, "garbage"), 400, billing.CodeInvalidSignature, nil},
		{"timestamp not a number", signedAs(body, strings.Replace(billing.Sign(body, signedAt, secretCurrent), "t="+itoa(signedAt.Unix()), "t=yesterday", 1)),
			400, billing.CodeInvalidSignature, nil},
		{"two timestamps", signedAs(body, billing.Sign(body, signedAt, secretCurrent)+",t="+itoa(signedAt.Unix())), 400, billing.CodeInvalidSignature, nil},
		{"two signature headers", req{body: body, sigs: []string{billing.Sign(body, signedAt, secretCurrent), billing.Sign(body, signedAt, secretCurrent)}},
			400, billing.CodeInvalidSignature, nil},
		{"wrong secret", signedAs(body, billing.Sign(body, signedAt, "whsec_not_ours")), 400, billing.CodeInvalidSignature, nil},
		{"secret without its whsec_ prefix", signedAs(body, billing.Sign(body, signedAt, strings.TrimPrefix(secretCurrent, "whsec_"))),
			400, billing.CodeInvalidSignature, nil},
		{"tampered body", signedAs(tampered, billing.Sign(body, signedAt, secretCurrent)), 400, billing.CodeInvalidSignature, nil},
		{"signature for another timestamp", signedAs(body, strings.Replace(billing.Sign(body, signedAt, secretCurrent),
			"t="+itoa(signedAt.Unix()), "t="+itoa(signedAt.Unix()+1), 1)), 400, billing.CodeInvalidSignature, nil},
		{"timestamp too old", signedAs(body, billing.Sign(body, now.Add(-5*time.Minute-time.Second), secretCurrent)), 400, billing.CodeInvalidSignature, nil},
		{"timestamp in the future", signedAs(body, billing.Sign(body, now.Add(5*time.Minute+time.Second), secretCurrent)), 400, billing.CodeInvalidSignature, nil},

		// Signed, but not usable.
		{"malformed JSON", signed([]byte(`{"id":"evt_1","type":`)), 400, domain.CodeMalformedJSON, []wantProblem{{"", domain.CodeMalformedJSON}}},
		{"JSON array", signed([]byte(`[]`)), 400, domain.CodeInvalidType, nil},
		{"no event id", signed(js(set(good, "id", nil))), 400, domain.CodeRequired, []wantProblem{{"id", domain.CodeRequired}}},
		{"event id with odd characters", signed(js(set(good, "id", "evt 1/../x"))), 400, domain.CodeInvalid, []wantProblem{{"id", domain.CodeInvalid}}},
		{"no event type", signed(js(set(good, "type", nil))), 400, domain.CodeRequired, []wantProblem{{"type", domain.CodeRequired}}},
		{"no data.object", signed(js(set(good, "data.object", nil))), 400, domain.CodeRequired, []wantProblem{{"data.object", domain.CodeRequired}}},
		{"object is not a subscription", signed(js(set(good, "data.object.object", "invoice"))), 400, domain.CodeInvalid,
			[]wantProblem{{"data.object.object", domain.CodeInvalid}}},
		{"missing org metadata", signed(js(set(good, "data.object.metadata.org_id", nil))), 400, domain.CodeRequired,
			[]wantProblem{{"data.object.metadata.org_id", domain.CodeRequired}}},
		{"no metadata at all", signed(js(set(good, "data.object.metadata", nil))), 400, domain.CodeRequired,
			[]wantProblem{{"data.object.metadata.org_id", domain.CodeRequired}}},
		{"org metadata not a UUID", signed(js(set(good, "data.object.metadata.org_id", "acme"))), 400, domain.CodeInvalid,
			[]wantProblem{{"data.object.metadata.org_id", domain.CodeInvalid}}},
		{"unknown status", signed(js(set(good, "data.object.status", "frozen"))), 400, domain.CodeInvalid,
			[]wantProblem{{"data.object.status", domain.CodeInvalid}}},
		{"status a number", signed(js(set(good, "data.object.status", 3))), 400, domain.CodeInvalidType,
			[]wantProblem{{"data.object.status", domain.CodeInvalidType}}},
		{"unknown price", signed(js(set(good, "data.object.items.data", []any{item("price_enterprise_2027")}))), 422, billing.CodeUnknownPrice,
			[]wantProblem{{"data.object.items.data.0", billing.CodeUnknownPrice}}},
		{"no items", signed(js(set(good, "data.object.items.data", []any{}))), 422, billing.CodeUnknownPrice, nil},
		{"oversized body", signed(js(big)), 413, domain.CodeTooLarge, nil},

		// Method.
		{"GET", req{method: http.MethodGet, sig: ptr("")}, 405, api.CodeMethodNotAllowed, nil},
		{"PUT", req{method: http.MethodPut, body: body}, 405, api.CodeMethodNotAllowed, nil},
	}
	if len(cases) < 12 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, c := range cases {
		resp, b := e.do(c.req)
		if resp.StatusCode != c.status {
			t.Errorf("%s: status %d, want %d: %s", c.name, resp.StatusCode, c.status, b)
			continue
		}
		er := apitest.DecodeStrict[api.ErrorResponse](t, b)
		if er.Error.Code != c.code || er.Error.Message == "" {
			t.Errorf("%s: code %q, want %q: %s", c.name, er.Error.Code, c.code, b)
		}
		for _, wp := range c.problems {
			found := false
			for _, p := range er.Problems {
				found = found || p.Field == wp.field && p.Code == wp.code
			}
			if !found {
				t.Errorf("%s: problem %s/%s missing: %s", c.name, wp.field, wp.code, b)
			}
		}
	}
	e.assertNothingProduced()

	// The same env takes the good event, and the offsets check sees it.
	e.accepted("good event after the bad ones", req{body: body})
	if got := e.produced(); got[topics.OrgEvents] != 1 || len(got) != 1 {
		t.Errorf("produced %v after one good event", got)
	}
}

// TestWebhookOrgMetadataKey: the org id is read under the configured key.
func TestWebhookOrgMetadataKey(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.OrgMetadataKey = "mailplane_org"
	e := newEnv(t, cfg)
	obj := set(set(subscriptionObject("active", item("price_premium_monthly")), "metadata.org_id", nil), "metadata.mailplane_org", orgID)
	ev, _ := e.accepted("configured key", req{body: mailplanetest.MustJSON(t, stripeEvent("evt_1Key", billing.EventSubscriptionCreated, obj))})
	if ev.Subject != orgID {
		t.Errorf("subject %s", ev.Subject)
	}
	resp, b := e.do(req{body: mailplanetest.MustJSON(t, stripeEvent("evt_2Key", billing.EventSubscriptionCreated, subscriptionObject("active", item("price_premium_monthly"))))})
	er := apitest.DecodeStrict[api.ErrorResponse](t, b)
	if resp.StatusCode != http.StatusBadRequest || len(er.Problems) != 1 || er.Problems[0].Field != "data.object.metadata.mailplane_org" {
		t.Errorf("org under the default key: %d %s", resp.StatusCode, b)
	}
}
