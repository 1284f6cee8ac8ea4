package imapsync

import (
	"context"
	"strings"

	"github.com/emersion/go-imap/v2"

	"github.com/mailplane/mailplane/domain"
)

// Folder roles, as stored in imap_messages.role and imap_folder_cursors.role.
const (
	RoleInbox = "inbox"
	RoleJunk  = "junk"
	RoleSent  = "sent"
)

// JunkNames and SentNames are the names tried, in order, for servers that
// do not mark their special-use folders with LIST attributes (RFC 6154).
// Matching is case-insensitive, on the whole name or on the name under
// INBOX (INBOX.Junk, INBOX/Spam).
var (
	JunkNames = []string{"Junk", "Spam", "Junk E-mail", "Junk Email", "[Gmail]/Spam", "Bulk Mail"}
	SentNames = []string{"Sent", "Sent Items", "Sent Messages", "Sent Mail", "[Gmail]/Sent Mail"}
)

type folder struct {
	name string
	role string
}

// MaxFolderName is the longest folder name (in bytes) the runner selects
// and stores.
const MaxFolderName = 1000

// SpecialUse picks the Junk and Sent folders from a LIST answer: by the
// \Junk and \Sent attributes first, then by JunkNames and SentNames.
// Folders that cannot be selected are ignored, and so are names that are
// not clean text (domain.IsCleanText: no control, line-separator or bidi
// character; Postgres cannot store a NUL) or longer than MaxFolderName.
// An empty name: none found.
//
// A folder name is the server's text: it is stored with the folder's rows
// but never put in a log line or a sync.audit record, which name the
// folder by its role (inbox, junk, sent).
func SpecialUse(list []*imap.ListData) (junk, sent string) {
	selectable := make([]*imap.ListData, 0, len(list))
	for _, l := range list {
		if hasAttr(l.Attrs, imap.MailboxAttrNoSelect) || hasAttr(l.Attrs, imap.MailboxAttrNonExistent) ||
			len(l.Mailbox) > MaxFolderName || !domain.IsCleanText(l.Mailbox) {
			continue
		}
		selectable = append(selectable, l)
	}
	for _, l := range selectable {
		if junk == "" && hasAttr(l.Attrs, imap.MailboxAttrJunk) {
			junk = l.Mailbox
		}
		if sent == "" && hasAttr(l.Attrs, imap.MailboxAttrSent) {
			sent = l.Mailbox
		}
	}
	byName := func(names []string) string {
		for _, want := range names {
			for _, l := range selectable {
				if nameIs(l, want) {
					return l.Mailbox
				}
			}
		}
		return ""
	}
	if junk == "" {
		junk = byName(JunkNames)
	}
	if sent == "" {
		sent = byName(SentNames)
	}
	return junk, sent
}

func nameIs(l *imap.ListData, want string) bool {
	if strings.EqualFold(l.Mailbox, want) {
		return true
	}
	if l.Delim != 0 {
		prefix := "INBOX" + string(l.Delim)
		if len(l.Mailbox) > len(prefix) && strings.EqualFold(l.Mailbox[:len(prefix)], prefix) &&
			strings.EqualFold(l.Mailbox[len(prefix):], want) {
			return true
		}
	}
	return false
}

func hasAttr(attrs []imap.MailboxAttr, a imap.MailboxAttr) bool {
	for _, x := range attrs {
		if strings.EqualFold(string(x), string(a)) {
			return true
		}
	}
	return false
}

// discover lists the folders to sync: INBOX, then Junk and Sent if found.
func (m *mailboxRun) discover(ctx context.Context, c *conn) ([]folder, error) {
	var opts *imap.ListOptions
	if c.has(imap.CapSpecialUse) || c.has(imap.CapIMAP4rev2) {
		opts = &imap.ListOptions{ReturnSpecialUse: true}
	}
	c.arm()
	list, err := c.c.List("", "*", opts).Collect()
	if err != nil {
		return nil, c.fail("list", err, ctx)
	}
	out := []folder{{name: "INBOX", role: RoleInbox}}
	junk, sent := SpecialUse(list)
	if junk != "" && !strings.EqualFold(junk, "INBOX") {
		out = append(out, folder{name: junk, role: RoleJunk})
	}
	if sent != "" && !strings.EqualFold(sent, "INBOX") && sent != junk {
		out = append(out, folder{name: sent, role: RoleSent})
	}
	return out, nil
}
