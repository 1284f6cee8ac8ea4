package console

import (
	"context"
	"net/http"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/opsaudit"
)

// Auditor records operator actions in the operator audit;
// *opsaudit.Recorder is one.
type Auditor interface {
	Record(ctx context.Context, e opsaudit.Entry) error
}

// audit records one console action: exactly one record per login, logout
// and redrive the console's handlers see, refused ones included. Posts
// without a live session are refused before any handler (screenPost):
// they name no one and change nothing, and recording them would let
// anyone write the audit at will; nor are rate-limited logins recorded
// (mailplane_console_logins_total counts them). A nil Auditor records
// nothing (a console built without one, in tests).
func (c *Console) audit(r *http.Request, e opsaudit.Entry) error {
	if c.cfg.Audit == nil {
		return nil
	}
	// The record outlives a client that went away: the action happened.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), opsaudit.Timeout)
	defer cancel()
	return c.cfg.Audit.Record(ctx, e)
}

// client is the actor of a request nobody authenticated: its address
// (through trusted proxies, as the login limit counts it).
func (c *Console) client(r *http.Request) opsaudit.Actor {
	a := clientIP(r, c.cfg.TrustedProxies)
	if !a.IsValid() {
		return opsaudit.ClientAddress("unknown")
	}
	return opsaudit.ClientAddress(a.String())
}

// loginRefused records a refused login and answers it with msg.
func (c *Console) loginRefused(w http.ResponseWriter, r *http.Request, actor opsaudit.Actor, code domain.Code, result string, status int, msg string, form bool) {
	c.logins.WithLabelValues(result).Inc()
	_ = c.audit(r, opsaudit.Entry{Actor: actor, Action: domain.OpsConsoleLogin, Err: domain.Errorf(code, "%s", msg), Refused: true})
	if form {
		c.renderLogin(w, r, status, msg)
		return
	}
	c.refuse(w, status, msg)
}

// AuditShown bounds the records the Audit page reads.
const AuditShown = 200

type auditView struct {
	Records     []opsaudit.Record
	Limit       int
	Unavailable bool
}

// auditPage shows the newest operator audit records, newest first.
func (c *Console) auditPage(_ http.ResponseWriter, r *http.Request, v *view) (string, int, error) {
	av := auditView{Limit: AuditShown, Unavailable: c.cfg.AuditLog == nil}
	if c.cfg.AuditLog != nil {
		recs, err := c.cfg.AuditLog(r.Context(), AuditShown)
		if err != nil {
			return "", 0, err
		}
		av.Records = recs
	}
	v.Title, v.Data = "Operator audit", av
	return "audit", http.StatusOK, nil
}
