package devfleet_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"

	"github.com/mailplane/mailplane/internal/devfleet"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startServer starts a dev IMAP server on a free loopback port, stopped at
// cleanup.
func startServer(t *testing.T, opts ...devfleet.ServerOption) *devfleet.Server {
	t.Helper()
	opts = append([]devfleet.ServerOption{devfleet.WithAddr("127.0.0.1:0"), devfleet.WithServerLogger(quietLog())}, opts...)
	srv, err := devfleet.Start(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return srv
}

// login connects over plain IMAP and logs in.
func login(t *testing.T, addr, user, pass string) *imapclient.Client {
	t.Helper()
	c, err := imapclient.DialInsecure(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Login(user, pass).Wait(); err != nil {
		t.Fatalf("login %s: %v", user, err)
	}
	return c
}

func TestServerLoginListSpecialUse(t *testing.T) {
	t.Parallel()
	srv := startServer(t, devfleet.WithUIDValidityBase(5000))

	if got := srv.Users(); len(got) != 6 || !slices.Contains(got, "ada@example.com") || !slices.Contains(got, "spammy@example.com") {
		t.Fatalf("users %v", got)
	}

	// A wrong password is refused.
	c, err := imapclient.DialInsecure(srv.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Login("ada@example.com", "wrong").Wait(); err == nil {
		t.Fatal("login with a wrong password succeeded")
	}
	c.Close()

	c = login(t, srv.Addr(), "ada@example.com", devfleet.DevPassword)
	caps, err := c.Capability().Wait()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []imap.Cap{imap.CapSpecialUse, imap.CapIdle, imap.CapUIDPlus} {
		if !caps.Has(want) {
			t.Errorf("capability %s missing from %v", want, caps)
		}
	}

	list, err := c.List("", "*", &imap.ListOptions{ReturnSpecialUse: true}).Collect()
	if err != nil {
		t.Fatal(err)
	}
	attrs := map[string][]imap.MailboxAttr{}
	for _, l := range list {
		attrs[l.Mailbox] = l.Attrs
	}
	if len(attrs) != 3 || !slices.Contains(attrs["Junk"], imap.MailboxAttrJunk) ||
		!slices.Contains(attrs["Sent"], imap.MailboxAttrSent) || len(attrs["INBOX"]) != 0 {
		t.Fatalf("LIST RETURN (SPECIAL-USE): %v", attrs)
	}
	// Without RETURN (SPECIAL-USE) no special-use attribute is shown; with
	// SPECIAL-USE selection only Junk and Sent are listed.
	plain, err := c.List("", "*", nil).Collect()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range plain {
		if slices.Contains(l.Attrs, imap.MailboxAttrJunk) {
			t.Fatalf("plain LIST shows \\Junk: %+v", l)
		}
	}
	sel, err := c.List("", "*", &imap.ListOptions{SelectSpecialUse: true}).Collect()
	if err != nil {
		t.Fatal(err)
	}
	if len(sel) != 2 {
		t.Fatalf("LIST (SPECIAL-USE): %d folders", len(sel))
	}

	// Pre-filled: three in INBOX, one in Junk, one in Sent; UIDVALIDITY
	// offset by the base.
	for folder, n := range map[string]uint32{"INBOX": 3, "Junk": 1, "Sent": 1} {
		d, err := c.Select(folder, &imap.SelectOptions{ReadOnly: true}).Wait()
		if err != nil {
			t.Fatal(err)
		}
		if d.NumMessages != n || d.UIDValidity <= 5000 || d.UIDValidity > 5010 {
			t.Errorf("%s: %d messages, uidvalidity %d", folder, d.NumMessages, d.UIDValidity)
		}
		st, err := c.Status(folder, &imap.StatusOptions{UIDValidity: true}).Wait()
		if err != nil {
			t.Fatal(err)
		}
		if st.UIDValidity != d.UIDValidity {
			t.Errorf("%s: STATUS uidvalidity %d, SELECT %d", folder, st.UIDValidity, d.UIDValidity)
		}
	}
}

func TestServerDeliverAppends(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	msg := "From: Grace <grace@example.com>\r\nTo: ada@example.com\r\nSubject: delivered\r\n" +
		"Date: Mon, 02 Mar 2026 09:00:00 +0000\r\nMessage-ID: <d-1@example.com>\r\n\r\nhello\r\n"
	if err := srv.Deliver("ada@example.com", devfleet.FolderJunk, []byte(msg)); err != nil {
		t.Fatal(err)
	}
	if err := srv.Deliver("nobody@example.com", devfleet.FolderInbox, []byte(msg)); err == nil {
		t.Fatal("delivery to an unknown user succeeded")
	}
	if err := srv.Deliver("ada@example.com", "NoSuchFolder", []byte(msg)); err == nil {
		t.Fatal("delivery to an unknown folder succeeded")
	}

	c := login(t, srv.Addr(), "ada@example.com", devfleet.DevPassword)
	d, err := c.Select(devfleet.FolderJunk, nil).Wait()
	if err != nil {
		t.Fatal(err)
	}
	if d.NumMessages != 2 {
		t.Fatalf("Junk holds %d messages, want 2", d.NumMessages)
	}
	var last imap.SeqSet
	last.AddNum(2)
	msgs, err := c.Fetch(last, &imap.FetchOptions{Envelope: true, InternalDate: true, UID: true}).Collect()
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || msgs[0].Envelope.Subject != "delivered" || msgs[0].Envelope.MessageID != "d-1@example.com" ||
		!msgs[0].InternalDate.Equal(time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)) {
		t.Fatalf("fetched %+v", msgs)
	}
}

func TestServerRefusesNonLoopback(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:1143", "nonsense"} {
		if srv, err := devfleet.Start(context.Background(), devfleet.WithAddr(addr), devfleet.WithServerLogger(quietLog())); err == nil {
			srv.Stop(context.Background())
			t.Errorf("Start(%q) succeeded", addr)
		} else if addr != "nonsense" && !strings.Contains(err.Error(), "loopback") {
			t.Errorf("Start(%q): %v", addr, err)
		}
	}
}

func TestServerStopClosesConnections(t *testing.T) {
	t.Parallel()
	srv, err := devfleet.Start(context.Background(), devfleet.WithAddr("127.0.0.1:0"), devfleet.WithServerLogger(quietLog()))
	if err != nil {
		t.Fatal(err)
	}
	c := login(t, srv.Addr(), "grace@example.com", devfleet.DevPassword)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(ctx); err != nil { // idempotent
		t.Fatal(err)
	}
	if err := c.Noop().Wait(); err == nil {
		t.Fatal("connection still answers after Stop")
	}
}
