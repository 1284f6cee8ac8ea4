package billing_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/apitest"
	"github.com/mailplane/mailplane/internal/billing"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/topics"
)

const (
	secretCurrent = "whsec_test_current_8f3a1c9e5b7d2f4a6c8e0b1d3f5a7c9e"
	secretOld     = "whsec_test_old_1b2c3d4e5f60718293a4b5c6d7e8f901"
	secretRetired = "whsec_test_retired_0000aaaa1111bbbb2222cccc3333dd"
	apiToken      = "api-tok-2c4e6a8b0d1f3e5a7c9b"
	orgID         = "0190f3c4-5d6e-7f80-9a1b-2c3d4e5f6a7b"
)

// now is the server clock; Stripe created the events 30s earlier and
// signed them 10s earlier.
var (
	now      = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	created  = now.Add(-30 * time.Second)
	signedAt = now.Add(-10 * time.Second)
)

func testPrices() map[string]billing.PlanSpec {
	return map[string]billing.PlanSpec{
		"price_premium_monthly": {Plan: domain.PlanPremium},
		"price_dedicated_2":     {Plan: domain.PlanDedicated, DedicatedWorkers: 2},
		"price_dedicated_addon": {Plan: domain.PlanDedicated, DedicatedWorkers: 1},
		"price_free":            {Plan: domain.PlanFree},
		"prod_Premium":          {Plan: domain.PlanPremium},
	}
}

func testConfig(secrets ...string) billing.Config {
	if len(secrets) == 0 {
		secrets = []string{secretCurrent}
	}
	return billing.Config{Secrets: secrets, Prices: testPrices()}
}

// env is an api.Server with the billing webhook, on an httptest server,
// producing to an in-process kfake broker with the catalog applied.
type env struct {
	*apitest.Client
	t     testing.TB
	db    *pgtest.DB
	brk   *apitest.Broker
	start apitest.Offsets
	ns    topics.Namespace // the test's
}

func newEnv(t testing.TB, cfg billing.Config, opts ...billing.Option) *env {
	t.Helper()
	return newEnvOn(t, pgtest.New(t), cfg, opts...)
}

