package workerapi_test

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/apitest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/workerapi"
	"github.com/mailplane/mailplane/topics"
)

const workerTopic = topics.WorkerEvents

func heartbeatBody() map[string]any {
	return map[string]any{
		"worker_id": workerID, "tier": "shared_free", "egress": "cold_smtp",
		"address": "10.0.0.7:2525", "stopping": false,
	}
}

func with(m map[string]any, k string, v any) map[string]any {
	c := make(map[string]any, len(m))
	for kk, vv := range m {
		c[kk] = vv
	}
	c[k] = v
	return c
}

func without(m map[string]any, k string) map[string]any {
	c := with(m, k, nil)
	delete(c, k)
	return c
}

// TestHeartbeatProduced posts valid heartbeats and reads each event back
// from the worker topic.
func TestHeartbeatProduced(t *testing.T) {
	t.Parallel()
	e := newEnv(t, workerapi.WithSource("urn:mailplane:test-workers"))

	cases := []struct {
		name string
		body map[string]any
		want domain.WorkerHeartbeat
	}{
		{"shared free", heartbeatBody(), domain.WorkerHeartbeat{
			WorkerID: workerID, Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Address: "10.0.0.7:2525",
		}},
		{"shared premium, stopping", with(with(with(heartbeatBody(), "tier", "shared_premium"), "stopping", true), "egress", "oauth_api"),
			domain.WorkerHeartbeat{
				WorkerID: workerID, Tier: domain.TierSharedPremium, Egress: domain.EgressOAuthAPI, Address: "10.0.0.7:2525", Stopping: true,
			}},
		// The domain's rule: no tier means shared premium (older workers).
		{"tier and stopping left out", without(without(heartbeatBody(), "tier"), "stopping"), domain.WorkerHeartbeat{
			WorkerID: workerID, Egress: domain.EgressColdSMTP, Address: "10.0.0.7:2525",
		}},
	}
	for _, c := range cases {
		resp, b := e.Do(req{Method: http.MethodPost, Path: "/v1/workers/heartbeat", Body: mailplanetest.MustJSON(t, c.body)})
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("%s: status %d: %s", c.name, resp.StatusCode, b)
		}
		ar := apitest.DecodeStrict[api.AcceptedResponse](t, b)
		if len(ar.Events) != 1 {
			t.Fatalf("%s: %d receipts", c.name, len(ar.Events))
		}
		rc := ar.Events[0]
		if rc.Topic != e.kcfg.Topic(workerTopic) || rc.Type != domain.TypeWorkerHeartbeat || !domain.IsUUIDv7(rc.ID) {
			t.Fatalf("%s: receipt %+v", c.name, rc)
		}
		rec := e.brk.Fetch(rc.Topic, rc.Partition, rc.Offset)
		if string(rec.Key) != workerID {
			t.Errorf("%s: key %q", c.name, rec.Key)
		}
		ev, err := topics.Decode(rec)
		if err != nil {
			t.Fatalf("%s: decode: %v", c.name, err)
		}
		if ev.ID != rc.ID || ev.Subject != workerID || ev.Source != "urn:mailplane:test-workers" {
			t.Errorf("%s: envelope id=%s subject=%s source=%s", c.name, ev.ID, ev.Subject, ev.Source)
		}
		if !ev.Time.Equal(fixedNow) {
			t.Errorf("%s: time %s, want the server clock %s", c.name, ev.Time, fixedNow)
		}
		got, ok := ev.Data.(*domain.WorkerHeartbeat)
		if !ok || *got != c.want {
			t.Errorf("%s: data %+v, want %+v", c.name, ev.Data, c.want)
		}
	}
}

type wantProblem struct {
	field string
	code  domain.Code
}

