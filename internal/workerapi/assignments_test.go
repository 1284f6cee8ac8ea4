package workerapi_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/apitest"
	"github.com/mailplane/mailplane/internal/workerapi"
)

func TestTokenRoundTrip(t *testing.T) {
	t.Parallel()
	for _, off := range []int64{0, 1, 255, 1 << 32, 1<<63 - 1} {
		tok := workerapi.TokenAt(off)
		s := tok.String()
		if len(s) != 12 {
			t.Errorf("token of %d is %q (%d chars)", off, s, len(s))
		}
		got, err := workerapi.ParseToken(s)
		if err != nil || got != tok || got.Offset() != off || got.IsZero() {
			t.Errorf("ParseToken(%q) = %v, %v; want offset %d", s, got, err, off)
		}
	}
	if z, err := workerapi.ParseToken(""); err != nil || !z.IsZero() || z.String() != "" {
		t.Errorf("empty token: %v %v", z, err)
	}
	if !workerapi.TokenAt(-1).IsZero() {
		t.Error("TokenAt(-1) is not zero")
	}
	for _, bad := range []string{"x", "AQAAAAAAAAAF=", "AQAAAAAAAAAF AQ", "AgAAAAAAAAAF", "AQAAAAAAAAAFAA", "AQAAAAAAAAA+", "AQAAAAAAAAA/"} {
		if _, err := workerapi.ParseToken(bad); domain.ErrorCode(err) != domain.CodeInvalid {
			t.Errorf("ParseToken(%q): %v, want code invalid", bad, err)
		}
	}
}

var (
	mailboxA = "0190f3c4-0000-7000-8000-00000000000a"
	mailboxB = "0190f3c4-0000-7000-8000-00000000000b"
	orgID    = "0190f3c4-0000-7000-8000-0000000000f1"
	at       = time.Date(2026, 4, 30, 8, 0, 0, 0, time.UTC)
)