// newEnvOn is newEnv on db, migrated here (migrations already applied to
// it are kept).
func newEnvOn(t testing.TB, db *pgtest.DB, cfg billing.Config, opts ...billing.Option) *env {
	t.Helper()
	brk := apitest.NewBroker(t, "billing-test")
	srv, err := api.New(brk.Producer(), api.WithAuthenticator(apiAuth(t)), api.WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	opts = append([]billing.Option{billing.WithClock(func() time.Time { return now }), billing.WithDatabase(db.Pool)}, opts...)
	if err := billing.Register(srv, cfg, opts...); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	e := &env{
		Client: &apitest.Client{T: t, Base: ts.URL, HTTP: ts.Client(), Secrets: []string{secretCurrent, secretOld, secretRetired}},
		t:      t, ns: brk.Config.Namespace, db: db, brk: brk,
	}
	e.start = e.endOffsets()
	return e
}

// endOffsets returns the end offset of every partition of every domain
// topic.
func (e *env) endOffsets() apitest.Offsets {
	e.t.Helper()
	return e.brk.EndOffsets(topics.DomainTopics()...)
}

// produced returns how many records the domain topics gained since start.
func (e *env) produced() map[string]int64 {
	e.t.Helper()
	return e.brk.Grown(e.start)
}

func (e *env) assertNothingProduced() {
	e.t.Helper()
	e.brk.AssertNothingProduced(e.start)
}

// req is a delivery of Stripe's to the webhook.
type req struct {
	method  string
	body    []byte
	sig     *string  // nil: signed now-10s with secretCurrent; "": no header
	sigs    []string // several Stripe-Signature headers
	headers map[string]string
}

func ptr[T any](v T) *T { return &v }

// do delivers r as Stripe does.
func (e *env) do(r req) (*http.Response, []byte) {
	e.t.Helper()
	if r.method == "" {
		r.method = http.MethodPost
	}
	hr, err := http.NewRequest(r.method, e.Base+"/v1/webhooks/billing", bytes.NewReader(r.body))
	if err != nil {
		e.t.Fatal(err)
	}
	hr.Header.Set("Content-Type", "application/json; charset=utf-8")
	hr.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
	switch {
	case r.sigs != nil:
		for _, s := range r.sigs {
			hr.Header.Add(billing.SignatureHeader, s)
		}
	case r.sig == nil:
		hr.Header.Set(billing.SignatureHeader, billing.Sign(r.body, signedAt, secretCurrent))
	case *r.sig != "":
		hr.Header.Set(billing.SignatureHeader, *r.sig)
	}
	for k, v := range r.headers {
		hr.Header.Set(k, v)
	}
	return e.Send(hr)
}

// accepted checks a 202 with one receipt and returns the decoded event.
func (e *env) accepted(name string, r req) (domain.Event, api.Receipt) {
	e.t.Helper()
	resp, b := e.do(r)
	if resp.StatusCode != http.StatusAccepted {
		e.t.Fatalf("%s: status %d: %s", name, resp.StatusCode, b)
	}
	ar := apitest.DecodeStrict[api.AcceptedResponse](e.t, b)
	if len(ar.Events) != 1 {
		e.t.Fatalf("%s: %d receipts", name, len(ar.Events))
	}
	rc := ar.Events[0]
	rec := e.brk.Fetch(rc.Topic, rc.Partition, rc.Offset)
	ev, err := topics.Decode(rec)
	if err != nil {
		e.t.Fatalf("%s: decode: %v", name, err)
	}
	if string(rec.Key) != ev.Subject {
		e.t.Errorf("%s: key %q, subject %q", name, rec.Key, ev.Subject)
	}
	return ev, rc
}

// Stripe payloads, shaped as Stripe sends them (API version 2024-06-20),
// as maps so cases can break them.

func item(price string) map[string]any {
	return map[string]any{
		"id": "si_" + price, "object": "subscription_item", "quantity": 1,
		"price": map[string]any{"id": price, "object": "price", "product": "prod_Other", "currency": "usd", "unit_amount": 4900},
		"plan":  map[string]any{"id": price, "object": "plan", "product": "prod_Other", "amount": 4900},
	}
}

func subscriptionObject(status string, items ...map[string]any) map[string]any {
	data := make([]any, len(items))
	for i, it := range items {
		data[i] = it
	}
	return map[string]any{
		"id": "sub_1PzX8Y2eZvKYlo2C", "object": "subscription", "customer": "cus_Q1w2e3r4", "status": status,
		"cancel_at_period_end": false, "currency": "usd", "livemode": false,
		"metadata": map[string]any{"org_id": orgID, "crm_id": "4411"},
		"items":    map[string]any{"object": "list", "has_more": false, "data": data},
	}
}

// caseOrg is the i-th org of a test that needs several.
func caseOrg(i int) string { return fmt.Sprintf("0190f3c4-5d6e-7f80-9a1b-%012x", i) }

func stripeEvent(id, typ string, object map[string]any) map[string]any {
	return map[string]any{
		"id": id, "object": "event", "api_version": "2024-06-20", "created": created.Unix(),
		"livemode": false, "pending_webhooks": 1,
		"request": map[string]any{"id": "req_abc", "idempotency_key": nil},
		"type":    typ,
		"data":    map[string]any{"object": object, "previous_attributes": map[string]any{}},
	}
}

// set returns a deep copy of m with the dotted path set to v (nil: removed).
func set(m map[string]any, path string, v any) map[string]any {
	c := deepCopy(m)
	parts := strings.Split(path, ".")
	cur := c
	for _, p := range parts[:len(parts)-1] {
		cur = cur[p].(map[string]any)
	}
	if v == nil {
		delete(cur, parts[len(parts)-1])
	} else {
		cur[parts[len(parts)-1]] = v
	}
	return c
}

func deepCopy(m map[string]any) map[string]any {
	c := make(map[string]any, len(m))
	for k, v := range m {
		switch vv := v.(type) {
		case map[string]any:
			v = deepCopy(vv)
		case []any:
			s := make([]any, len(vv))
			for i, x := range vv {
				if xm, ok := x.(map[string]any); ok {
					x = deepCopy(xm)
				}
				s[i] = x
			}
			v = s
		}
		c[k] = v
	}
	return c
}

// apiAuth knows apiToken as a product caller: a bearer token that must not
// open the webhook.
func apiAuth(t testing.TB) api.Authenticator {
	t.Helper()
	a, err := access.FromBytes([]byte(access.Line("product", apiToken, []string{domain.ScopePublishPublic}, "/product") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return a
}
