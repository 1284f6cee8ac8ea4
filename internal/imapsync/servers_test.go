package imapsync_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/mail"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"
	"github.com/emersion/go-imap/v2/imapserver"
	"github.com/emersion/go-imap/v2/imapserver/imapmemserver"
	"github.com/emersion/go-sasl"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dovecottest"
)

// testServer is an IMAP server the runner suite runs against. Folder
// names are the server's: junk() and sent() say where that server keeps
// them.
type testServer interface {
	// addr is where the server listens; tls how to talk to it there.
	addr() string
	tls() domain.TLSMode
	pool() *x509.CertPool
	junk() string
	sent() string
	condstore() bool
	addUser(t *testing.T, user, pass string)
	deliver(t *testing.T, user, folder string, msg []byte)
	setFlags(t *testing.T, user, folder string, uid uint32, flags ...string)
	// newUIDValidity makes folder's UIDVALIDITY change (its messages are
	// kept, under new UIDs) and returns the new value.
	newUIDValidity(t *testing.T, user, folder string) uint32
	// hangUp closes user's connections from the server side (p carries
	// them, for servers that cannot).
	hangUp(t *testing.T, user string, p *proxy)
	// expunge removes the message with uid from folder.
	expunge(t *testing.T, user, folder string, uid uint32)
}

func readMsg(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ---- Dovecot ----

type dovecotServer struct{ s *dovecottest.Server }

func newDovecot(t *testing.T) testServer { return &dovecotServer{s: dovecottest.Start(t)} }

func (d *dovecotServer) addr() string         { return d.s.IMAPSAddr() }
func (d *dovecotServer) tls() domain.TLSMode  { return domain.TLSImplicit }
func (d *dovecotServer) pool() *x509.CertPool { return d.s.Cert.Pool }
func (d *dovecotServer) junk() string         { return "Junk" }
func (d *dovecotServer) sent() string         { return "Sent" }
func (d *dovecotServer) condstore() bool      { return true }
func (d *dovecotServer) addUser(t *testing.T, user, pass string) {
	d.s.AddUser(t, user, pass)
}
func (d *dovecotServer) deliver(t *testing.T, user, folder string, msg []byte) {
	d.s.Deliver(t, user, folder, msg)
}
func (d *dovecotServer) setFlags(t *testing.T, user, folder string, uid uint32, flags ...string) {
	d.s.SetFlags(t, user, folder, uid, flags...)
}
func (d *dovecotServer) newUIDValidity(t *testing.T, user, folder string) uint32 {
	v := d.s.Status(t, user, folder)["uidvalidity"] + 1000
	d.s.SetUIDValidity(t, user, folder, v)
	return v
}
func (d *dovecotServer) hangUp(t *testing.T, user string, _ *proxy) { d.s.Kick(t, user) }
func (d *dovecotServer) expunge(t *testing.T, user, folder string, uid uint32) {
	d.s.Doveadm(t, "expunge", "-u", user, "mailbox", folder, "uid", strconv.FormatUint(uint64(uid), 10))
}

// ---- go-imap's imapmemserver ----

// memServer runs imapmemserver in process, with STARTTLS, behind a session
// wrapper that answers LIST itself so that the special-use attributes
// (which imapmemserver ignores on CREATE) are advertised: its Junk folder
// is named "Quarantine", a name no fallback knows, so finding it proves
// the runner reads \Junk.
type memServer struct {
	srv  *imapserver.Server
	ln   net.Listener
	cert *dovecottest.Cert

	mu      sync.Mutex
	users   map[string]*imapmemserver.User
	pass    map[string]string
	folders map[string][]string // user -> folder names
	tokens  map[string]string   // valid XOAUTH2 access token -> user
	mem     *imapmemserver.Server
}

var memSpecialUse = map[string]imap.MailboxAttr{"Quarantine": imap.MailboxAttrJunk, "Sent": imap.MailboxAttrSent}

func newMem(t *testing.T) testServer {
	cert, err := dovecottest.NewCert()
	if err != nil {
		t.Fatal(err)
	}
	m := &memServer{cert: cert, users: map[string]*imapmemserver.User{}, pass: map[string]string{},
		folders: map[string][]string{}, tokens: map[string]string{}, mem: imapmemserver.New()}
	m.srv = imapserver.New(&imapserver.Options{
		NewSession: func(*imapserver.Conn) (imapserver.Session, *imapserver.GreetingData, error) {
			return &specialUseSession{Session: m.mem.NewSession(), m: m}, nil, nil
		},
		Caps: imap.CapSet{imap.CapIMAP4rev1: {}, imap.CapSpecialUse: {}, imap.CapListExtended: {},
			imap.CapUIDPlus: {}, imap.CapMove: {}, imap.CapNamespace: {}},
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert.TLS}},
		Logger:    log.New(io.Discard, "", 0),
	})
	m.ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = m.srv.Serve(m.ln) }()
	t.Cleanup(func() { _ = m.srv.Close() })
	return m
}

