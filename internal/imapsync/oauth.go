package imapsync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/emersion/go-imap/v2"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailsync"
)

// OAuth mailboxes (gmail, outlook) carry a refresh token in their sealed
// credentials. The runner exchanges it at the provider's token endpoint for
// an access token, kept in the run's memory until shortly before it
// expires, and logs in with AUTHENTICATE XOAUTH2 (the mechanism Gmail and
// Outlook accept over IMAP).

// OAuthClient is one provider's OAuth client registration.
type OAuthClient struct {
	// TokenURL is the provider's token endpoint.
	TokenURL     string
	ClientID     string
	ClientSecret string
}

// Token endpoints of the providers.
const (
	GoogleTokenURL    = "https://oauth2.googleapis.com/token"
	MicrosoftTokenURL = "https://login.microsoftonline.com/common/oauth2/v2.0/token"
)

// accessToken is an access token and when to stop using it.
type accessToken struct {
	token []byte
	until time.Time
	// rotated is a new refresh token the endpoint returned (nil: none).
	rotated []byte
}

func (a *accessToken) wipe() {
	if a != nil {
		clear(a.token)
		clear(a.rotated)
	}
}

// tokenResponse is the token endpoint's answer (RFC 6749 section 5).
type tokenResponse struct {
	AccessToken string `json:"access_token"`
	// RefreshToken is set when the provider rotates the refresh token on
	// use (Microsoft does): the old one stops working soon.
	RefreshToken     string `json:"refresh_token"`
	ExpiresIn        int64  `json:"expires_in"`
	Error            string `json:"error"`
	ErrorDescription string `json:"error_description"`
}

// oauthToken returns an access token for the run's mailbox: the cached one,
// else a fresh one exchanged for the refresh token.
func (m *mailboxRun) oauthToken(ctx context.Context, refresh string) ([]byte, error) {
	now := m.r.cfg.Now()
	m.mu.Lock()
	cached := m.access
	m.mu.Unlock()
	if cached != nil && now.Before(cached.until) {
		return cached.token, nil
	}
	provider := m.job.Mailbox.Provider
	client, ok := m.r.cfg.OAuth[provider]
	if !ok || client.TokenURL == "" || client.ClientID == "" {
		return nil, &Error{Kind: KindCredentials, Op: "oauth", Reason: fmt.Sprintf("no OAuth client configured for provider %s", provider)}
	}
	tok, err := m.r.exchange(ctx, client, refresh)
	if err != nil {
		return nil, err
	}
	if len(tok.rotated) > 0 && string(tok.rotated) != refresh {
		// The old refresh token is spent: seal the new one, use it from
		// now on, and record it for the next owner.
		err := m.rotated(ctx, tok.rotated)
		clear(tok.rotated)
		tok.rotated = nil
		if err != nil {
			tok.wipe()
			return nil, err
		}
	}
	m.mu.Lock()
	m.access.wipe()
	m.access = tok
	m.mu.Unlock()
	return tok.token, nil
}

// forgetToken drops the cached access token (the server refused it).
func (m *mailboxRun) forgetToken() {
	m.mu.Lock()
	m.access.wipe()
	m.access = nil
	m.mu.Unlock()
}

