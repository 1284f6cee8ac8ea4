package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/opsaudit"
	"github.com/mailplane/mailplane/internal/query"
)

type loginView struct {
	Token string // the login form's CSRF token
	Error string
}

func (c *Console) loginForm(w http.ResponseWriter, r *http.Request) {
	c.renderLogin(w, r, http.StatusOK, "")
}

func (c *Console) renderLogin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	tok := randomToken()
	setCookie(w, r, cookieLoginCSRF, tok, 10*time.Minute)
	c.render(w, "login", status, &view{Title: "Log in", Data: loginView{Token: tok, Error: msg}, Now: c.cfg.Now().UTC()})
}

// login trades an ops token for a session. Every attempt the handler
// sees is recorded in the operator audit (audit); a login the audit
// cannot record is refused, so every session has its record.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		c.loginRefused(w, r, c.client(r), domain.CodeForbidden, "refused", http.StatusForbidden, "cross-site form posts are refused", false)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		c.loginRefused(w, r, c.client(r), domain.CodeInvalid, "refused", http.StatusBadRequest, "the form could not be read", false)
		return
	}
	if !equalSecret(r.PostForm.Get("csrf"), cookieValue(r, cookieLoginCSRF)) {
		c.loginRefused(w, r, c.client(r), domain.CodeForbidden, "refused", http.StatusForbidden, "the form expired or was not ours; load the login page again", false)
		return
	}
	tok := strings.TrimSpace(r.PostForm.Get("token"))
	if !checkToken(tok) {
		c.loginRefused(w, r, c.client(r), domain.CodeUnauthorized, "invalid", http.StatusUnauthorized, "that is not a token", true)
		return
	}
	caller, ok := c.cfg.Auth.Authenticate(tok)
	if !ok || caller == nil {
		c.loginRefused(w, r, c.client(r), domain.CodeUnauthorized, "invalid", http.StatusUnauthorized, "the token is not valid", true)
		return
	}
	if !caller.Has(domain.ScopeOps) {
		c.log.Info("console login refused: no ops scope", "caller", caller.Name)
		c.loginRefused(w, r, opsaudit.Caller(caller.Name), domain.CodeForbidden, "forbidden", http.StatusForbidden, "the console needs a token with the ops scope", true)
		return
	}
	if err := c.audit(r, opsaudit.Entry{Actor: opsaudit.Caller(caller.Name), Action: domain.OpsConsoleLogin}); err != nil {
		c.logins.WithLabelValues("unaudited").Inc()
		c.renderLogin(w, r, http.StatusServiceUnavailable, "the login could not be recorded in the operator audit, so it is refused; retry")
		return
	}
	c.logins.WithLabelValues("ok").Inc()
	id, _ := c.sess.create(tok, caller.Name)
	setCookie(w, r, cookieSession, id, c.cfg.SessionTTL)
	setCookie(w, r, cookieLoginCSRF, "", 0)
	c.log.Info("console login", "caller", caller.Name)
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

// logout ends the session; it is recorded, but a record that cannot be
// written does not keep anyone logged in.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	ss, err := c.sessionPost(w, r)
	if err != nil {
		_ = c.audit(r, opsaudit.Entry{Actor: c.postActor(r, ss), Action: domain.OpsConsoleLogout, Err: err, Refused: true})
		return
	}
	c.sess.drop(cookieValue(r, cookieSession))
	setCookie(w, r, cookieSession, "", 0)
	_ = c.audit(r, opsaudit.Entry{Actor: opsaudit.Caller(ss.caller), Action: domain.OpsConsoleLogout})
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// postActor is who made a session post: the session's caller, else the
// client's address.
func (c *Console) postActor(r *http.Request, ss *session) opsaudit.Actor {
	if ss != nil {
		return opsaudit.Caller(ss.caller)
	}
	return c.client(r)
}

