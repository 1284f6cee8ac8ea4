package billing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/billing"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/producer"
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

type env struct {
	t     testing.TB
	db    *pgtest.DB
	adm   *kadm.Client
	brk   []string
	base  string
	http  *http.Client
	start map[string]map[int32]int64
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
	kcfg := kafkatest.Config(t, 4)
	kcfg.ClientID = "billing-test"
	brokers := kcfg.Brokers
	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	srv, err := api.New(producer.New(kc, producer.WithNamespace(kcfg.Namespace)), api.WithAuthenticator(apiAuth(t)), api.WithRegisterer(prometheus.NewRegistry()))
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
	e := &env{t: t, ns: kcfg.Namespace, db: db, adm: kadm.NewClient(kc), brk: brokers, base: ts.URL, http: ts.Client()}
	e.start = e.endOffsets()
	return e
}

// endOffsets returns the end offset of every partition of every domain
// topic.
func (e *env) endOffsets() map[string]map[int32]int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	los, err := e.adm.ListEndOffsets(ctx, e.ns.Topics(topics.DomainTopics()...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]map[int32]int64{}
	los.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			e.t.Fatalf("end offset of %s/%d: %v", o.Topic, o.Partition, o.Err)
		}
		// Keyed by catalog name.
		base, _ := e.ns.Base(o.Topic)
		if out[base] == nil {
			out[base] = map[int32]int64{}
		}
		out[base][o.Partition] = o.Offset
	})
	if len(out) != len(topics.DomainTopics()) {
		e.t.Fatalf("end offsets of %d topics", len(out))
	}
	return out
}

// produced returns how many records the domain topics gained since start.
func (e *env) produced() map[string]int64 {
	e.t.Helper()
	out := map[string]int64{}
	for tp, ps := range e.endOffsets() {
		for p, off := range ps {
			if d := off - e.start[tp][p]; d != 0 {
				out[tp] += d
			}
		}
	}
	return out
}

func (e *env) assertNothingProduced() {
	e.t.Helper()
	if got := e.produced(); len(got) > 0 {
		e.t.Errorf("records were produced: %v", got)
	}
}

type req struct {
	method  string
	body    []byte
	sig     *string  // nil: signed now-10s with secretCurrent; "": no header
	sigs    []string // several Stripe-Signature headers
	headers map[string]string
}

func ptr[T any](v T) *T { return &v }

func (e *env) do(r req) (*http.Response, []byte) {
	e.t.Helper()
	if r.method == "" {
		r.method = http.MethodPost
	}
	hr, err := http.NewRequest(r.method, e.base+"/v1/webhooks/billing", bytes.NewReader(r.body))
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
	resp, err := e.http.Do(hr)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, s := range []string{secretCurrent, secretOld, secretRetired} {
		if strings.Contains(string(b), s) {
			e.t.Errorf("the response carries a webhook secret: %s", b)
		}
	}
	return resp, b
}

// fetch reads the record at topic/partition/offset.
func (e *env) fetch(topic string, partition int32, offset int64) *kgo.Record {
	e.t.Helper()
	return kafkatest.Fetch(e.t, e.brk, topic, partition, offset)
}

// accepted checks a 202 with one receipt and returns the decoded event.
func (e *env) accepted(name string, r req) (domain.Event, api.Receipt) {
	e.t.Helper()
	resp, b := e.do(r)
	if resp.StatusCode != http.StatusAccepted {
		e.t.Fatalf("%s: status %d: %s", name, resp.StatusCode, b)
	}
	ar := decodeStrict[api.AcceptedResponse](e.t, b)
	if len(ar.Events) != 1 {
		e.t.Fatalf("%s: %d receipts", name, len(ar.Events))
	}
	rc := ar.Events[0]
	rec := e.fetch(rc.Topic, rc.Partition, rc.Offset)
	ev, err := topics.Decode(rec)
	if err != nil {
		e.t.Fatalf("%s: decode: %v", name, err)
	}
	if string(rec.Key) != ev.Subject {
		e.t.Errorf("%s: key %q, subject %q", name, rec.Key, ev.Subject)
	}
	return ev, rc
}

func decodeStrict[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %T: %v: %s", v, err, b)
	}
	return v
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
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

// nopProducer is an api.Producer for tests that never produce.
type nopProducer struct{}

func (nopProducer) PrepareChecked([]domain.Checked) ([]*kgo.Record, error) {
	return nil, errors.New("nopProducer: not for producing")
}

func (nopProducer) ProduceRecords(context.Context, []domain.Event, []*kgo.Record) ([]producer.Receipt, error) {
	return nil, errors.New("nopProducer: not for producing")
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