// TestBadInput sends bad requests of every kind to both worker routes and
// checks status, stable code, the problems named, that the worker topic did
// not grow and that the assignment store was never asked.
func TestBadInput(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	e := newEnv(t, workerapi.WithAssignmentStore(store), workerapi.WithMaxBodyBytes(1024))

	hb := heartbeatBody()
	post := func(body []byte) req {
		return req{Method: http.MethodPost, Path: "/v1/workers/heartbeat", Body: body}
	}
	postJSON := func(v any) req { return post(mailplanetest.MustJSON(t, v)) }
	get := func(path string) req { return req{Method: http.MethodGet, Path: path} }
	assignments := "/v1/workers/" + workerID + "/assignments"
	v2Token := base64.RawURLEncoding.EncodeToString([]byte{2, 0, 0, 0, 0, 0, 0, 0, 5})
	negToken := base64.RawURLEncoding.EncodeToString([]byte{1, 0x80, 0, 0, 0, 0, 0, 0, 0})
	goodToken := workerapi.TokenAt(5).String()

	cases := []struct {
		name     string
		req      req
		status   int
		code     domain.Code
		problems []wantProblem // each must be present
	}{
		// Auth (the API's bearer tokens).
		{"heartbeat without a token", func() req { r := postJSON(hb); r.NoAuth = true; return r }(),
			401, domain.CodeUnauthorized, nil},
		{"heartbeat with a wrong token", func() req { r := postJSON(hb); r.Token = "nope-not-a-token"; return r }(),
			401, domain.CodeUnauthorized, nil},
		{"assignments without a token", func() req { r := get(assignments); r.NoAuth = true; return r }(),
			401, domain.CodeUnauthorized, nil},

		// Body framing.
		{"malformed JSON", post([]byte(`{"worker_id":`)), 400, domain.CodeMalformedJSON, []wantProblem{{"", domain.CodeMalformedJSON}}},
		{"empty body", post([]byte("  ")), 400, domain.CodeMalformedJSON, nil},
		{"trailing data", post([]byte(string(mailplanetest.MustJSON(t, hb)) + `{}`)), 400, domain.CodeMalformedJSON, nil},
		{"array instead of object", post([]byte(`[]`)), 400, domain.CodeInvalidType, []wantProblem{{"", domain.CodeInvalidType}}},
		{"null body", post([]byte(`null`)), 400, domain.CodeInvalidType, nil},
		{"repeated field", post([]byte(`{"worker_id":"` + workerID + `","worker_id":"` + workerID + `","egress":"cold_smtp","address":"a"}`)),
			400, domain.CodeMalformedJSON, []wantProblem{{"worker_id", domain.CodeMalformedJSON}}},
		{"wrong content type", func() req { r := postJSON(hb); r.ContentType = "text/plain"; return r }(),
			415, domain.CodeUnsupportedMediaType, nil},
		{"charset other than UTF-8", func() req { r := postJSON(hb); r.ContentType = "application/json; charset=latin1"; return r }(),
			415, domain.CodeUnsupportedMediaType, nil},
		{"oversized body", postJSON(with(hb, "address", strings.Repeat("a", 2000))), 413, domain.CodeTooLarge, nil},

		// Strict fields.
		{"unknown field", postJSON(with(hb, "colour", "blue")), 400, domain.CodeUnknownField, []wantProblem{{"colour", domain.CodeUnknownField}}},
		{"field name in another case", postJSON(with(without(hb, "worker_id"), "Worker_ID", workerID)),
			400, domain.CodeUnknownField, []wantProblem{{"Worker_ID", domain.CodeUnknownField}}},
		{"null field", postJSON(with(hb, "stopping", nil)), 400, domain.CodeInvalidType, []wantProblem{{"stopping", domain.CodeInvalidType}}},

		// Each field: missing, wrong type, bad value.
		{"worker_id missing", postJSON(without(hb, "worker_id")), 400, domain.CodeRequired, []wantProblem{{"worker_id", domain.CodeRequired}}},
		{"worker_id not a UUID", postJSON(with(hb, "worker_id", "worker-7")), 400, domain.CodeInvalid, []wantProblem{{"worker_id", domain.CodeInvalid}}},
		{"worker_id upper-case", postJSON(with(hb, "worker_id", strings.ToUpper(workerID))), 400, domain.CodeInvalid, []wantProblem{{"worker_id", domain.CodeInvalid}}},
		{"worker_id a number", postJSON(with(hb, "worker_id", 7)), 400, domain.CodeInvalidType, []wantProblem{{"worker_id", domain.CodeInvalidType}}},
		{"tier dedicated", postJSON(with(hb, "tier", "dedicated")), 400, domain.CodeTierNotAllowed, []wantProblem{{"tier", domain.CodeTierNotAllowed}}},
		{"tier unknown", postJSON(with(hb, "tier", "gold")), 400, domain.CodeInvalid, []wantProblem{{"tier", domain.CodeInvalid}}},
		{"tier a number", postJSON(with(hb, "tier", 1)), 400, domain.CodeInvalidType, []wantProblem{{"tier", domain.CodeInvalidType}}},
		{"egress missing", postJSON(without(hb, "egress")), 400, domain.CodeRequired, []wantProblem{{"egress", domain.CodeRequired}}},
		{"egress unknown", postJSON(with(hb, "egress", "carrier_pigeon")), 400, domain.CodeInvalid, []wantProblem{{"egress", domain.CodeInvalid}}},
		{"egress an object", postJSON(with(hb, "egress", map[string]any{})), 400, domain.CodeInvalidType, []wantProblem{{"egress", domain.CodeInvalidType}}},
		{"address missing", postJSON(without(hb, "address")), 400, domain.CodeRequired, []wantProblem{{"address", domain.CodeRequired}}},
		{"address empty", postJSON(with(hb, "address", "")), 400, domain.CodeRequired, []wantProblem{{"address", domain.CodeRequired}}},
		{"address too long", postJSON(with(hb, "address", strings.Repeat("a", 256))), 400, domain.CodeTooLong, []wantProblem{{"address", domain.CodeTooLong}}},
		{"address a bool", postJSON(with(hb, "address", true)), 400, domain.CodeInvalidType, []wantProblem{{"address", domain.CodeInvalidType}}},
		{"stopping a string", postJSON(with(hb, "stopping", "yes")), 400, domain.CodeInvalidType, []wantProblem{{"stopping", domain.CodeInvalidType}}},
		{"dedicated tier and other problems", postJSON(with(without(hb, "egress"), "tier", "dedicated")),
			400, domain.CodeInvalid, []wantProblem{{"tier", domain.CodeTierNotAllowed}, {"egress", domain.CodeRequired}}},

		// Methods.
		{"GET heartbeat", get("/v1/workers/heartbeat"), 405, api.CodeMethodNotAllowed, nil},
		{"PUT heartbeat", func() req { r := postJSON(hb); r.Method = http.MethodPut; return r }(), 405, api.CodeMethodNotAllowed, nil},
		{"POST assignments", func() req { r := postJSON(hb); r.Path = assignments; return r }(), 405, api.CodeMethodNotAllowed, nil},

		// Assignments: path and query.
		{"worker id not a UUID", get("/v1/workers/worker-7/assignments"), 400, domain.CodeInvalid, []wantProblem{{"id", domain.CodeInvalid}}},
		{"worker id upper-case", get("/v1/workers/" + strings.ToUpper(workerID) + "/assignments"), 400, domain.CodeInvalid, []wantProblem{{"id", domain.CodeInvalid}}},
		{"since not base64url", get(assignments + "?since=not*a*token"), 400, domain.CodeInvalid, []wantProblem{{"since", domain.CodeInvalid}}},
		{"since too short", get(assignments + "?since=AQ"), 400, domain.CodeInvalid, []wantProblem{{"since", domain.CodeInvalid}}},
		{"since with padding", get(assignments + "?since=" + goodToken + "%3D"), 400, domain.CodeInvalid, []wantProblem{{"since", domain.CodeInvalid}}},
		{"since of another version", get(assignments + "?since=" + v2Token), 400, domain.CodeInvalid, []wantProblem{{"since", domain.CodeInvalid}}},
		{"since negative offset", get(assignments + "?since=" + negToken), 400, domain.CodeInvalid, []wantProblem{{"since", domain.CodeInvalid}}},
		{"since twice", get(assignments + "?since=" + goodToken + "&since=" + goodToken), 400, domain.CodeInvalid, []wantProblem{{"since", domain.CodeInvalid}}},
		{"unknown query parameter", get(assignments + "?limit=10"), 400, domain.CodeUnknownField, []wantProblem{{"limit", domain.CodeUnknownField}}},
		{"malformed query", get(assignments + "?since=%zz"), 400, domain.CodeInvalid, nil},
	}
	if len(cases) < 15 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, c := range cases {
		resp, b := e.Do(c.req)
		if resp.StatusCode != c.status {
			t.Errorf("%s: status %d, want %d: %s", c.name, resp.StatusCode, c.status, b)
			continue
		}
		er := apitest.DecodeStrict[api.ErrorResponse](t, b)
		if er.Error.Code != c.code {
			t.Errorf("%s: code %q, want %q: %s", c.name, er.Error.Code, c.code, b)
		}
		if er.Error.Message == "" {
			t.Errorf("%s: no message", c.name)
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
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", c.name, ct)
		}
	}
	e.assertNothingProduced()
	if n := store.count(); n != 0 {
		t.Errorf("the assignment store was asked %d times", n)
	}

	// The same env still accepts a good heartbeat: the refusals were about
	// the input, not a broken server.
	resp, b := e.Do(postJSON(hb))
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("good heartbeat after the bad ones: %d %s", resp.StatusCode, b)
	}
	// ... and the end-offset check sees it (so it would have seen any other).
	if grew := e.produced(); grew != 1 {
		t.Errorf("the worker topic grew by %d records after one good heartbeat, want 1", grew)
	}
}