// exchange trades a refresh token for an access token. A refusal of the
// grant (revoked, expired) is KindAuth: the user must reconnect the
// mailbox, and it counts towards disabling it.
func (r *Runner) exchange(ctx context.Context, c OAuthClient, refresh string) (*accessToken, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refresh}, "client_id": {c.ClientID}}
	if c.ClientSecret != "" {
		form.Set("client_secret", c.ClientSecret)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.TokenURL, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, &Error{Kind: KindCredentials, Op: "oauth", Reason: "bad token endpoint", Err: err}
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	resp, err := r.http.Do(req)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.Canceled) {
			return nil, &Error{Kind: KindTimeout, Op: "oauth", Reason: "token endpoint timed out"}
		}
		// The error names the URL and the transport's failure, never the
		// form.
		return nil, &Error{Kind: KindNetwork, Op: "oauth", Reason: "token endpoint unreachable", Err: errors.Unwrap(err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return nil, &Error{Kind: KindNetwork, Op: "oauth", Reason: "token endpoint answer cut short"}
	}
	var tr tokenResponse
	_ = json.Unmarshal(body, &tr)
	clear(body)
	defer func() { tr.AccessToken, tr.RefreshToken = "", "" }()
	switch {
	case resp.StatusCode == http.StatusOK && tr.AccessToken != "":
		life := time.Duration(tr.ExpiresIn) * time.Second
		if life <= 0 {
			life = time.Hour
		}
		// Renewed a minute early, so a token never expires mid-login.
		at := &accessToken{token: []byte(tr.AccessToken), until: r.cfg.Now().Add(life - min(time.Minute, life/2))}
		if tr.RefreshToken != "" {
			at.rotated = []byte(tr.RefreshToken)
		}
		return at, nil
	case tr.Error == "invalid_grant" || tr.Error == "unauthorized_client" || tr.Error == "invalid_client":
		return nil, &Error{Kind: KindAuth, Op: "oauth", Code: tr.Error, Reason: "the token endpoint refused the grant"}
	default:
		return nil, &Error{Kind: KindProtocol, Op: "oauth", Code: knownCode(tr.Error),
			Reason: fmt.Sprintf("token endpoint answered %d", resp.StatusCode)}
	}
}

// xoauth2 is the XOAUTH2 SASL client: one initial response; on failure the
// server sends a JSON challenge, answered empty, then NO.
type xoauth2 struct {
	user  string
	token []byte
}

func (x *xoauth2) Start() (string, []byte, error) {
	ir := make([]byte, 0, len(x.user)+len(x.token)+20)
	ir = append(ir, "user="...)
	ir = append(ir, x.user...)
	ir = append(ir, "\x01auth=Bearer "...)
	ir = append(ir, x.token...)
	ir = append(ir, "\x01\x01"...)
	return "XOAUTH2", ir, nil
}

func (x *xoauth2) Next([]byte) ([]byte, error) { return []byte{}, nil }

// loginOAuth authenticates with an access token; a refusal drops the
// token, so the next attempt exchanges the refresh token again.
func (m *mailboxRun) loginOAuth(ctx context.Context, c *conn, refresh string) error {
	if m.job.Mailbox.Provider != domain.ProviderGmail && m.job.Mailbox.Provider != domain.ProviderOutlook {
		return &Error{Kind: KindCredentials, Op: "login", Reason: "an OAuth refresh token on a provider without OAuth"}
	}
	if !c.has(imap.Cap("AUTH=XOAUTH2")) {
		return &Error{Kind: KindProtocol, Op: "login", Reason: "server does not offer AUTH=XOAUTH2"}
	}
	tok, err := m.oauthToken(ctx, refresh)
	if err != nil {
		return err
	}
	c.arm()
	// The SASL client holds a copy, wiped once the command is done.
	cp := append([]byte(nil), tok...)
	defer clear(cp)
	err = c.c.Authenticate(&xoauth2{user: m.job.Mailbox.IMAP.Username, token: cp})
	if err != nil {
		var ie *imap.Error
		if errors.As(err, &ie) {
			m.forgetToken()
			return &Error{Kind: KindAuth, Op: "authenticate", Code: knownCode(string(ie.Code)), Reason: "the server refused the access token", Err: err}
		}
		return c.fail("authenticate", err, ctx)
	}
	return nil
}

// ensureToken makes sure an OAuth mailbox holds a usable access token; it
// does nothing for a mailbox with a password.
func (m *mailboxRun) ensureToken(ctx context.Context) error {
	if !m.job.Mailbox.Provider.IsOAuth() {
		return nil
	}
	if err := m.recordPending(ctx); errors.Is(err, mailsync.ErrFenced) {
		return err
	}
	sec, err := m.unseal()
	if err != nil {
		return err
	}
	defer sec.wipe()
	if sec.refresh == nil {
		return nil // an app password: LOGIN
	}
	_, err = m.oauthToken(ctx, string(sec.refresh))
	return err
}
