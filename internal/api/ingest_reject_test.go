package api

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailplanetest"
)

type wantProblem struct {
	index int
	field string
	code  domain.Code
}

type rejectCase struct {
	name     string
	status   int
	code     domain.Code   // top-level error code
	problems []wantProblem // each must be present
	only     bool          // problems must be exactly these
	check    func(t *testing.T, resp *http.Response, er ErrorResponse)
}

func structured(ev map[string]any) func(t testing.TB) req {
	return func(t testing.TB) req {
		return req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(t, ev)}
	}
}

// TestIngestRejects posts bad input of every kind and checks the status,
// the stable codes and fields, and that no domain topic grew.
func TestIngestRejects(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})

	mb := mailboxAdded()
	good1, good2, good3 := userActive(), heartbeat(), planChanged()
	dupA := userActive()
	dupB := with(userActive(), "id", dupA["id"])
	over := make([]map[string]any, 1001)
	for i := range over {
		over[i] = userActive()
	}
	hb := heartbeat()
	bigReason := with(mailboxRemoved(), "data.reason", strings.Repeat("x", DefaultMaxBodyBytes))
	newlineID := with(userActive(), "id", "order-4711\nX-Forged: 1")
	longID := with(userActive(), "id", strings.Repeat("x", 257))
	upperMailbox := mailboxRemoved()
	upperID := strings.ToUpper(upperMailbox["subject"].(string))
	upperMailbox = with(with(upperMailbox, "data.mailbox_id", upperID), "subject", upperID)
	ua := userActive()
	binHdr := binaryHeadersOf(ua)
	binData := mailplanetest.MustJSON(t, ua["data"])
	withoutHdr := func(h map[string]string, k string) map[string]string {
		c := map[string]string{}
		for kk, v := range h {
			if kk != k {
				c[kk] = v
			}
		}
		return c
	}
	plusHdr := func(h map[string]string, k, v string) map[string]string {
		c := withoutHdr(h, "")
		c[k] = v
		return c
	}
	sealedAndPlain := with(mb, "data.sealed_credentials", map[string]any{
		"key_id": "test-1", "alg": "A256GCM", "nonce": "AAAAAAAAAAAAAAAA", "ciphertext": "AAAA",
	})

	cases := []struct {
		rejectCase
		mk func(t testing.TB) req
	}{
		{rc("malformed JSON", 400, domain.CodeMalformedJSON, p(0, "", domain.CodeMalformedJSON)),
			fixed(req{ContentType: ContentTypeStructured, Body: []byte(`{"specversion":"1.0","id":`)})},
		{rc("malformed JSON with a secret character", 400, domain.CodeMalformedJSON, p(0, "", domain.CodeMalformedJSON)),
			fixed(req{ContentType: ContentTypeStructured, Body: []byte(`{"data":{"credentials":{"password":"` + secretPassword + "\x01" + `"}}}`)})},
		{rc("trailing data after the event", 400, domain.CodeMalformedJSON, p(0, "", domain.CodeMalformedJSON)),
			func(t testing.TB) req {
				return req{ContentType: ContentTypeStructured, Body: append(mailplanetest.MustJSON(t, userActive()), []byte(` {}`)...)}
			}},
		{rc("empty body structured", 400, domain.CodeMalformedJSON), fixed(req{ContentType: ContentTypeStructured, Body: []byte("  ")})},
		{rc("empty body batch", 400, domain.CodeMalformedJSON), fixed(req{ContentType: ContentTypeBatch})},
		{rc("batch is an object", 400, domain.CodeMalformedJSON), structuredAs(ContentTypeBatch, userActive())},
		{rc("batch element malformed", 400, domain.CodeMalformedJSON),
			fixed(req{ContentType: ContentTypeBatch, Body: []byte(`[{"id":1},{"id":]`)})},
		{rc("empty batch", 400, domain.CodeInvalid), fixed(req{ContentType: ContentTypeBatch, Body: []byte(`[]`)})},
		{rc("batch element not an object", 400, domain.CodeInvalid, p(1, "", domain.CodeInvalidType)),
			func(t testing.TB) req {
				return req{ContentType: ContentTypeBatch, Body: []byte(`[` + string(mailplanetest.MustJSON(t, userActive())) + `,42]`)}
			}},
		{rc("wrong content type text/plain", 415, domain.CodeUnsupportedMediaType), structuredAs("text/plain", userActive())},
		{rc("no content type", 415, domain.CodeUnsupportedMediaType), structuredAs("", userActive())},
		{rc("cloudevents xml", 415, domain.CodeUnsupportedMediaType), structuredAs("application/cloudevents+xml", userActive())},
		{rc("charset latin1", 415, domain.CodeUnsupportedMediaType), structuredAs(ContentTypeStructured+"; charset=latin1", userActive())},
		{rc("unknown type", 400, domain.CodeInvalid, p(0, "type", domain.CodeUnknownType)),
			structured(with(userActive(), "type", "mailplane.user.vanished.v1"))},
		{rc("missing specversion", 400, domain.CodeInvalid, p(0, "specversion", domain.CodeRequired)),
			structured(without(userActive(), "specversion"))},
		{rc("wrong specversion", 400, domain.CodeInvalid, p(0, "specversion", domain.CodeInvalid)),
			structured(with(userActive(), "specversion", "0.3"))},
		{rc("missing id", 400, domain.CodeInvalid, p(0, "id", domain.CodeRequired)), structured(without(userActive(), "id"))},
		{rc("missing source", 400, domain.CodeInvalid, p(0, "source", domain.CodeRequired)), structured(without(userActive(), "source"))},
		{rc("missing type", 400, domain.CodeInvalid, p(0, "type", domain.CodeRequired)), structured(without(userActive(), "type"))},
		{rc("id is a number", 400, domain.CodeInvalid, p(0, "id", domain.CodeInvalidType)), structured(with(userActive(), "id", 42))},
		{rc("port is a string", 400, domain.CodeInvalid, p(0, "data.imap.port", domain.CodeInvalidType)).exactly(),
			structured(with(mb, "data.imap.port", "993"))},
		{rc("warmup_enabled is a string", 400, domain.CodeInvalid, p(0, "data.warmup_enabled", domain.CodeInvalidType)).exactly(),
			structured(with(mb, "data.warmup_enabled", "yes"))},
		{rc("bad provider enum", 400, domain.CodeInvalid, p(0, "data.provider", domain.CodeInvalid)),
			structured(with(mb, "data.provider", "yahoo"))},
		{rc("bad health state enum", 400, domain.CodeInvalid, p(0, "data.state", domain.CodeInvalid)),
			structured(with(healthScored(), "data.state", "sickly"))},
		{rc("score out of range", 400, domain.CodeInvalid, p(0, "data.score", domain.CodeOutOfRange)),
			structured(with(healthScored(), "data.score", 101))},
		{rc("port out of range", 400, domain.CodeInvalid, p(0, "data.imap.port", domain.CodeOutOfRange)),
			structured(with(mb, "data.imap.port", 70000))},
		{rc("oversized body", 413, domain.CodeTooLarge), structured(bigReason)},
		{rc("oversized body chunked", 413, domain.CodeTooLarge), func(t testing.TB) req {
			return req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(t, bigReason), Chunked: true}
		}},
		{rc("oversized field", 400, domain.CodeInvalid, p(0, "data.reason", domain.CodeTooLong)),
			structured(with(mailboxRemoved(), "data.reason", strings.Repeat("é", 501)))},
		{rc("event id with a newline", 400, domain.CodeInvalid, p(0, "id", domain.CodeForbiddenCharacter)), structured(newlineID)},
		{rc("event id over 256 characters", 400, domain.CodeInvalid, p(0, "id", domain.CodeTooLong)), structured(longID)},
		{rc("aggregate id upper-case", 400, domain.CodeInvalid, p(0, "data.mailbox_id", domain.CodeInvalid)), structured(upperMailbox)},
		{rc("tier dedicated", 400, domain.CodeInvalid, p(0, "data.tier", domain.CodeTierNotAllowed)).exactly(),
			structured(with(hb, "data.tier", "dedicated"))},
		{rcCheck("missing token", 401, domain.CodeUnauthorized, func(t *testing.T, resp *http.Response, _ ErrorResponse) {
			if got := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
				t.Errorf("WWW-Authenticate = %q", got)
			}
		}), func(t testing.TB) req {
			r := structured(userActive())(t)
			r.NoAuth = true
			return r
		}},
		{rcCheck("wrong token", 401, domain.CodeUnauthorized, func(t *testing.T, resp *http.Response, _ ErrorResponse) {
			if got := resp.Header.Get("WWW-Authenticate"); !strings.Contains(got, `error="invalid_token"`) {
				t.Errorf("WWW-Authenticate = %q", got)
			}
		}), func(t testing.TB) req {
			r := structured(userActive())(t)
			r.Token = tokenA + "x"
			return r
		}},
		{rc("basic auth instead of bearer", 401, domain.CodeUnauthorized), func(t testing.TB) req {
			r := structured(userActive())(t)
			r.NoAuth = true
			r.Headers = map[string]string{"Authorization": "Basic dXNlcjpwYXNz"}
			return r
		}},
		{rc("bad event among good ones", 400, domain.CodeInvalid, p(2, "data.source", domain.CodeInvalid)).exactly(),
			func(t testing.TB) req {
				return req{ContentType: ContentTypeBatch, Body: mailplanetest.MustJSON(t, []map[string]any{
					good1, good2, with(userActive(), "data.source", "telepathy"), good3,
				})}
			}},
		{rc("duplicate ids in batch", 400, domain.CodeConflict, p(1, "id", domain.CodeConflict)).exactly(),
			func(t testing.TB) req {
				return req{ContentType: ContentTypeBatch, Body: mailplanetest.MustJSON(t, []map[string]any{dupA, dupB, userActive()})}
			}},
		{rc("batch over 1000 events", 413, domain.CodeTooLarge), func(t testing.TB) req {
			return req{ContentType: ContentTypeBatch, Body: mailplanetest.MustJSON(t, over)}
		}},
		{rc("binary missing ce-type", 400, domain.CodeInvalid, p(0, "ce-type", domain.CodeMissingHeader)).exactly(),
			fixed(req{ContentType: ContentTypeBinary, Body: binData, Headers: withoutHdr(binHdr, "ce-type")})},
		{rc("binary missing ce-id and ce-source", 400, domain.CodeInvalid,
			p(0, "ce-id", domain.CodeMissingHeader), p(0, "ce-source", domain.CodeMissingHeader)).exactly(),
			fixed(req{ContentType: ContentTypeBinary, Body: binData, Headers: withoutHdr(withoutHdr(binHdr, "ce-id"), "ce-source")})},
		{rc("binary ce- header that cannot name an extension", 400, domain.CodeInvalid, p(0, "ce-trace_parent", domain.CodeUnknownField)).exactly(),
			fixed(req{ContentType: ContentTypeBinary, Body: binData, Headers: plusHdr(binHdr, "ce-trace_parent", "00-abc")})},
		{rc("binary extension with a control character", 400, domain.CodeInvalid, p(0, "traceparent", domain.CodeForbiddenCharacter)).exactly(),
			fixed(req{ContentType: ContentTypeBinary, Body: binData, Headers: plusHdr(binHdr, "ce-traceparent", "00-abc%0A")})},
		{rc("binary bad percent-encoding", 400, domain.CodeInvalid, p(0, "ce-source", domain.CodeMalformedHeader)).exactly(),
			fixed(req{ContentType: ContentTypeBinary, Body: binData, Headers: plusHdr(binHdr, "ce-source", "urn:%zz")})},
		{rc("binary bad ce-time", 400, domain.CodeInvalid, p(0, "ce-time", domain.CodeInvalid)).exactly(),
			fixed(req{ContentType: ContentTypeBinary, Body: binData, Headers: plusHdr(binHdr, "ce-time", "yesterday")})},
		{rc("binary empty body", 400, domain.CodeInvalid, p(0, "data", domain.CodeRequired)),
			fixed(req{ContentType: ContentTypeBinary, Headers: binHdr})},
		{rc("binary malformed data", 400, domain.CodeMalformedJSON, p(0, "data", domain.CodeMalformedJSON)),
			fixed(req{ContentType: ContentTypeBinary, Body: []byte(`{"user_id":`), Headers: binHdr})},
		{rc("credentials missing password", 400, domain.CodeInvalid, p(0, "data.credentials", domain.CodeRequired)).exactly(),
			structured(with(mb, "data.credentials", map[string]any{}))},
		{rc("sealed and plain credentials", 400, domain.CodeInvalid, p(0, "data.sealed_credentials", domain.CodeSealedCredentialsRefused)).exactly(),
			structured(sealedAndPlain)},
		{rc("no credentials at all", 400, domain.CodeInvalid, p(0, "data.credentials", domain.CodeCredentialsRequired)).exactly(),
			structured(without(mb, "data.credentials"))},
		{rc("unknown data field", 400, domain.CodeInvalid, p(0, "data.colour", domain.CodeUnknownField)),
			structured(with(userActive(), "data.colour", "blue"))},
		{rc("attribute that cannot name an extension", 400, domain.CodeInvalid, p(0, "traceParent", domain.CodeUnknownField)),
			structured(with(userActive(), "traceParent", "00-abc"))},
		{rc("extension that is an object", 400, domain.CodeInvalid, p(0, "traceparent", domain.CodeInvalidType)),
			structured(with(userActive(), "traceparent", map[string]any{"v": 1}))},
		{rc("dataschema not a URI", 400, domain.CodeInvalid, p(0, "dataschema", domain.CodeInvalid)),
			structured(with(userActive(), "dataschema", "not a uri"))},
		{rcCheck("GET on /v1/events", 405, CodeMethodNotAllowed, func(t *testing.T, resp *http.Response, _ ErrorResponse) {
			if got := resp.Header.Get("Allow"); got != "POST" {
				t.Errorf("Allow = %q, want POST", got)
			}
		}), fixed(req{Method: http.MethodGet})},
		{rc("PUT on /v1/events", 405, CodeMethodNotAllowed), structuredAs(ContentTypeStructured, userActive(), http.MethodPut)},
		{rc("subject not the aggregate id", 400, domain.CodeInvalid, p(0, "subject", domain.CodeKeyMismatch)).exactly(),
			structured(with(userActive(), "subject", newUUID()))},
		{rc("time not RFC 3339", 400, domain.CodeInvalid, p(0, "time", domain.CodeInvalid)).exactly(),
			structured(with(userActive(), "time", "2026-05-01 12:00:00"))},
		{rc("heartbeat dated 2099", 400, domain.CodeInvalid, p(0, "time", domain.CodeTimeInFuture)).exactly(),
			structured(with(heartbeat(), "time", "2099-01-01T00:00:00Z"))},
		{rc("removal dated an hour ahead", 400, domain.CodeInvalid, p(0, "time", domain.CodeTimeInFuture)).exactly(),
			structured(with(mailboxRemoved(), "time", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)))},
		{rc("binary ce-time in 2099", 400, domain.CodeInvalid, p(0, "ce-time", domain.CodeTimeInFuture)).exactly(),
			fixed(req{ContentType: ContentTypeBinary, Body: binData, Headers: plusHdr(binHdr, "ce-time", "2099-01-01T00:00:00Z")})},
		{rc("datacontenttype text/plain", 400, domain.CodeInvalid, p(0, "datacontenttype", domain.CodeInvalid)).exactly(),
			structured(with(userActive(), "datacontenttype", "text/plain"))},
		{rc("data missing", 400, domain.CodeInvalid, p(0, "data", domain.CodeRequired)), structured(without(userActive(), "data"))},
		{rc("heartbeat egress missing", 400, domain.CodeInvalid, p(0, "data.egress", domain.CodeRequired)).exactly(),
			structured(without(heartbeat(), "data.egress"))},
		{rc("bad disable cause", 400, domain.CodeInvalid, p(0, "data.cause", domain.CodeInvalid)).exactly(),
			structured(with(mailboxDisabled(), "data.cause", "expired"))},
		{rc("failing_since not RFC 3339", 400, domain.CodeInvalid, p(0, "data.failing_since", domain.CodeInvalid)).exactly(),
			structured(with(mailboxDisabled(), "data.failing_since", "yesterday"))},
		{rc("warmup_id not a token", 400, domain.CodeInvalid, p(0, "data.warmup_id", domain.CodeInvalid)).exactly(),
			structured(with(warmupObserved(), "data.warmup_id", "<wu-1@example.com>"))},
		{rc("landed_at missing", 400, domain.CodeInvalid, p(0, "data.landed_at", domain.CodeRequired)).exactly(),
			structured(without(warmupObserved(), "data.landed_at"))},
		{rc("bad batch with an observation", 400, domain.CodeInvalid, p(1, "data.placement", domain.CodeInvalid)).exactly(),
			func(t testing.TB) req {
				return req{ContentType: ContentTypeBatch, Body: mailplanetest.MustJSON(t, []map[string]any{warmupObserved(), with(warmupObserved(), "data.placement", "spam")})}
			}},
		{rc("several problems in one event", 400, domain.CodeInvalid,
			p(0, "id", domain.CodeForbiddenCharacter), p(0, "source", domain.CodeRequired), p(0, "data.source", domain.CodeInvalid)),
			structured(with(with(without(userActive(), "source"), "id", "no\u0000pe"), "data.source", "carrier pigeon"))},
		{rc("unknown route", 404, domain.CodeNotFound), fixed(req{Path: "/v1/nope", ContentType: ContentTypeStructured, Body: []byte(`{}`)})},
	}
	if len(cases) < 30 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			resp, body := e.Do(tc.mk(t))
			t.Logf("%d %s", resp.StatusCode, body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			er := decodeErr(t, body)
			if er.Error.Code != tc.code {
				t.Errorf("code %q, want %q: %s", er.Error.Code, tc.code, body)
			}
			if er.Error.Message == "" {
				t.Errorf("no message: %s", body)
			}
			for _, w := range tc.problems {
				found := false
				for _, got := range er.Problems {
					if got.Index == w.index && got.Field == w.field && got.Code == w.code {
						found = true
					}
				}
				if !found {
					t.Errorf("no problem {index %d, field %q, code %q} in %s", w.index, w.field, w.code, body)
				}
			}
			if tc.only && len(er.Problems) != len(tc.problems) {
				t.Errorf("%d problems, want exactly %d: %s", len(er.Problems), len(tc.problems), body)
			}
			for _, got := range er.Problems {
				if got.Code == "" || got.Message == "" {
					t.Errorf("problem without code or message: %+v", got)
				}
			}
			if bytes.Contains(body, []byte("XYZZY")) {
				t.Errorf("response echoes part of the secret: %s", body)
			}
			if tc.check != nil {
				tc.check(t, resp, er)
			}
			e.assertNothingProduced()
		})
	}
}

func rc(name string, status int, code domain.Code, ps ...wantProblem) rejectCase {
	return rejectCase{name: name, status: status, code: code, problems: ps}
}

func rcCheck(name string, status int, code domain.Code, check func(*testing.T, *http.Response, ErrorResponse)) rejectCase {
	return rejectCase{name: name, status: status, code: code, check: check}
}

func (c rejectCase) exactly() rejectCase { c.only = true; return c }

func p(index int, field string, code domain.Code) wantProblem { return wantProblem{index, field, code} }

func fixed(r req) func(testing.TB) req { return func(testing.TB) req { return r } }

func structuredAs(ct string, ev map[string]any, method ...string) func(testing.TB) req {
	return func(t testing.TB) req {
		r := req{ContentType: ct, Body: mailplanetest.MustJSON(t, ev)}
		if len(method) > 0 {
			r.Method = method[0]
		}
		return r
	}
}
