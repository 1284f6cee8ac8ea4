package devfleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/mail"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapserver"
	"github.com/emersion/go-imap/v2/imapserver/imapmemserver"
)

// Folders every sample user has. Junk and Sent are advertised with the
// \Junk and \Sent special-use attributes.
const (
	FolderInbox = "INBOX"
	FolderJunk  = "Junk"
	FolderSent  = "Sent"
)

var specialUse = map[string]imap.MailboxAttr{FolderJunk: imap.MailboxAttrJunk, FolderSent: imap.MailboxAttrSent}

// Server is an in-process IMAP server (go-imap's imapmemserver) holding the
// sample mailboxes, each with INBOX, Junk and Sent pre-filled with a few
// messages. Mail lives in memory: a restart starts over.
//
// Two things are added to imapmemserver. LIST is answered by the wrapper
// so that Junk and Sent carry their special-use attributes (imapmemserver
// ignores special use). And every UIDVALIDITY the server reports is offset
// by a per-start base (default: the start time in Unix seconds), so a
// restarted server, whose folders restart at UID 1, never presents a sync
// client the UIDVALIDITY of the previous run's folders with other mail
// under the same UIDs.
//
// The owner starts it with Start and stops it with Stop.
type Server struct {
	log     *slog.Logger
	uidBase uint32
	mem     *imapmemserver.Server
	srv     *imapserver.Server
	ln      net.Listener
	done    chan struct{}
	stop    sync.Once

	mu      sync.Mutex
	users   map[string]*imapmemserver.User
	folders map[string][]string // user -> folder names, for LIST
}

// ServerOption configures a Server.
type ServerOption func(*serverConfig)

type serverConfig struct {
	addr    string
	log     *slog.Logger
	uidBase uint32
	now     func() time.Time
}

// WithAddr sets the listen address (default DefaultAddr). It must be a
// loopback address; port 0 picks a free port (see Addr).
func WithAddr(addr string) ServerOption { return func(c *serverConfig) { c.addr = addr } }

// WithServerLogger sets the logger (default slog.Default()).
func WithServerLogger(l *slog.Logger) ServerOption { return func(c *serverConfig) { c.log = l } }

// WithUIDValidityBase sets the offset added to every UIDVALIDITY (default:
// the start time in Unix seconds).
func WithUIDValidityBase(base uint32) ServerOption {
	return func(c *serverConfig) { c.uidBase = base }
}

// WithServerClock sets the clock that dates the pre-filled mail (default
// time.Now).
func WithServerClock(now func() time.Time) ServerOption { return func(c *serverConfig) { c.now = now } }

// Start creates the sample users and their mail and starts listening. ctx
// bounds the start only; the server runs until Stop.
func Start(ctx context.Context, opts ...ServerOption) (*Server, error) {
	cfg := serverConfig{addr: DefaultAddr, log: slog.Default(), now: time.Now}
	for _, o := range opts {
		o(&cfg)
	}
	if err := checkLoopback(cfg.addr); err != nil {
		return nil, err
	}
	if cfg.uidBase == 0 {
		cfg.uidBase = uint32(cfg.now().Unix())
	}
	s := &Server{
		log: cfg.log, uidBase: cfg.uidBase, mem: imapmemserver.New(), done: make(chan struct{}),
		users: map[string]*imapmemserver.User{}, folders: map[string][]string{},
	}
	now := cfg.now()
	for _, m := range Mailboxes() {
		if err := s.addUser(m.Address, DevPassword); err != nil {
			return nil, err
		}
		for _, p := range prefill(m, now) {
			if err := s.Deliver(m.Address, p.folder, p.msg); err != nil {
				return nil, err
			}
		}
	}
	s.srv = imapserver.New(&imapserver.Options{
		NewSession: func(*imapserver.Conn) (imapserver.Session, *imapserver.GreetingData, error) {
			return &session{Session: s.mem.NewSession(), s: s}, nil, nil
		},
		// IDLE, UNSELECT and ENABLE come with IMAP4rev1. No MOVE: its
		// COPYUID would carry imapmemserver's own UIDVALIDITY.
		Caps: imap.CapSet{imap.CapIMAP4rev1: {}, imap.CapSpecialUse: {}, imap.CapListExtended: {},
			imap.CapUIDPlus: {}, imap.CapNamespace: {}},
		// Plain IMAP on loopback: LOGIN without TLS is the point.
		InsecureAuth: true,
		Logger:       slogPrintf{cfg.log},
	})
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.addr)
	if err != nil {
		return nil, err
	}
	s.ln = ln
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, net.ErrClosed) {
			s.log.Debug("dev IMAP server stopped serving", "err", err)
		}
	}()
	s.log.Debug("dev IMAP server listening", "addr", s.Addr(), "users", len(s.users))
	return s, nil
}