type specialUseSession struct {
	imapserver.Session
	m    *memServer
	user string
}

// AuthenticateMechanisms offers XOAUTH2 (tokens from memServer.tokens)
// besides PLAIN.
func (s *specialUseSession) AuthenticateMechanisms() []string { return []string{"PLAIN", "XOAUTH2"} }

func (s *specialUseSession) Authenticate(mech string) (sasl.Server, error) {
	switch mech {
	case "PLAIN":
		return sasl.NewPlainServer(func(_, user, pass string) error { return s.Login(user, pass) }), nil
	case "XOAUTH2":
		return xoauth2Server(func(user, token string) error {
			s.m.mu.Lock()
			ok := s.m.tokens[token] == user
			pass := s.m.pass[user]
			s.m.mu.Unlock()
			if !ok {
				return &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCodeAuthenticationFailed, Text: "invalid OAuth token"}
			}
			return s.Login(user, pass)
		}), nil
	}
	return nil, &imap.Error{Type: imap.StatusResponseTypeNo, Text: "unsupported mechanism"}
}

// xoauth2Server checks "user=U\x01auth=Bearer T\x01\x01".
type xoauth2Server func(user, token string) error

func (f xoauth2Server) Next(resp []byte) ([]byte, bool, error) {
	parts := strings.Split(strings.TrimSuffix(string(resp), "\x01\x01"), "\x01")
	if len(parts) != 2 || !strings.HasPrefix(parts[0], "user=") || !strings.HasPrefix(parts[1], "auth=Bearer ") {
		return nil, false, errors.New("malformed XOAUTH2 response")
	}
	return nil, true, f(strings.TrimPrefix(parts[0], "user="), strings.TrimPrefix(parts[1], "auth=Bearer "))
}

func (s *specialUseSession) Login(user, pass string) error {
	if err := s.Session.Login(user, pass); err != nil {
		return err
	}
	s.user = user
	return nil
}

// List answers from the fixture's folder list, with special-use
// attributes.
func (s *specialUseSession) List(w *imapserver.ListWriter, ref string, patterns []string, opts *imap.ListOptions) error {
	s.m.mu.Lock()
	names := slices.Clone(s.m.folders[s.user])
	s.m.mu.Unlock()
	slices.Sort(names)
	if len(patterns) == 0 {
		return w.WriteList(&imap.ListData{Attrs: []imap.MailboxAttr{imap.MailboxAttrNoSelect}, Delim: '/'})
	}
	for _, name := range names {
		match := false
		for _, p := range patterns {
			match = match || imapserver.MatchList(name, '/', ref, p)
		}
		if !match {
			continue
		}
		d := imap.ListData{Mailbox: name, Delim: '/'}
		attr, special := memSpecialUse[name]
		if opts.SelectSpecialUse && !special {
			continue
		}
		if special && (opts.ReturnSpecialUse || opts.SelectSpecialUse) {
			d.Attrs = append(d.Attrs, attr)
		}
		if err := w.WriteList(&d); err != nil {
			return err
		}
	}
	return nil
}

func (m *memServer) addr() string         { return m.ln.Addr().String() }
func (m *memServer) tls() domain.TLSMode  { return domain.TLSStartTLS }
func (m *memServer) pool() *x509.CertPool { return m.cert.Pool }
func (m *memServer) junk() string         { return "Quarantine" }
func (m *memServer) sent() string         { return "Sent" }
func (m *memServer) condstore() bool      { return false }

func (m *memServer) addUser(t *testing.T, user, pass string) {
	u := imapmemserver.NewUser(user, pass)
	for _, f := range []string{"INBOX", "Quarantine", "Sent", "Archive"} {
		if err := u.Create(f, nil); err != nil {
			t.Fatal(err)
		}
	}
	m.mem.AddUser(u)
	m.mu.Lock()
	m.users[user], m.pass[user] = u, pass
	m.folders[user] = []string{"INBOX", "Quarantine", "Sent", "Archive"}
	m.mu.Unlock()
}

func (m *memServer) user(t *testing.T, name string) *imapmemserver.User {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.users[name]
	if u == nil {
		t.Fatalf("no user %s", name)
	}
	return u
}

type literal struct {
	*bytes.Reader
	n int64
}