// sessionPost admits a form post of a logged-in operator: same origin,
// a readable form, a live session whose token still holds ops, and the
// session's CSRF token in the form's csrf field. Otherwise it answers and
// returns why (with the session, when there was a live one). Every POST
// but the login goes through it.
func (c *Console) sessionPost(w http.ResponseWriter, r *http.Request) (*session, error) {
	if !sameOrigin(r) {
		c.refuse(w, http.StatusForbidden, "cross-site form posts are refused")
		return nil, domain.Errorf(domain.CodeForbidden, "cross-site form post")
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		c.refuse(w, http.StatusBadRequest, "the form could not be read")
		return nil, domain.Errorf(domain.CodeInvalid, "the form could not be read")
	}
	ss, ok := c.authenticate(r)
	if !ok {
		c.refuse(w, http.StatusForbidden, "the form expired or was not ours")
		return nil, domain.Errorf(domain.CodeUnauthorized, "no live session")
	}
	if !equalSecret(r.PostForm.Get("csrf"), ss.csrf) {
		c.refuse(w, http.StatusForbidden, "the form expired or was not ours")
		return ss, domain.Errorf(domain.CodeForbidden, "the form's CSRF token is not the session's")
	}
	return ss, nil
}

func (c *Console) refuse(w http.ResponseWriter, status int, msg string) {
	c.render(w, "error", status, &view{Title: "Refused", Data: msg, Now: c.cfg.Now().UTC()})
}

func (c *Console) fleet(_ http.ResponseWriter, r *http.Request, v *view) (string, int, error) {
	o, err := c.cfg.Facts.Workers(r.Context())
	if err != nil {
		return "", 0, err
	}
	v.Title, v.Data = "Fleet", o
	return "fleet", http.StatusOK, nil
}

// mailboxSearch sends the search box's id to its page.
func (c *Console) mailboxSearch(w http.ResponseWriter, r *http.Request, v *view) (string, int, error) {
	id := strings.ToLower(strings.TrimSpace(r.URL.Query().Get("id")))
	if err := query.CheckID("mailbox", id); err != nil {
		v.Search = r.URL.Query().Get("id")
		return "", 0, err
	}
	http.Redirect(w, r, Prefix+"mailboxes/"+url.PathEscape(id), http.StatusSeeOther)
	return "", 0, nil
}

type mailboxView struct {
	M     query.Mailbox
	Chart chart
}

func (c *Console) mailbox(_ http.ResponseWriter, r *http.Request, v *view) (string, int, error) {
	v.Search = r.PathValue("id")
	m, err := c.cfg.Facts.Mailbox(r.Context(), r.PathValue("id"))
	if err != nil {
		return "", 0, err
	}
	mv := mailboxView{M: m}
	if m.Health != nil {
		mv.Chart = evidenceChart(m.Health.Evidence, c.cfg.Now(), c.cfg.HealthWindow)
	}
	v.Title, v.Data = "Mailbox "+m.ID, mv
	return "mailbox", http.StatusOK, nil
}

func (c *Console) org(_ http.ResponseWriter, r *http.Request, v *view) (string, int, error) {
	o, err := c.cfg.Facts.Org(r.Context(), r.PathValue("id"))
	if err != nil {
		return "", 0, err
	}
	v.Title, v.Data = "Org "+o.ID, o
	return "org", http.StatusOK, nil
}

func (c *Console) consumers(_ http.ResponseWriter, r *http.Request, v *view) (string, int, error) {
	cs, err := c.cfg.Consumers.Consumers(r.Context())
	if err != nil {
		return "", 0, err
	}
	v.Title, v.Data = "Consumers", consumerRows(cs)
	return "consumers", http.StatusOK, nil
}

// dlqFilter is the DLQ list's filters, each an exact match when set.
type dlqFilter struct {
	Consumer, Code, Topic string
}

type dlqView struct {
	Filter  dlqFilter
	Entries []dlq.Entry
	Read    int // dead letters read before filtering
	Limit   int
}

// filterValue checks one filter: short clean text or nothing.
func filterValue(q url.Values, name string) (string, error) {
	v := strings.TrimSpace(q.Get(name))
	if len(v) > 200 || !domain.IsCleanText(v) {
		return "", domain.Errorf(domain.CodeInvalid, "filter %s must be short text without control characters", name)
	}
	return v, nil
}