// checkLoopback refuses addresses other than loopback ones: the server
// speaks plain IMAP and its passwords are public.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("dev IMAP address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("dev IMAP address %q: must be a loopback address (the server speaks plain IMAP with a public password)", addr)
}

// Addr returns the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Stop closes the listener and every connection and waits, at most until
// ctx is done, for the server to finish. It may be called more than once.
func (s *Server) Stop(ctx context.Context) error {
	s.stop.Do(func() {
		if err := s.srv.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			s.log.Debug("closing the dev IMAP server", "err", err)
		}
		// Serve may not have registered the listener yet.
		_ = s.ln.Close()
	})
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Users returns the IMAP user names (the sample addresses), sorted.
func (s *Server) Users() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.users))
	for u := range s.users {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

// Deliver appends msg to folder of user, as a mail server delivering it
// would. The message's internal date is its Date header, else now.
func (s *Server) Deliver(user, folder string, msg []byte) error {
	s.mu.Lock()
	u := s.users[user]
	s.mu.Unlock()
	if u == nil {
		return fmt.Errorf("dev IMAP server: no user %q", user)
	}
	when := time.Now()
	if pm, err := mail.ReadMessage(bytes.NewReader(msg)); err == nil {
		if d, err := pm.Header.Date(); err == nil {
			when = d
		}
	}
	if _, err := u.Append(folder, literal{bytes.NewReader(msg), int64(len(msg))}, &imap.AppendOptions{Time: when}); err != nil {
		return fmt.Errorf("dev IMAP server: deliver to %s/%s: %w", user, folder, err)
	}
	return nil
}

func (s *Server) addUser(name, pass string) error {
	u := imapmemserver.NewUser(name, pass)
	folders := []string{FolderInbox, FolderJunk, FolderSent}
	for _, f := range folders {
		if err := u.Create(f, nil); err != nil {
			return err
		}
		if err := u.Subscribe(f); err != nil {
			return err
		}
	}
	s.mem.AddUser(u)
	s.mu.Lock()
	s.users[name] = u
	s.folders[name] = folders
	s.mu.Unlock()
	return nil
}

// uidValidity is what the server reports for imapmemserver's v.
func (s *Server) uidValidity(v uint32) uint32 {
	if v == 0 {
		return 0
	}
	if r := s.uidBase + v; r != 0 {
		return r
	}
	return 1
}

type literal struct {
	*bytes.Reader
	n int64
}

func (l literal) Size() int64 { return l.n }

// slogPrintf adapts slog to go-imap's Logger.
type slogPrintf struct{ log *slog.Logger }

func (l slogPrintf) Printf(format string, args ...any) {
	l.log.Warn("dev IMAP server: " + fmt.Sprintf(format, args...))
}

// session wraps an imapmemserver session: LIST answered with special-use
// attributes, UIDVALIDITY offset, folder names tracked.
type session struct {
	imapserver.Session
	s    *Server
	user string
}

func (ss *session) Login(user, pass string) error {
	if err := ss.Session.Login(user, pass); err != nil {
		return err
	}
	ss.user = user
	return nil
}

// List answers from the user's folder names, with the special-use
// attributes of Junk and Sent. Every folder is subscribed.
func (ss *session) List(w *imapserver.ListWriter, ref string, patterns []string, opts *imap.ListOptions) error {
	if opts == nil {
		opts = &imap.ListOptions{}
	}
	if len(patterns) == 0 {
		return w.WriteList(&imap.ListData{Attrs: []imap.MailboxAttr{imap.MailboxAttrNoSelect}, Delim: '/'})
	}
	ss.s.mu.Lock()
	names := slices.Clone(ss.s.folders[ss.user])
	ss.s.mu.Unlock()
	slices.Sort(names)
	for _, name := range names {
		match := false
		for _, p := range patterns {
			match = match || imapserver.MatchList(name, '/', ref, p)
		}
		if !match {
			continue
		}
		attr, special := specialUse[name]
		if opts.SelectSpecialUse && !special {
			continue
		}
		d := imap.ListData{Mailbox: name, Delim: '/'}
		if opts.SelectSubscribed || opts.ReturnSubscribed {
			d.Attrs = append(d.Attrs, imap.MailboxAttrSubscribed)
		}
		if special && (opts.ReturnSpecialUse || opts.SelectSpecialUse) {
			d.Attrs = append(d.Attrs, attr)
		}
		if opts.ReturnStatus != nil {
			st, err := ss.Status(name, opts.ReturnStatus)
			if err != nil {
				return err
			}
			d.Status = st
		}
		if err := w.WriteList(&d); err != nil {
			return err
		}
	}
	return nil
}

func (ss *session) Select(name string, opts *imap.SelectOptions) (*imap.SelectData, error) {
	d, err := ss.Session.Select(name, opts)
	if d != nil {
		d.UIDValidity = ss.s.uidValidity(d.UIDValidity)
	}
	return d, err
}

func (ss *session) Status(name string, opts *imap.StatusOptions) (*imap.StatusData, error) {
	d, err := ss.Session.Status(name, opts)
	if d != nil {
		d.UIDValidity = ss.s.uidValidity(d.UIDValidity)
	}
	return d, err
}

func (ss *session) Append(name string, r imap.LiteralReader, opts *imap.AppendOptions) (*imap.AppendData, error) {
	d, err := ss.Session.Append(name, r, opts)
	if d != nil {
		d.UIDValidity = ss.s.uidValidity(d.UIDValidity)
	}
	return d, err
}

func (ss *session) Copy(numSet imap.NumSet, dest string) (*imap.CopyData, error) {
	d, err := ss.Session.Copy(numSet, dest)
	if d != nil {
		d.UIDValidity = ss.s.uidValidity(d.UIDValidity)
	}
	return d, err
}

func (ss *session) Create(name string, opts *imap.CreateOptions) error {
	if err := ss.Session.Create(name, opts); err != nil {
		return err
	}
	name = strings.TrimRight(name, "/")
	ss.s.mu.Lock()
	if !slices.Contains(ss.s.folders[ss.user], name) {
		ss.s.folders[ss.user] = append(ss.s.folders[ss.user], name)
	}
	ss.s.mu.Unlock()
	return nil
}

func (ss *session) Delete(name string) error {
	if err := ss.Session.Delete(name); err != nil {
		return err
	}
	ss.s.mu.Lock()
	ss.s.folders[ss.user] = slices.DeleteFunc(ss.s.folders[ss.user], func(f string) bool { return f == name })
	ss.s.mu.Unlock()
	return nil
}

func (ss *session) Rename(name, newName string, opts *imap.RenameOptions) error {
	if err := ss.Session.Rename(name, newName, opts); err != nil {
		return err
	}
	newName = strings.TrimRight(newName, "/")
	ss.s.mu.Lock()
	fs := slices.DeleteFunc(ss.s.folders[ss.user], func(f string) bool { return f == name })
	ss.s.folders[ss.user] = append(fs, newName)
	ss.s.mu.Unlock()
	return nil
}

// Namespace passes through (the server advertises NAMESPACE).
func (ss *session) Namespace() (*imap.NamespaceData, error) {
	return ss.Session.(imapserver.SessionNamespace).Namespace()
}

// prefilled is one message a sample mailbox starts with.
type prefilled struct {
	folder string
	msg    []byte
}

// prefill returns the mail m starts with: three messages in INBOX, one in
// Junk and one in Sent, dated within the last few hours of now.
func prefill(m Mailbox, now time.Time) []prefilled {
	boxes := Mailboxes()
	var peer Mailbox
	for i, b := range boxes {
		if b.Address == m.Address {
			peer = boxes[(i+1)%len(boxes)]
		}
	}
	local, _, _ := strings.Cut(m.Address, "@")
	id := func(n string) string { return "<prefill-" + n + "." + local + "@devfleet.mailplane.invalid>" }
	to := fmt.Sprintf("%s <%s>", m.Name, m.Address)
	return []prefilled{
		{FolderInbox, message(fmt.Sprintf("%s <%s>", peer.Name, peer.Address), to, "Welcome to the dev fleet",
			id("inbox-1"), now.Add(-3*time.Hour), "", "This mailbox lives in mailplane dev's in-process IMAP server.\r\n")},
		{FolderInbox, message("Mailplane <noreply@mailplane.invalid>", to, "Your mailbox is registered",
			id("inbox-2"), now.Add(-2*time.Hour), "", "mailplane syncs INBOX, Junk and Sent of this mailbox.\r\n")},
		{FolderInbox, message(fmt.Sprintf("%s <%s>", peer.Name, peer.Address), to, "Lunch on Thursday?",
			id("inbox-3"), now.Add(-40*time.Minute), "", "Shall we meet at noon?\r\n")},
		{FolderJunk, message("Prize Desk <winner@prizes.invalid>", to, "You have WON!!!",
			id("junk-1"), now.Add(-5*time.Hour), "", "Claim your prize now.\r\n")},
		{FolderSent, message(to, fmt.Sprintf("%s <%s>", peer.Name, peer.Address), "Re: Welcome to the dev fleet",
			id("sent-1"), now.Add(-150*time.Minute), "", "Thanks!\r\n")},
	}
}

// message builds an RFC 5322 message with CRLF line ends; extra is
// additional header lines, each ending in CRLF.
func message(from, to, subject, messageID string, date time.Time, extra, body string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "From: %s\r\nTo: %s\r\nSubject: %s\r\nDate: %s\r\nMessage-ID: %s\r\n",
		from, to, subject, date.Format(time.RFC1123Z), messageID)
	b.WriteString(extra)
	b.WriteString("MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n")
	b.WriteString(body)
	return []byte(b.String())
}