// TestAssignmentsResponses checks the two response shapes, that the token
// reaches the store, and how store errors are answered.
func TestAssignmentsResponses(t *testing.T) {
	t.Parallel()
	store := &fakeStore{answer: func(w string, since workerapi.Token) (workerapi.Result, error) {
		switch {
		case w != workerID:
			return workerapi.Result{Full: since.IsZero(), Token: workerapi.TokenAt(9)}, nil
		case since.IsZero():
			return workerapi.Result{Full: true, Token: workerapi.TokenAt(9), Mailboxes: []workerapi.Assignment{
				{MailboxID: mailboxA, OrgID: orgID, Band: domain.RiskClean, WeightMilli: 1000, AssignedAt: at},
			}}, nil
		case since.Offset() == 3:
			return workerapi.Result{Token: workerapi.TokenAt(9),
				Added:   []workerapi.Assignment{{MailboxID: mailboxB, OrgID: orgID, Band: domain.RiskRisky, WeightMilli: 400, AssignedAt: at}},
				Removed: []string{mailboxA}}, nil
		case since.Offset() == 1:
			return workerapi.Result{}, workerapi.ErrTokenExpired
		case since.Offset() == 2:
			return workerapi.Result{}, errors.New("connection refused")
		case since.Offset() == 4:
			return workerapi.Result{}, context.DeadlineExceeded
		}
		return workerapi.Result{Full: true}, nil // the wrong kind
	}}
	e := newEnv(t, workerapi.WithAssignmentStore(store))
	path := "/v1/workers/" + workerID + "/assignments"

	resp, b := e.Do(req{Method: http.MethodGet, Path: path})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("full: %d %s", resp.StatusCode, b)
	}
	full := apitest.DecodeStrict[workerapi.FullResponse](t, b)
	if !full.Full || full.WorkerID != workerID || len(full.Mailboxes) != 1 || full.Mailboxes[0].MailboxID != mailboxA ||
		full.Token != workerapi.TokenAt(9).String() || resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("full: %s", b)
	}

	// An unknown worker has nothing yet; arrays are [] not null.
	other := "0190f3c4-5d6e-7f80-9a1b-000000000000"
	resp, b = e.Do(req{Token: readerToken, Method: http.MethodGet, Path: "/v1/workers/" + other + "/assignments"})
	if resp.StatusCode != http.StatusOK || string(b) != `{"worker_id":"`+other+`","full":true,"mailboxes":[],"token":"`+workerapi.TokenAt(9).String()+`"}`+"\n" {
		t.Errorf("unknown worker: %d %s", resp.StatusCode, b)
	}
	resp, b = e.Do(req{Token: readerToken, Method: http.MethodGet, Path: "/v1/workers/" + other + "/assignments?since=" + workerapi.TokenAt(9).String()})
	if resp.StatusCode != http.StatusOK || string(b) != `{"worker_id":"`+other+`","full":false,"added":[],"removed":[],"token":"`+workerapi.TokenAt(9).String()+`"}`+"\n" {
		t.Errorf("unknown worker, changes: %d %s", resp.StatusCode, b)
	}

	// "since=" (empty) is no token.
	resp, b = e.Do(req{Method: http.MethodGet, Path: path + "?since="})
	if resp.StatusCode != http.StatusOK || !apitest.DecodeStrict[workerapi.FullResponse](t, b).Full {
		t.Errorf("empty since: %d %s", resp.StatusCode, b)
	}

	resp, b = e.Do(req{Method: http.MethodGet, Path: path + "?since=" + workerapi.TokenAt(3).String()})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("changes: %d %s", resp.StatusCode, b)
	}
	ch := apitest.DecodeStrict[workerapi.ChangesResponse](t, b)
	if ch.Full || len(ch.Added) != 1 || ch.Added[0].MailboxID != mailboxB || ch.Added[0].WeightMilli != 400 ||
		len(ch.Removed) != 1 || ch.Removed[0].MailboxID != mailboxA || ch.Token != workerapi.TokenAt(9).String() {
		t.Errorf("changes: %s", b)
	}

	for _, c := range []struct {
		name   string
		since  int64
		status int
		code   domain.Code
	}{
		{"expired token", 1, http.StatusGone, workerapi.CodeExpired},
		{"database down", 2, http.StatusServiceUnavailable, domain.CodeUnavailable},
		{"query timeout", 4, http.StatusServiceUnavailable, domain.CodeUnavailable},
		{"store answers the wrong kind", 5, http.StatusInternalServerError, domain.CodeInternal},
	} {
		resp, b := e.Do(req{Method: http.MethodGet, Path: path + "?since=" + workerapi.TokenAt(c.since).String()})
		er := apitest.DecodeStrict[api.ErrorResponse](t, b)
		if resp.StatusCode != c.status || er.Error.Code != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, resp.StatusCode, b, c.status, c.code)
		}
	}
	e.assertNothingProduced()
}

// TestAssignmentsRouteOptional: without a store only the heartbeat route
// is mounted.
func TestAssignmentsRouteOptional(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	resp, b := e.Do(req{Method: http.MethodGet, Path: "/v1/workers/" + workerID + "/assignments"})
	if resp.StatusCode != http.StatusNotFound || apitest.DecodeStrict[api.ErrorResponse](t, b).Error.Code != domain.CodeNotFound {
		t.Errorf("%d %s", resp.StatusCode, b)
	}
}

func TestRegisterRefusesBadOptions(t *testing.T) {
	t.Parallel()
	if err := workerapi.Register(nil); err == nil {
		t.Error("nil server accepted")
	}
	srv, err := api.New(apitest.NopProducer{}, api.WithAuthenticator(testAuth(t)))
	if err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]workerapi.Option{
		"zero body limit": workerapi.WithMaxBodyBytes(0),
		"empty source":    workerapi.WithSource(""),
		"nil clock":       workerapi.WithClock(nil),
		"zero timeout":    workerapi.WithQueryTimeout(0),
	} {
		if err := workerapi.Register(srv, o); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	if err := workerapi.Register(srv, workerapi.WithAssignmentStore(&fakeStore{})); err != nil {
		t.Fatal(err)
	}
	if err := workerapi.Register(srv); err == nil {
		t.Error("mounting the routes twice succeeded")
	}
}
