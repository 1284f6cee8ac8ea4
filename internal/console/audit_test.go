package console_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/console"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/opsaudit"
)

// TestConsoleActionsAudited: every login, logout and redrive the console
// handles is one record of the operator audit on the log: a wrong token
// by the client's address, a token without ops by its caller, refused; a
// login, a redrive refused for its CSRF token, a redrive and a logout by
// the operator.
func TestConsoleActionsAudited(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 4)
	rec, err := opsaudit.New(kcfg, "mailplane/api", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rec.Close)
	ts, _, _ := unitConfig(t, func(c *console.Config) {
		c.Audit = rec
		c.AuditLog = func(ctx context.Context, limit int) ([]opsaudit.Record, error) {
			return opsaudit.Recent(ctx, kcfg, limit)
		}
		c.Redrive = func(_ context.Context, _ *domain.Caller, sel dlq.Selection) (dlq.Report, error) {
			return dlq.Report{RedriveID: "r1", Items: []dlq.Item{{Outcome: dlq.OutcomeRedriven, Offset: 42}}}, nil
		}
	})
	same := map[string]string{"Origin": ts.URL, "Sec-Fetch-Site": "same-origin"}
	if resp, _ := login(t, ts, browserish(t), "not-a-token-at-all-0123456789"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a wrong token: %d", resp.StatusCode)
	}
	if resp, _ := login(t, ts, browserish(t), unitReader); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a token without ops: %d", resp.StatusCode)
	}
	cl := browserish(t)
	if resp, _ := login(t, ts, cl, unitOps); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	_, page := fetch(t, cl, "GET", ts.URL+"/console/dlq/0/8", nil, nil)
	csrf := csrfField.FindStringSubmatch(page)[1]
	if resp, _ := fetch(t, cl, "POST", ts.URL+"/console/dlq/0/8/redrive", url.Values{"csrf": {"x" + csrf}}, same); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("redrive with a wrong CSRF token: %d", resp.StatusCode)
	}
	if resp, _ := fetch(t, cl, "POST", ts.URL+"/console/dlq/0/8/redrive", url.Values{"csrf": {csrf}, "again": {"on"}}, same); resp.StatusCode != http.StatusOK {
		t.Fatalf("redrive: %d", resp.StatusCode)
	}
	// The Audit page shows them, newest first.
	resp, page := fetch(t, cl, "GET", ts.URL+"/console/audit", nil, nil)
	if resp.StatusCode != http.StatusOK || strings.Count(page, `class="audit-record"`) != 5 || !strings.Contains(page, "127.0.0.1") ||
		strings.Index(page, "dlq_redrive") > strings.Index(page, "console_login") {
		t.Fatalf("audit page: %d\n%s", resp.StatusCode, page)
	}
	if resp, _ := fetch(t, cl, "POST", ts.URL+"/console/logout", url.Values{"csrf": {csrf}}, same); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	got, err := opsaudit.Recent(t.Context(), kcfg, 100)
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(got)
	want := []struct {
		kind    domain.OpsActorKind
		actor   string
		action  domain.OpsActionName
		outcome domain.OpsOutcome
		code    string
	}{
		{domain.OpsActorClientAddress, "127.0.0.1", domain.OpsConsoleLogin, domain.OpsRefused, "unauthorized"},
		{domain.OpsActorCaller, "product", domain.OpsConsoleLogin, domain.OpsRefused, "forbidden"},
		{domain.OpsActorCaller, "ops-person", domain.OpsConsoleLogin, domain.OpsOK, ""},
		{domain.OpsActorCaller, "ops-person", domain.OpsDLQRedrive, domain.OpsRefused, "forbidden"},
		{domain.OpsActorCaller, "ops-person", domain.OpsDLQRedrive, domain.OpsOK, ""},
		{domain.OpsActorCaller, "ops-person", domain.OpsConsoleLogout, domain.OpsOK, ""},
	}
	if len(got) != len(want) {
		t.Fatalf("%d audit records, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.ActorKind != w.kind || g.Actor != w.actor || g.Action != w.action || g.Outcome != w.outcome || g.Code != w.code || g.Source != "mailplane/api" {
			t.Errorf("audit record %d: %+v, want %+v", i, g.OpsAction, w)
		}
	}
	if p := got[4].Params; p == nil || p.Target != "health" || p.Filter != "from_offset=8 to_offset=8 again" || p.Count != 1 {
		t.Errorf("redrive parameters %+v", p)
	}
}

// failingAudit is an operator audit that cannot write.
type failingAudit struct{}

func (failingAudit) Record(context.Context, opsaudit.Entry) error { return errors.New("broker down") }

// TestConsoleLoginRefusedUnaudited: a login the audit cannot record is
// refused: no session without its record.
func TestConsoleLoginRefusedUnaudited(t *testing.T) {
	t.Parallel()
	ts, _, reg := unitConfig(t, func(c *console.Config) { c.Audit = failingAudit{} })
	cl := browserish(t)
	resp, _ := login(t, ts, cl, unitOps)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("login: %d, want 503", resp.StatusCode)
	}
	for _, c := range resp.Cookies() {
		if c.Name == "mailplane_console" && c.Value != "" {
			t.Fatalf("a session was issued: %+v", c)
		}
	}
	if resp, _ := fetch(t, cl, "GET", ts.URL+"/console/", nil, nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("the fleet page without a session: %d", resp.StatusCode)
	}
	if v := logins(t, reg, "unaudited"); v != 1 {
		t.Errorf("logins_total{unaudited} = %v", v)
	}
}
