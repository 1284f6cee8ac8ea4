package dovecottest_test

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"

	"github.com/mailplane/mailplane/internal/dovecottest"
)

const msg = "From: Ann <ann@example.org>\r\nTo: bob@example.org\r\nSubject: hello\r\nMessage-ID: <m1@example.org>\r\nDate: Mon, 02 Jan 2006 15:04:05 +0000\r\n\r\nbody\r\n"

func TestServer(t *testing.T) {
	t.Parallel()
	srv := dovecottest.Start(t)
	srv.AddUser(t, "alice", "pw1")
	uid := srv.Deliver(t, "alice", "Junk", []byte(msg))
	if uid != 1 {
		t.Fatalf("uid %d", uid)
	}
	c, err := imapclient.DialTLS(srv.IMAPSAddr(), &imapclient.Options{TLSConfig: &tls.Config{RootCAs: srv.Cert.Pool}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Login("alice", "pw1").Wait(); err != nil {
		t.Fatal(err)
	}
	if !c.Caps().Has(imap.CapCondStore) || !c.Caps().Has(imap.CapSpecialUse) {
		t.Errorf("caps %v", c.Caps())
	}
	ls, err := c.List("", "*", &imap.ListOptions{ReturnSpecialUse: true}).Collect()
	if err != nil {
		t.Fatal(err)
	}
	var junk bool
	for _, l := range ls {
		for _, a := range l.Attrs {
			if l.Mailbox == "Junk" && a == imap.MailboxAttrJunk {
				junk = true
			}
		}
	}
	if !junk {
		t.Errorf("no \\Junk in %+v", ls)
	}
	sel, err := c.Select("Junk", nil).Wait()
	if err != nil || sel.NumMessages != 1 {
		t.Fatalf("select %+v %v", sel, err)
	}
	srv.SetFlags(t, "alice", "Junk", 1, `\Seen`, `$Warm`)
	srv.SetUIDValidity(t, "alice", "Sent", 4242)
	if v := srv.Status(t, "alice", "Sent")["uidvalidity"]; v != 4242 {
		t.Errorf("uidvalidity %d", v)
	}
	if n := srv.Connections(t, "alice"); n != 1 {
		t.Errorf("connections %d", n)
	}
	srv.Kick(t, "alice")
	select {
	case <-c.Closed():
	case <-time.After(5 * time.Second):
		t.Fatal("not kicked")
	}
	// STARTTLS listener.
	c2, err := imapclient.DialStartTLS(srv.IMAPAddr(), &imapclient.Options{TLSConfig: &tls.Config{RootCAs: srv.Cert.Pool}})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	err = c2.Login("alice", "wrong").Wait()
	if err == nil || !strings.Contains(err.Error(), "AUTHENTICATIONFAILED") {
		t.Errorf("wrong password: %v", err)
	}
}
