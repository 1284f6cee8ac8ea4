// Package console is the ops web console, served by the api role at
// /console/: server-rendered html/template pages, no JavaScript at all.
// Pages: the fleet (workers by tier and pool, load against capacity,
// liveness, stopping, pending placements), a mailbox (decision history,
// band, health and its warmup evidence as an SVG chart, sync owner, lag,
// last sync, failures, disabled reason), an org, the consumers against
// their SLA tiers, the DLQ (list with filters, one entry with its
// headers and its value or why it was withheld), and the operator audit
// (the newest records, newest first).
//
// Only ops callers get in: the login form takes an ops token and sets an
// opaque session cookie (HttpOnly, SameSite=Strict, Secure over TLS,
// expiring); every form post carries a CSRF token and must be
// same-origin; every answer carries a strict Content-Security-Policy
// (no script at all). The facts come from internal/query, the same read
// model as the JSON query API.
package console

import (
	"context"
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/opsaudit"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/internal/promreg"
	"github.com/mailplane/mailplane/internal/query"
)

// Facts is the read model the pages show; *query.Reader is one.
type Facts interface {
	Mailbox(ctx context.Context, id string) (query.Mailbox, error)
	Org(ctx context.Context, id string) (query.Org, error)
	Workers(ctx context.Context) (postgres.Overview, error)
}

// Consumers reads the consumers' standing; *query.ConsumerReader is one.
type Consumers interface {
	Consumers(ctx context.Context) ([]query.Consumer, error)
}

// DLQLister lists at most the newest limit dead letters, oldest first
// (dlq.List bound to a broker config).
type DLQLister func(ctx context.Context, limit int) ([]dlq.Entry, error)

// Redriver redrives the selected dead letters as caller (dlq.Redrive).
type Redriver func(ctx context.Context, caller *domain.Caller, sel dlq.Selection) (dlq.Report, error)

// Config is what the console needs.
type Config struct {
	// Auth tells who a token belongs to (the API's authenticator).
	Auth      api.Authenticator
	Facts     Facts
	Consumers Consumers
	DLQ       DLQLister
	// Redrive, when set, hands dead letters back to their consumer for
	// the logged-in operator (dlq.Redrive bound to a broker and a pool):
	// the DLQ entry page's button. Without it the page says to use the CLI.
	Redrive Redriver
	// Redriven, when set, tells which dead letters were redriven
	// (dlq.Redrives bound to a pool).
	Redriven func(ctx context.Context, entries []dlq.Entry) (map[dlq.Location]dlq.Redriven, error)
	// Audit records logins, logouts and redrives in the operator audit
	// (an *opsaudit.Recorder); nil records nothing.
	Audit Auditor
	// AuditLog, when set, reads the newest records of the operator audit
	// (opsaudit.Recent bound to a broker config): the Audit page.
	AuditLog func(ctx context.Context, limit int) ([]opsaudit.Record, error)
	// SessionTTL is a session's life (default DefaultSessionTTL).
	SessionTTL time.Duration
	// LoginsPerMinute and LoginBurst limit login attempts per client
	// address (defaults DefaultLoginsPerMinute, DefaultLoginBurst).
	LoginsPerMinute float64
	LoginBurst      int
	// TrustedProxies are the peers whose X-Forwarded-For is believed for
	// the client address of login attempts (default: none).
	TrustedProxies []netip.Prefix
	// HealthWindow is the span of the evidence chart: the health scorer's
	// window (default domain.DefaultHealthPolicy's).
	HealthWindow time.Duration
	// Registerer takes the console's metrics (default: a private registry).
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	Now        func() time.Time
}

// The console's routes. Its pages answer HTML, so they are not part of
// the OpenAPI document.
const (
	Prefix = "/console/"
	// DLQShown bounds the dead letters one DLQ page reads.
	DLQShown = 1000
	// pageTimeout bounds the reads behind one page.
	pageTimeout = 15 * time.Second
)

//go:embed templates/*.html static/*
var files embed.FS

// Console serves the pages.
type Console struct {
	cfg      Config
	logins   *prometheus.CounterVec
	attempts *addrLimiter
	log      *slog.Logger
	sess     *sessions
	pages    map[string]*template.Template
	css      []byte
}

// Register mounts the console on s under /console/.
func Register(s *api.Server, cfg Config) error {
	c, err := New(cfg)
	if err != nil {
		return err
	}
	for pattern, h := range c.Routes() {
		if err := s.HandleLimited(pattern, h, false, c.limits(pattern)); err != nil {
			return err
		}
	}
	return nil
}