func (c *Console) dlqList(_ http.ResponseWriter, r *http.Request, v *view) (string, int, error) {
	q := r.URL.Query()
	var f dlqFilter
	var err error
	for _, p := range []struct {
		name string
		to   *string
	}{{"consumer", &f.Consumer}, {"code", &f.Code}, {"topic", &f.Topic}} {
		if *p.to, err = filterValue(q, p.name); err != nil {
			return "", 0, err
		}
	}
	entries, err := c.cfg.DLQ(r.Context(), DLQShown)
	if err != nil {
		return "", 0, err
	}
	dv := dlqView{Filter: f, Read: len(entries), Limit: DLQShown}
	for i := len(entries) - 1; i >= 0; i-- { // newest first
		e := entries[i]
		if (f.Consumer == "" || e.Consumer == f.Consumer) && (f.Code == "" || string(e.ErrorCode) == f.Code) &&
			(f.Topic == "" || e.SourceTopic == f.Topic) {
			dv.Entries = append(dv.Entries, e)
		}
	}
	v.Title, v.Data = "Dead letters", dv
	return "dlq", http.StatusOK, nil
}

type dlqEntryView struct {
	E dlq.Entry
	// Value is the value as text when it is printable UTF-8 JSON or text,
	// else empty and Binary set.
	Value  string
	Binary bool
	// CanRedrive: this process redrives (the button is shown).
	CanRedrive bool
	// Redriven is its latest redrive, when there was one.
	Redriven *dlq.Redriven
	// Report is what a redrive from this page just did.
	Report *dlq.Report
}

func (c *Console) dlqEntry(_ http.ResponseWriter, r *http.Request, v *view) (string, int, error) {
	e, err := c.findDeadLetter(r)
	if err != nil {
		return "", 0, err
	}
	ev, err := c.entryView(r.Context(), e)
	if err != nil {
		return "", 0, err
	}
	v.Title, v.Data = fmt.Sprintf("Dead letter %d/%d", e.Partition, e.Offset), ev
	return "dlqentry", http.StatusOK, nil
}

// findDeadLetter finds the dead letter the path names among the newest
// DLQShown.
func (c *Console) findDeadLetter(r *http.Request) (dlq.Entry, error) {
	part, err1 := strconv.ParseInt(r.PathValue("partition"), 10, 32)
	off, err2 := strconv.ParseInt(r.PathValue("offset"), 10, 64)
	if err1 != nil || err2 != nil || part < 0 || off < 0 {
		return dlq.Entry{}, domain.Errorf(domain.CodeInvalid, "a dead letter is named by its partition and offset, both non-negative integers")
	}
	entries, err := c.cfg.DLQ(r.Context(), DLQShown)
	if err != nil {
		return dlq.Entry{}, err
	}
	for _, e := range entries {
		if e.Partition == int32(part) && e.Offset == off {
			return e, nil
		}
	}
	return dlq.Entry{}, domain.Errorf(domain.CodeNotFound, "no dead letter at %d/%d among the newest %d", part, off, DLQShown)
}

func (c *Console) entryView(ctx context.Context, e dlq.Entry) (dlqEntryView, error) {
	ev := dlqEntryView{E: e, CanRedrive: c.cfg.Redrive != nil}
	if e.ValueWithheld == "" {
		s := string(e.Value)
		if domain.IsCleanText(strings.NewReplacer("\n", "", "\t", "", "\r", "").Replace(s)) {
			ev.Value = s
		} else {
			ev.Binary = true
		}
	}
	if c.cfg.Redriven != nil {
		done, err := c.cfg.Redriven(ctx, []dlq.Entry{e})
		if err != nil {
			return ev, err
		}
		if rd, ok := done[dlq.Location{Partition: e.Partition, Offset: e.Offset}]; ok {
			ev.Redriven = &rd
		}
	}
	return ev, nil
}

