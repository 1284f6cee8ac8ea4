package billing_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/apitest"
	"github.com/mailplane/mailplane/internal/billing"
)

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestSignMatchesStripe checks Sign against Stripe's documented scheme,
// computed independently: v1 = hex(HMAC-SHA256(secret, "<t>.<payload>")).
func TestSignMatchesStripe(t *testing.T) {
	t.Parallel()
	payload := []byte(`{"id":"evt_test","object":"event"}`)
	m := hmac.New(sha256.New, []byte(secretCurrent))
	m.Write([]byte("1714564800." + string(payload)))
	want := "t=1714564800,v1=" + hex.EncodeToString(m.Sum(nil))
	if got := billing.Sign(payload, time.Unix(1714564800, 0), secretCurrent); got != want {
		t.Errorf("Sign = %s, want %s", got, want)
	}
}

func TestVerify(t *testing.T) {
	t.Parallel()
	payload := []byte(`{"id":"evt_1"}`)
	ts := now.Add(-time.Minute)
	good := billing.Sign(payload, ts, secretCurrent)
	v1 := strings.TrimPrefix(good, "t="+itoa(ts.Unix())+",")
	bogus := "v1=" + strings.Repeat("0", 64)
	secrets := []string{secretOld, secretCurrent}
	tol := 5 * time.Minute

	ok := []struct{ name, header string }{
		{"one v1", good},
		{"v1 among others, v0 and unknown schemes ignored", "t=" + itoa(ts.Unix()) + ",v0=abc," + bogus + "," + v1 + ",v9=zz"},
		{"v1 before t", v1 + ",t=" + itoa(ts.Unix())},
		{"spaces around elements", "t=" + itoa(ts.Unix()) + ", " + v1},
		{"upper-case hex", "t=" + itoa(ts.Unix()) + ",v1=" + strings.ToUpper(strings.TrimPrefix(v1, "v1="))},
		{"not valid hex is skipped", "t=" + itoa(ts.Unix()) + ",v1=xyz," + v1},
		{"at the tolerance, past", billing.Sign(payload, now.Add(-tol), secretCurrent)},
		{"at the tolerance, future", billing.Sign(payload, now.Add(tol), secretCurrent)},
	}
	for _, c := range ok {
		if err := billing.Verify(payload, c.header, secrets, now, tol); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	bad := []struct{ name, header string }{
		{"empty", ""},
		{"blank", "  "},
		{"no t", v1},
		{"no v1", "t=" + itoa(ts.Unix()) + ",v0=" + strings.Repeat("0", 64)},
		{"t empty", "t=," + v1},
		{"t negative", "t=-5," + v1},
		{"t with a plus", "t=+" + itoa(ts.Unix()) + "," + v1},
		{"t twice", good + ",t=" + itoa(ts.Unix())},
		{"element without =", good + ",v1"},
		{"only bogus v1", "t=" + itoa(ts.Unix()) + "," + bogus},
		{"truncated v1", good[:len(good)-2]},
		{"too many v1", "t=" + itoa(ts.Unix()) + strings.Repeat(","+bogus, 16) + "," + v1},
		{"past the tolerance", billing.Sign(payload, now.Add(-tol-time.Second), secretCurrent)},
		{"beyond the tolerance in the future", billing.Sign(payload, now.Add(tol+time.Second), secretCurrent)},
		{"wrong secret", billing.Sign(payload, ts, secretRetired)},
	}
	for _, c := range bad {
		err := billing.Verify(payload, c.header, secrets, now, tol)
		if domain.ErrorCode(err) != billing.CodeInvalidSignature {
			t.Errorf("%s: %v, want invalid_signature", c.name, err)
			continue
		}
		for _, s := range secrets {
			if strings.Contains(err.Error(), s) {
				t.Errorf("%s: the error carries a secret", c.name)
			}
		}
	}
	if err := billing.Verify(append(payload, ' '), good, secrets, now, tol); domain.ErrorCode(err) != billing.CodeInvalidSignature {
		t.Errorf("payload with a trailing space: %v", err)
	}
	if err := billing.Verify(payload, good, nil, now, tol); domain.ErrorCode(err) != billing.CodeInvalidSignature {
		t.Errorf("no secrets: %v", err)
	}
}

func TestEventID(t *testing.T) {
	t.Parallel()
	a := billing.EventID("evt_1NG8Du2eZvKYlo2CUI79vXWy", 1714564800)
	if a != billing.EventID("evt_1NG8Du2eZvKYlo2CUI79vXWy", 1714564800) {
		t.Error("not deterministic")
	}
	if !domain.IsUUIDv7(a) {
		t.Errorf("%s is not a UUIDv7", a)
	}
	// The time prefix is the created time in ms.
	if !strings.HasPrefix(a, "018f3406-9e00-7") {
		t.Errorf("%s does not carry the created time 1714564800000 ms", a)
	}
	for _, other := range []string{
		billing.EventID("evt_1NG8Du2eZvKYlo2CUI79vXWz", 1714564800),
		billing.EventID("evt_1NG8Du2eZvKYlo2CUI79vXWy", 1714564801),
	} {
		if other == a {
			t.Errorf("collision: %s", other)
		}
	}
	if z := billing.EventID("evt_x", 0); !domain.IsUUIDv7(z) || !strings.HasPrefix(z, "00000000-0000-7") {
		t.Errorf("no created time: %s", z)
	}
}

func TestParsePrices(t *testing.T) {
	t.Parallel()
	got, err := billing.ParsePrices(" price_123=premium, price_456=dedicated:2,prod_X=dedicated , price_f=free ")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]billing.PlanSpec{
		"price_123": {Plan: domain.PlanPremium},
		"price_456": {Plan: domain.PlanDedicated, DedicatedWorkers: 2},
		"prod_X":    {Plan: domain.PlanDedicated, DedicatedWorkers: 1},
		"price_f":   {Plan: domain.PlanFree},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %v, want %v", k, got[k], v)
		}
	}
	for _, bad := range []string{
		"", " ", "price_1", "price_1=", "=premium", "price_1=gold", "price_1=premium:2", "price_1=dedicated:0",
		"price_1=dedicated:-1", "price_1=dedicated:+2", "price_1=dedicated:x", "price_1=dedicated:1001", "price_1=dedicated:",
		"price_1=premium,price_1=dedicated:2", "price_1=premium,,price_2=premium", "price 1=premium",
	} {
		if _, err := billing.ParsePrices(bad); err == nil {
			t.Errorf("ParsePrices(%q) accepted", bad)
		}
	}
}

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	cfg, err := billing.ConfigFromEnv(env(map[string]string{
		billing.EnvSecrets: secretCurrent + ", " + secretOld,
		billing.EnvPrices:  "price_123=premium,price_456=dedicated:2",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Secrets) != 2 || cfg.Secrets[1] != secretOld || cfg.OrgMetadataKey != billing.DefaultOrgMetadataKey ||
		cfg.Tolerance != billing.DefaultTolerance || cfg.Prices["price_456"].DedicatedWorkers != 2 {
		t.Errorf("config %+v", cfg)
	}
	cfg, err = billing.ConfigFromEnv(env(map[string]string{
		billing.EnvSecrets: secretCurrent, billing.EnvPrices: "price_123=premium",
		billing.EnvOrgMetadataKey: "mailplane_org", billing.EnvTolerance: "90s",
	}))
	if err != nil || cfg.OrgMetadataKey != "mailplane_org" || cfg.Tolerance != 90*time.Second {
		t.Errorf("config %+v, %v", cfg, err)
	}
	for name, m := range map[string]map[string]string{
		"no secrets":         {billing.EnvPrices: "price_1=premium"},
		"empty secret":       {billing.EnvSecrets: secretCurrent + ",,", billing.EnvPrices: "price_1=premium"},
		"secret with space":  {billing.EnvSecrets: "whsec_a b", billing.EnvPrices: "price_1=premium"},
		"no prices":          {billing.EnvSecrets: secretCurrent},
		"bad tolerance":      {billing.EnvSecrets: secretCurrent, billing.EnvPrices: "price_1=premium", billing.EnvTolerance: "soon"},
		"negative tolerance": {billing.EnvSecrets: secretCurrent, billing.EnvPrices: "price_1=premium", billing.EnvTolerance: "-1m"},
		"key too long":       {billing.EnvSecrets: secretCurrent, billing.EnvPrices: "price_1=premium", billing.EnvOrgMetadataKey: strings.Repeat("k", 41)},
	} {
		_, err := billing.ConfigFromEnv(env(m))
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if strings.Contains(err.Error(), secretCurrent) || strings.Contains(err.Error(), "whsec_a") {
			t.Errorf("%s: the error carries a secret: %v", name, err)
		}
	}
}

func TestRegisterValidates(t *testing.T) {
	t.Parallel()
	srv, err := api.New(apitest.NopProducer{}, api.WithAuthenticator(apiAuth(t)))
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]billing.Config{
		"no secrets":         {Prices: testPrices()},
		"no prices":          {Secrets: []string{secretCurrent}},
		"bad plan":           {Secrets: []string{secretCurrent}, Prices: map[string]billing.PlanSpec{"price_1": {Plan: "gold"}}},
		"dedicated with 0":   {Secrets: []string{secretCurrent}, Prices: map[string]billing.PlanSpec{"price_1": {Plan: domain.PlanDedicated}}},
		"negative tolerance": {Secrets: []string{secretCurrent}, Prices: testPrices(), Tolerance: -time.Second},
	} {
		if err := billing.Register(srv, cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Not connected to until a webhook arrives.
	db, err := pgxpool.New(t.Context(), "postgres://unused@127.0.0.1:1/unused")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := billing.Register(srv, testConfig(), billing.WithDatabase(db), billing.WithMaxBodyBytes(0)); err == nil {
		t.Error("zero body limit accepted")
	}
	if err := billing.Register(nil, testConfig(), billing.WithDatabase(db)); err == nil {
		t.Error("nil server accepted")
	}
	if err := billing.Register(srv, testConfig()); err == nil {
		t.Error("no database accepted: events would be applied in delivery order")
	}
	if err := billing.Register(srv, testConfig(), billing.WithDatabase(db)); err != nil {
		t.Fatal(err)
	}
}
