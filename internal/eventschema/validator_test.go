package eventschema_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/eventschema"
)

const heartbeat = `{"worker_id":"0190a5b2-4c5e-7b1a-9c3d-00000000d001","tier":"shared_free","egress":"cold_smtp","address":"10.0.0.7:2525"}`

const mailboxAdded = `{"mailbox_id":"0190a5b2-4c5e-7b1a-9c3d-00000000c001","org_id":"0190a5b2-4c5e-7b1a-9c3d-00000000a001",
	"user_id":"0190a5b2-4c5e-7b1a-9c3d-00000000b001","address":"ada@example.com","provider":"gmail",
	"imap":{"host":"imap.example.com","port":PORT,"tls":"implicit","username":"ada@example.com"},
	"sealed_credentials":{"key_id":"k1","alg":"A256GCM","nonce":"AAEC","ciphertext":"AAEC"}}`

func TestDefaultCompilesEveryType(t *testing.T) {
	t.Parallel()
	v, err := eventschema.New()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := v.Types(), slices.Sorted(slices.Values(domain.EventTypes())); !slices.Equal(got, want) {
		t.Errorf("types %v, want %v", got, want)
	}
	if first, second := eventschema.Default(), eventschema.Default(); first != second {
		t.Error("Default compiles more than once")
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	v := eventschema.Default()
	cases := []struct {
		name, typ, data string
		want            []domain.Problem // fields and codes; messages are checked for non-emptiness
	}{
		{"valid", domain.TypeWorkerHeartbeat, heartbeat, nil},
		{"short type", "worker.heartbeat", heartbeat, nil},
		{"unknown type", "mailplane.worker.fired.v1", heartbeat, []domain.Problem{{Field: "type", Code: domain.CodeUnknownType}}},
		{"empty type", "", heartbeat, []domain.Problem{{Field: "type", Code: domain.CodeUnknownType}}},
		{"nested path", domain.TypeMailboxAdded, strings.Replace(mailboxAdded, "PORT", "70000", 1),
			[]domain.Problem{{Field: "data.imap.port", Code: domain.CodeSchema}}},
		{"nested ok", domain.TypeMailboxAdded, strings.Replace(mailboxAdded, "PORT", "993", 1), nil},
		{"missing at its own path", domain.TypeWorkerHeartbeat, `{"worker_id":"0190a5b2-4c5e-7b1a-9c3d-00000000d001","egress":"cold_smtp"}`,
			[]domain.Problem{{Field: "data.address", Code: domain.CodeSchema}}},
		{"two missing", domain.TypeUserActive, `{}`,
			[]domain.Problem{{Field: "data.source", Code: domain.CodeSchema}, {Field: "data.user_id", Code: domain.CodeSchema}}},
		{"additional at its own path", domain.TypeUserActive, `{"user_id":"0190a5b2-4c5e-7b1a-9c3d-00000000b001","source":"login","ip":"1.2.3.4"}`,
			[]domain.Problem{{Field: "data.ip", Code: domain.CodeSchema}}},
		{"dedicated tier", domain.TypeWorkerHeartbeat, strings.Replace(heartbeat, "shared_free", "dedicated", 1),
			[]domain.Problem{{Field: "data.tier", Code: domain.CodeSchema}}},
		{"wrong type", domain.TypeWorkerHeartbeat, strings.Replace(heartbeat, `"10.0.0.7:2525"`, `7`, 1),
			[]domain.Problem{{Field: "data.address", Code: domain.CodeSchema}}},
		{"not an object", domain.TypeUserActive, `[1]`, []domain.Problem{{Field: "data", Code: domain.CodeSchema}}},
		{"malformed", domain.TypeUserActive, `{"user_id":`, []domain.Problem{{Field: "data", Code: domain.CodeMalformedJSON}}},
		{"trailing", domain.TypeUserActive, `{} {}`, []domain.Problem{{Field: "data", Code: domain.CodeMalformedJSON}}},
		{"empty", domain.TypeUserActive, ` `, []domain.Problem{{Field: "data", Code: domain.CodeRequired}}},
		{"repeated name", domain.TypeMailboxAdded, strings.Replace(strings.Replace(mailboxAdded, "PORT", "993", 1), `"tls"`, `"port":1,"tls"`, 1),
			[]domain.Problem{{Field: "data.imap.port", Code: domain.CodeMalformedJSON}}},
		{"plain credentials", domain.TypeMailboxAdded, strings.Replace(strings.Replace(mailboxAdded, "PORT", "993", 1), `"sealed_credentials"`, `"credentials":{"password":"x"},"sealed_credentials"`, 1),
			[]domain.Problem{{Field: "data.credentials", Code: domain.CodeSchema}}},
		{"date-time asserted", domain.TypeMailboxHealthScored, `{"mailbox_id":"0190a5b2-4c5e-7b1a-9c3d-00000000c001","state":"healthy","reason":"r","until":"2023-02-29T00:00:00Z"}`,
			[]domain.Problem{{Field: "data.until", Code: domain.CodeSchema}}},
	}
	for _, c := range cases {
		got := v.Validate(c.typ, []byte(c.data))
		var gotFC, wantFC []string
		for _, p := range got {
			gotFC = append(gotFC, p.Field+" "+string(p.Code))
			if p.Message == "" {
				t.Errorf("%s: problem without a message: %+v", c.name, p)
			}
		}
		for _, p := range c.want {
			wantFC = append(wantFC, p.Field+" "+string(p.Code))
		}
		slices.Sort(gotFC)
		if !slices.Equal(gotFC, wantFC) {
			t.Errorf("%s: got %v (%s), want %v", c.name, gotFC, got, wantFC)
		}
	}
}

func TestValidateReportsEveryViolation(t *testing.T) {
	t.Parallel()
	data := `{"worker_id":"0190A5B2-4C5E-7B1A-9C3D-00000000D001","tier":"dedicated","egress":"smtp","address":"","stopping":"no"}`
	ps := eventschema.Default().Validate(domain.TypeWorkerHeartbeat, []byte(data))
	for _, f := range []string{"data.worker_id", "data.tier", "data.egress", "data.address", "data.stopping"} {
		if !slices.ContainsFunc(ps, func(p domain.Problem) bool { return p.Field == f }) {
			t.Errorf("no problem at %s in %s", f, ps)
		}
	}
	if err := ps.Err(); domain.ErrorCode(err) != domain.CodeSchema {
		t.Errorf("Err code %q, want schema", domain.ErrorCode(err))
	}
}

func TestNewFromFSErrors(t *testing.T) {
	t.Parallel()
	typ := domain.TypeUserActive
	cases := map[string]fstest.MapFS{
		"missing file": {},
		"not JSON":     {typ + ".json": {Data: []byte(`{`)}},
		"bad schema":   {typ + ".json": {Data: []byte(`{"type": 7}`)}},
		"bad pattern":  {typ + ".json": {Data: []byte(`{"type":"string","pattern":"("}`)}},
	}
	for name, fsys := range cases {
		if _, err := eventschema.NewFromFS(fsys, []string{typ}); err == nil {
			t.Errorf("%s: compiled", name)
		}
	}
	v, err := eventschema.NewFromFS(fstest.MapFS{typ + ".json": {Data: []byte(`{"type":"object"}`)}}, []string{typ})
	if err != nil {
		t.Fatal(err)
	}
	if ps := v.Validate(typ, []byte(`{"any":1}`)); len(ps) > 0 {
		t.Errorf("permissive schema refused: %s", ps)
	}
	if ps := v.Validate(domain.TypeMailboxAdded, []byte(`{}`)); !ps.Has(domain.CodeUnknownType) {
		t.Errorf("type without a schema: %s", ps)
	}
}

// TestGoLogFormConforms checks what the Go encoder actually writes (zero
// values included, since most fields have no omitempty) against the schemas.
func TestGoLogFormConforms(t *testing.T) {
	t.Parallel()
	until := time.Date(2024, 7, 19, 8, 47, 24, 123456789, time.FixedZone("", 2*3600))
	sealed := &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAECAwQFBgcICQoL", Ciphertext: "AAEC"}
	data := []domain.Data{
		&domain.WorkerHeartbeat{WorkerID: "0190a5b2-4c5e-7b1a-9c3d-00000000d001", Egress: domain.EgressColdSMTP, Address: "a"},
		&domain.MailboxHealthScored{MailboxID: "0190a5b2-4c5e-7b1a-9c3d-00000000c001", State: domain.HealthQuarantined, Reason: "r", Until: &until},
		&domain.MailboxHealthScored{MailboxID: "0190a5b2-4c5e-7b1a-9c3d-00000000c001", State: domain.HealthHealthy, Score: 100, Reason: "r"},
		&domain.OrgPlanChanged{OrgID: "0190a5b2-4c5e-7b1a-9c3d-00000000a001", Plan: domain.PlanFree, Source: "s"},
		&domain.WorkerHealthSampled{WorkerID: "0190a5b2-4c5e-7b1a-9c3d-00000000d001", WindowSeconds: 1},
		&domain.MailboxDisabled{MailboxID: "0190a5b2-4c5e-7b1a-9c3d-00000000c001", Cause: domain.DisableOperator, Reason: "r"},
		&domain.MailboxDisabled{MailboxID: "0190a5b2-4c5e-7b1a-9c3d-00000000c001", Cause: domain.DisableAuthFailing, Reason: "r", FailingSince: &until},
		&domain.WarmupObserved{MailboxID: "0190a5b2-4c5e-7b1a-9c3d-00000000c001", WarmupID: "w", Placement: domain.PlacedJunk,
			LandedAt: until, Source: domain.ObservedBySync},
		&domain.WarmupObserved{MailboxID: "0190a5b2-4c5e-7b1a-9c3d-00000000c001", WarmupID: "w", Placement: domain.PlacedInbox,
			LandedAt: until.UTC(), Source: domain.ObservedByReport, RecipientMailboxID: "0190a5b2-4c5e-7b1a-9c3d-00000000c002"},
		&domain.MailboxAdded{MailboxID: "0190a5b2-4c5e-7b1a-9c3d-00000000c001", OrgID: "0190a5b2-4c5e-7b1a-9c3d-00000000a001",
			UserID: "0190a5b2-4c5e-7b1a-9c3d-00000000b001", Address: "a@b.c", Provider: domain.ProviderOutlook,
			IMAP: domain.IMAPEndpoint{Host: "h", Port: 993, TLS: domain.TLSStartTLS, Username: "u"}, SealedCredentials: sealed},
	}
	v := eventschema.Default()
	for _, d := range data {
		if ps := d.Validate(); len(ps) > 0 {
			t.Fatalf("%s: test data invalid: %s", d.EventType(), ps)
		}
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if ps := v.Validate(d.EventType(), b); len(ps) > 0 {
			t.Errorf("%s: Go writes %s, which the schema refuses: %s", d.EventType(), b, ps)
		}
	}
}
