package rehearsal_test

import (
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapserver"
)

// fleetUser and fleetPass are mailbox i's IMAP credentials.
func fleetUser(i int) string { return fmt.Sprintf("u%06d", i) }
func fleetPass(i int) string { return fmt.Sprintf("pw-%06d", i) }

// lightServer is an IMAP server for a fleet of n users that holds no
// per-user state but counters: every user has an empty INBOX, Junk and
// Sent, so a login costs a session and nothing else. It counts logins per
// user (how many times each mailbox connected) and in total.
type lightServer struct {
	ln       net.Listener
	srv      *imapserver.Server
	logins   []atomic.Int32 // by user index
	total    atomic.Int64
	sessions atomic.Int64 // open now
	// peakSessions is the most sessions open at once.
	peakSessions atomic.Int64
	idling       atomic.Int64
	refused      atomic.Int64 // logins with a wrong user or password
}

func startLightServer(t testing.TB, n int) *lightServer {
	t.Helper()
	s := &lightServer{logins: make([]atomic.Int32, n)}
	s.srv = imapserver.New(&imapserver.Options{
		NewSession: func(*imapserver.Conn) (imapserver.Session, *imapserver.GreetingData, error) {
			open := s.sessions.Add(1)
			for peak := s.peakSessions.Load(); open > peak && !s.peakSessions.CompareAndSwap(peak, open); peak = s.peakSessions.Load() {
			}
			return &lightSession{s: s, user: -1}, nil, nil
		},
		Caps:         imap.CapSet{imap.CapIMAP4rev1: {}, imap.CapSpecialUse: {}},
		Logger:       log.New(io.Discard, "", 0),
		InsecureAuth: true, // loopback, TLS none: the rehearsal measures the fleet, not TLS
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.ln = ln
	go func() { _ = s.srv.Serve(ln) }()
	t.Cleanup(func() { _ = s.srv.Close() })
	return s
}

// loginsOf copies the per-user login counts.
func (s *lightServer) loginsOf() []int32 {
	out := make([]int32, len(s.logins))
	for i := range s.logins {
		out[i] = s.logins[i].Load()
	}
	return out
}

type lightSession struct {
	s    *lightServer
	user int
}

var errNo = &imap.Error{Type: imap.StatusResponseTypeNo, Text: "not in this server"}

func (l *lightSession) Close() error {
	l.s.sessions.Add(-1)
	return nil
}

func (l *lightSession) Login(user, pass string) error {
	i, err := strconv.Atoi(strings.TrimPrefix(user, "u"))
	if err != nil || i < 0 || i >= len(l.s.logins) || user != fleetUser(i) || pass != fleetPass(i) {
		l.s.refused.Add(1)
		return imapserver.ErrAuthFailed
	}
	l.user = i
	l.s.logins[i].Add(1)
	l.s.total.Add(1)
	return nil
}

func (l *lightSession) Select(mailbox string, _ *imap.SelectOptions) (*imap.SelectData, error) {
	if !folderKnown(mailbox) {
		return nil, errNo
	}
	return &imap.SelectData{Flags: []imap.Flag{imap.FlagSeen}, PermanentFlags: []imap.Flag{imap.FlagSeen},
		NumMessages: 0, UIDNext: 1, UIDValidity: 1}, nil
}

func folderKnown(name string) bool {
	return strings.EqualFold(name, "INBOX") || name == "Junk" || name == "Sent"
}

func (l *lightSession) List(w *imapserver.ListWriter, _ string, patterns []string, _ *imap.ListOptions) error {
	if len(patterns) == 0 {
		return w.WriteList(&imap.ListData{Attrs: []imap.MailboxAttr{imap.MailboxAttrNoSelect}, Delim: '/'})
	}
	for _, f := range []struct {
		name string
		attr imap.MailboxAttr
	}{{"INBOX", ""}, {"Junk", imap.MailboxAttrJunk}, {"Sent", imap.MailboxAttrSent}} {
		d := &imap.ListData{Mailbox: f.name, Delim: '/'}
		if f.attr != "" {
			d.Attrs = []imap.MailboxAttr{f.attr}
		}
		if err := w.WriteList(d); err != nil {
			return err
		}
	}
	return nil
}

func (l *lightSession) Status(mailbox string, _ *imap.StatusOptions) (*imap.StatusData, error) {
	if !folderKnown(mailbox) {
		return nil, errNo
	}
	zero, next, validity := uint32(0), imap.UID(1), uint32(1)
	return &imap.StatusData{Mailbox: mailbox, NumMessages: &zero, UIDNext: next, UIDValidity: validity}, nil
}

func (l *lightSession) Idle(_ *imapserver.UpdateWriter, stop <-chan struct{}) error {
	l.s.idling.Add(1)
	defer l.s.idling.Add(-1)
	<-stop
	return nil
}

func (l *lightSession) Poll(*imapserver.UpdateWriter, bool) error { return nil }
func (l *lightSession) Unselect() error                           { return nil }
func (l *lightSession) Create(string, *imap.CreateOptions) error  { return errNo }
func (l *lightSession) Delete(string) error                       { return errNo }
func (l *lightSession) Rename(string, string, *imap.RenameOptions) error {
	return errNo
}
func (l *lightSession) Subscribe(string) error   { return nil }
func (l *lightSession) Unsubscribe(string) error { return nil }
func (l *lightSession) Append(string, imap.LiteralReader, *imap.AppendOptions) (*imap.AppendData, error) {
	return nil, errNo
}
func (l *lightSession) Expunge(*imapserver.ExpungeWriter, *imap.UIDSet) error { return nil }
func (l *lightSession) Search(imapserver.NumKind, *imap.SearchCriteria, *imap.SearchOptions) (*imap.SearchData, error) {
	return &imap.SearchData{}, nil
}
func (l *lightSession) Fetch(*imapserver.FetchWriter, imap.NumSet, *imap.FetchOptions) error {
	return nil
}
func (l *lightSession) Store(*imapserver.FetchWriter, imap.NumSet, *imap.StoreFlags, *imap.StoreOptions) error {
	return nil
}
func (l *lightSession) Copy(imap.NumSet, string) (*imap.CopyData, error) { return nil, errNo }
