package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// A browser cannot send a bearer header, so the console trades an ops
// token for a session: an opaque random cookie naming a session held in
// this process's memory (never the token itself). Each request
// authenticates the session's token again, so a token removed from the
// tokens file, or stripped of ops, ends its sessions at once. Sessions
// are per process: behind several api replicas, pin the console to one
// (docs/runbook.md).
const (
	cookieSession = "mailplane_console"
	// cookieLoginCSRF carries the login form's CSRF token before there is
	// a session (double submit).
	cookieLoginCSRF = "mailplane_console_login"
	// DefaultSessionTTL is how long a session lasts from its login.
	DefaultSessionTTL = 8 * time.Hour
	// maxSessions bounds the memory sessions take; the oldest is dropped
	// past it.
	maxSessions = 10_000
	// maxTokenLen matches the API's bound on bearer tokens.
	maxTokenLen = 512
	// maxFormBytes bounds a console form post.
	maxFormBytes = 4 << 10
)

type session struct {
	token   string
	caller  string
	csrf    string
	created time.Time
	expires time.Time
}

// sessions holds the live sessions by the SHA-256 of their cookie, so a
// map lookup never compares the secret itself.
type sessions struct {
	mu  sync.Mutex
	m   map[[sha256.Size]byte]*session
	ttl time.Duration
	now func() time.Time
}

func newSessions(ttl time.Duration, now func() time.Time) *sessions {
	return &sessions{m: map[[sha256.Size]byte]*session{}, ttl: ttl, now: now}
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b)
}

// create starts a session and returns its cookie value.
func (s *sessions) create(token, caller string) (string, *session) {
	id := randomToken()
	now := s.now()
	ss := &session{token: token, caller: caller, csrf: randomToken(), created: now, expires: now.Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(now)
	if len(s.m) >= maxSessions {
		var oldest [sha256.Size]byte
		first := true
		for k, v := range s.m {
			if first || v.created.Before(s.m[oldest].created) {
				oldest, first = k, false
			}
		}
		delete(s.m, oldest)
	}
	s.m[sha256.Sum256([]byte(id))] = ss
	return id, ss
}

// sweep drops expired sessions; the caller holds mu.
func (s *sessions) sweep(now time.Time) {
	for k, v := range s.m {
		if !now.Before(v.expires) {
			delete(s.m, k)
		}
	}
}

// get returns the live session of a cookie value.
func (s *sessions) get(id string) *session {
	if id == "" || len(id) > 64 {
		return nil
	}
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.m[k]
	if ss == nil {
		return nil
	}
	if !s.now().Before(ss.expires) {
		delete(s.m, k)
		return nil
	}
	return ss
}

func (s *sessions) drop(id string) {
	s.mu.Lock()
	delete(s.m, sha256.Sum256([]byte(id)))
	s.mu.Unlock()
}

// secure says whether the request reached us over TLS (directly, or
// through a proxy that says so): the cookies are then Secure.
func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge time.Duration) {
	c := &http.Cookie{
		Name: name, Value: value, Path: "/console/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure(r),
	}
	if maxAge > 0 {
		c.MaxAge = int(maxAge.Seconds())
	} else {
		c.MaxAge = -1
	}
	http.SetCookie(w, c)
}

func cookieValue(r *http.Request, name string) string {
	c, err := r.Cookie(name)
	if err != nil {
		return ""
	}
	return c.Value
}

// sameOrigin refuses a cross-site form post. SameSite=Strict keeps the
// session cookie off cross-site requests already; this also covers the
// login form (no session yet) and browsers that ignore SameSite. Fetch
// metadata when the browser sends it, else Origin, else Referer; a post
// carrying none of them is refused.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		return site == "same-origin"
	}
	src := r.Header.Get("Origin")
	if src == "" {
		src = r.Header.Get("Referer")
	}
	if src == "" || src == "null" {
		return false
	}
	u, err := url.Parse(src)
	return err == nil && u.Host != "" && u.Host == r.Host
}

func equalSecret(a, b string) bool {
	return a != "" && len(a) == len(b) && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// checkToken refuses a pasted token that cannot be one before it is
// authenticated.
func checkToken(tok string) bool {
	return tok != "" && len(tok) <= maxTokenLen && domain.IsCleanText(tok) && !strings.ContainsAny(tok, " \t")
}