// redrive hands one dead letter back to its consumer, as the logged-in
// operator (the redrive records who), and shows the entry with what the
// redrive did. The form's options are the CLI's: again, out_of_order.
// It is recorded in the operator audit (refused ones included); a redrive
// the audit cannot record is done but answered as an error that says so.
func (c *Console) redrive(w http.ResponseWriter, r *http.Request) {
	ss, err := c.sessionPost(w, r)
	if err != nil {
		_ = c.audit(r, opsaudit.Entry{Actor: c.postActor(r, ss), Action: domain.OpsDLQRedrive, Err: err, Refused: true})
		return
	}
	// The session's token, as it authenticates now (sessionPost checked
	// it holds ops): the caller the redrive records.
	_, caller, ok := c.authenticateCaller(r)
	if !ok {
		_ = c.audit(r, opsaudit.Entry{Actor: opsaudit.Caller(ss.caller), Action: domain.OpsDLQRedrive,
			Err: domain.Errorf(domain.CodeUnauthorized, "the session ended"), Refused: true})
		c.refuse(w, http.StatusForbidden, "the session ended")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), redriveTimeout)
	defer cancel()
	r = r.WithContext(ctx)
	v := &view{Caller: ss.caller, CSRF: ss.csrf, Now: c.cfg.Now().UTC()}
	e, rep, ae, err := c.runRedrive(ctx, r, caller)
	ae.Actor, ae.Action = opsaudit.Caller(caller.Name), domain.OpsDLQRedrive
	if aerr := c.audit(r, ae); aerr != nil && err == nil {
		err = domain.Errorf(domain.CodeUnavailable, "the redrive ran (%s), but the operator audit could not record it", rep.RedriveID)
	}
	if err != nil {
		c.fail(w, v, err)
		return
	}
	ev, err := c.entryView(ctx, e)
	if err != nil {
		c.fail(w, v, err)
		return
	}
	ev.Report = &rep
	v.Title, v.Data = fmt.Sprintf("Dead letter %d/%d", e.Partition, e.Offset), ev
	c.render(w, "dlqentry", http.StatusOK, v)
}

// runRedrive redrives the post's dead letter as caller and returns it,
// the report, the audit entry's outcome and parameters (refused when the
// redrive refused the dead letter: its code), and the error the page
// shows.
func (c *Console) runRedrive(ctx context.Context, r *http.Request, caller *domain.Caller) (dlq.Entry, dlq.Report, opsaudit.Entry, error) {
	if c.cfg.Redrive == nil {
		err := domain.Errorf(domain.CodeNotRedrivable, "this process does not redrive; use mailplane dlq redrive")
		return dlq.Entry{}, dlq.Report{}, opsaudit.Entry{Err: err, Refused: true}, err
	}
	e, err := c.findDeadLetter(r)
	if err != nil {
		return e, dlq.Report{}, opsaudit.Entry{Err: err, Refused: opsaudit.Refusal(err)}, err
	}
	off := e.Offset
	sel := dlq.Selection{Consumer: e.Consumer, FromOffset: &off, ToOffset: &off,
		Again: r.PostForm.Get("again") == "on", OutOfOrder: r.PostForm.Get("out_of_order") == "on"}
	rep, err := c.cfg.Redrive(ctx, caller, sel)
	params := opsaudit.RedriveParams(sel, &rep)
	if err != nil {
		return e, rep, opsaudit.Entry{Params: &params, Err: err, Refused: opsaudit.Refusal(err)}, err
	}
	c.log.Info("console redrive", "caller", caller.Name, "consumer", e.Consumer, "dlq_partition", e.Partition, "dlq_offset", e.Offset,
		"redrive_id", rep.RedriveID, "redriven", rep.Count(dlq.OutcomeRedriven), "refused", rep.Count(dlq.OutcomeRefused), "skipped", rep.Count(dlq.OutcomeSkipped))
	ae := opsaudit.Entry{Params: &params}
	for _, it := range rep.Items {
		if it.Outcome == dlq.OutcomeRefused && rep.Count(dlq.OutcomeRedriven) == 0 {
			// Recorded as refused; the page shows the report all the same.
			ae.Err, ae.Refused = domain.Errorf(it.Code, "%s", it.Reason), true
			break
		}
	}
	return e, rep, ae, nil
}

// redriveTimeout bounds a redrive from the console: it reads the source
// partition from the dead letter to its end (the out-of-order check).
const redriveTimeout = 2 * time.Minute