func (l literal) Size() int64 { return l.n }

func (m *memServer) deliver(t *testing.T, user, folder string, msg []byte) {
	t.Helper()
	when := time.Now()
	if pm, err := mail.ReadMessage(bytes.NewReader(msg)); err == nil {
		if d, err := pm.Header.Date(); err == nil {
			when = d
		}
	}
	if _, err := m.user(t, user).Append(folder, literal{bytes.NewReader(msg), int64(len(msg))}, &imap.AppendOptions{Time: when}); err != nil {
		t.Fatalf("deliver to %s: %v", folder, err)
	}
}

// client logs in as user directly (not through any proxy).
func (m *memServer) client(t *testing.T, user string) *imapclient.Client {
	t.Helper()
	c, err := imapclient.DialStartTLS(m.addr(), &imapclient.Options{TLSConfig: &tls.Config{RootCAs: m.cert.Pool, ServerName: "127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	pass := m.pass[user]
	m.mu.Unlock()
	if err := c.Login(user, pass).Wait(); err != nil {
		t.Fatal(err)
	}
	return c
}

func (m *memServer) setFlags(t *testing.T, user, folder string, uid uint32, flags ...string) {
	t.Helper()
	c := m.client(t, user)
	defer c.Close()
	if _, err := c.Select(folder, nil).Wait(); err != nil {
		t.Fatal(err)
	}
	fl := make([]imap.Flag, len(flags))
	for i, f := range flags {
		fl[i] = imap.Flag(f)
	}
	var set imap.UIDSet
	set.AddNum(imap.UID(uid))
	if err := c.Store(set, &imap.StoreFlags{Op: imap.StoreFlagsSet, Silent: true, Flags: fl}, nil).Close(); err != nil {
		t.Fatal(err)
	}
}

// newUIDValidity re-creates the folder (imapmemserver gives a re-created
// folder a new UIDVALIDITY) with its messages.
func (m *memServer) newUIDValidity(t *testing.T, user, folder string) uint32 {
	t.Helper()
	c := m.client(t, user)
	defer c.Close()
	if _, err := c.Select(folder, nil).Wait(); err != nil {
		t.Fatal(err)
	}
	var all imap.SeqSet
	all.AddRange(1, 0)
	msgs, err := c.Fetch(all, &imap.FetchOptions{InternalDate: true, BodySection: []*imap.FetchItemBodySection{{Peek: true}}}).Collect()
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) == 0 {
		t.Fatalf("%s is empty", folder)
	}
	u := m.user(t, user)
	if err := u.Delete(folder); err != nil {
		t.Fatal(err)
	}
	if err := u.Create(folder, nil); err != nil {
		t.Fatal(err)
	}
	for _, msg := range msgs {
		body := msg.BodySection[0].Bytes
		if _, err := u.Append(folder, literal{bytes.NewReader(body), int64(len(body))}, &imap.AppendOptions{Time: msg.InternalDate}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := u.Status(folder, &imap.StatusOptions{UIDValidity: true})
	if err != nil {
		t.Fatal(err)
	}
	return st.UIDValidity
}

func (m *memServer) hangUp(t *testing.T, _ string, p *proxy) { p.CloseAll() }

func (m *memServer) expunge(t *testing.T, user, folder string, uid uint32) {
	t.Helper()
	c := m.client(t, user)
	defer c.Close()
	if _, err := c.Select(folder, nil).Wait(); err != nil {
		t.Fatal(err)
	}
	var set imap.UIDSet
	set.AddNum(imap.UID(uid))
	if err := c.Store(set, &imap.StoreFlags{Op: imap.StoreFlagsAdd, Silent: true, Flags: []imap.Flag{imap.FlagDeleted}}, nil).Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.UIDExpunge(set).Close(); err != nil {
		t.Fatal(err)
	}
}

func (m *memServer) String() string { return fmt.Sprintf("imapmemserver at %s", m.addr()) }

// servers are the two the suite runs against.
var servers = []struct {
	name  string
	start func(t *testing.T) testServer
}{
	{"memserver", newMem},
	{"dovecot", newDovecot},
}

func folderIs(got, want string) bool { return strings.EqualFold(got, want) }

// Namespace and Move pass through (the server advertises both).
func (s *specialUseSession) Namespace() (*imap.NamespaceData, error) {
	return s.Session.(imapserver.SessionNamespace).Namespace()
}

func (s *specialUseSession) Move(w *imapserver.MoveWriter, numSet imap.NumSet, dest string) error {
	return s.Session.(imapserver.SessionMove).Move(w, numSet, dest)
}