// New builds the console.
func New(cfg Config) (*Console, error) {
	if cfg.Auth == nil || cfg.Facts == nil || cfg.Consumers == nil || cfg.DLQ == nil {
		return nil, errors.New("console: auth, facts, consumers and DLQ are required")
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.LoginsPerMinute <= 0 {
		cfg.LoginsPerMinute = DefaultLoginsPerMinute
	}
	if cfg.LoginBurst <= 0 {
		cfg.LoginBurst = DefaultLoginBurst
	}
	if cfg.HealthWindow <= 0 {
		cfg.HealthWindow = domain.DefaultHealthPolicy().Window
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	logins, err := promreg.Register(cfg.Registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mailplane_console_logins_total",
		Help: "Console login attempts, by result: ok, invalid (not a token, unknown token), forbidden (no ops scope), refused (cross-site or without the form's CSRF token), limited (too many from the client address), unaudited (refused: the operator audit could not record it).",
	}, []string{"result"}))
	if err != nil {
		return nil, err
	}
	for _, r := range []string{"ok", "invalid", "forbidden", "refused", "limited", "unaudited"} {
		logins.WithLabelValues(r)
	}
	c := &Console{cfg: cfg, logins: logins, log: cfg.Logger, sess: newSessions(cfg.SessionTTL, cfg.Now), pages: map[string]*template.Template{},
		attempts: newAddrLimiter(cfg.LoginsPerMinute, cfg.LoginBurst, maxLoginAddrs, cfg.Now)}
	css, err := fs.ReadFile(files, "static/console.css")
	if err != nil {
		return nil, err
	}
	c.css = css
	for _, p := range []string{"login", "fleet", "mailbox", "org", "consumers", "dlq", "dlqentry", "audit", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/"+p+".html")
		if err != nil {
			return nil, err
		}
		c.pages[p] = t
	}
	return c, nil
}

// Routes returns the console's handlers by ServeMux pattern.
func (c *Console) Routes() map[string]http.Handler {
	return map[string]http.Handler{
		"GET /console":                                   c.headers(http.HandlerFunc(redirectHome)),
		"GET /console/{$}":                               c.page(c.fleet),
		"GET /console/login":                             c.headers(http.HandlerFunc(c.loginForm)),
		"POST /console/login":                            c.headers(http.HandlerFunc(c.login)),
		"POST /console/logout":                           c.headers(http.HandlerFunc(c.logout)),
		"GET /console/mailboxes":                         c.page(c.mailboxSearch),
		"GET /console/mailboxes/{id}":                    c.page(c.mailbox),
		"GET /console/orgs/{id}":                         c.page(c.org),
		"GET /console/consumers":                         c.page(c.consumers),
		"GET /console/dlq":                               c.page(c.dlqList),
		"GET /console/dlq/{partition}/{offset}":          c.page(c.dlqEntry),
		"GET /console/audit":                             c.page(c.auditPage),
		"POST /console/dlq/{partition}/{offset}/redrive": c.headers(http.HandlerFunc(c.redrive)),
		"GET /console/static/console.css":                c.headers(http.HandlerFunc(c.stylesheet)),
	}
}

func redirectHome(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

// csp allows nothing but the console's own stylesheet, images and forms:
// no script runs, whatever a page shows.
const csp = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// headers sets the security headers of every console answer.
func (c *Console) headers(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", csp)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

func (c *Console) stylesheet(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(c.css)
}

// view is what every page template gets.
type view struct {
	Title  string
	Caller string
	CSRF   string
	Search string
	Data   any
	Now    time.Time
}

type pageFunc func(w http.ResponseWriter, r *http.Request, v *view) (string, int, error)

// page serves a page behind the session check: no live session, or a
// token no longer valid or without ops, is sent to the login form.
func (c *Console) page(fn pageFunc) http.Handler {
	return c.headers(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ss, ok := c.authenticate(r)
		if !ok {
			http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
		defer cancel()
		v := &view{Caller: ss.caller, CSRF: ss.csrf, Now: c.cfg.Now().UTC()}
		name, status, err := fn(w, r.WithContext(ctx), v)
		if err != nil {
			c.fail(w, v, err)
			return
		}
		if name == "" {
			return // fn answered (a redirect)
		}
		c.render(w, name, status, v)
	}))
}

// authenticate returns the request's session when it is live and its
// token still authenticates as an ops caller.
func (c *Console) authenticate(r *http.Request) (*session, bool) {
	ss, _, ok := c.authenticateCaller(r)
	return ss, ok
}

// authenticateCaller is authenticate, with the caller the token is now.
func (c *Console) authenticateCaller(r *http.Request) (*session, *domain.Caller, bool) {
	ss := c.sess.get(cookieValue(r, cookieSession))
	if ss == nil {
		return nil, nil, false
	}
	caller, ok := c.cfg.Auth.Authenticate(ss.token)
	if !ok || !caller.Has(domain.ScopeOps) {
		c.sess.drop(cookieValue(r, cookieSession))
		return nil, nil, false
	}
	return ss, caller, true
}

// fail renders an error page with the status of the error's code; a
// foreign error's text never reaches the page.
func (c *Console) fail(w http.ResponseWriter, v *view, err error) {
	var de *domain.Error
	msg, status := "the read model is unavailable right now; retry", http.StatusServiceUnavailable
	if errors.As(err, &de) && de.Code != domain.CodeInternal {
		msg, status = de.Message, api.StatusOf(de.Code)
	} else {
		c.log.Warn("console page failed", "err", err)
	}
	v.Title, v.Data = "Error", msg
	c.render(w, "error", status, v)
}

func (c *Console) render(w http.ResponseWriter, name string, status int, v *view) {
	t := c.pages[name]
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := t.Execute(w, v); err != nil {
		c.log.Warn("console template failed", "page", name, "err", err)
	}
}
