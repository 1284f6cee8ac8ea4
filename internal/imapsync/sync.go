package imapsync

import (
	"context"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"
)

// message is one message's metadata as stored.
type message struct {
	uid          uint32
	internalDate time.Time
	messageID    string
	from         string
	subject      string
	size         int64
	flags        string // sorted, space-separated
	modseq       uint64
	warmup       *warmupTag // a recognised warmup header (inbox and junk only)
}

// cursor is a folder's sync position.
type cursor struct {
	folder      string
	role        string
	uidValidity uint32
	lastUID     uint32
	modseq      uint64
	// stored is how many rows the folder has under uidValidity (kept in
	// memory, loaded with the cursor); a server holding another count
	// had messages expunged (or moved away).
	stored int
}

// flagUpdate is a changed flag set.
type flagUpdate struct {
	uid    uint32
	flags  string
	modseq uint64
}

// folderState is a folder's state as a SELECT or STATUS reports it.
type folderState struct {
	uidValidity uint32
	uidNext     imap.UID
	messages    uint32
	modseq      uint64 // CONDSTORE servers only
}

// unchangedBy reports whether st (a STATUS answer) shows the folder as it
// was: no message added, removed or (with CONDSTORE) changed. A server
// that leaves an item out shows a change.
func (s folderState) unchangedBy(st *imap.StatusData, condstore bool) bool {
	return st.UIDValidity == s.uidValidity && st.UIDNext != 0 && st.UIDNext == s.uidNext &&
		st.NumMessages != nil && *st.NumMessages == s.messages && (!condstore || st.HighestModSeq == s.modseq)
}

// checkSpecial brings the special-use folders up to date on a hot
// connection between IDLE rounds: a STATUS of each (allowed on a folder
// other than the selected one, and never sent during IDLE), and a SELECT and
// sync only of those that changed since their last sync, or of all when
// full. selected reports whether it selected any (INBOX is no longer
// selected then).
func (m *mailboxRun) checkSpecial(ctx context.Context, c *conn, folders []folder, full bool) (selected bool, err error) {
	condstore := c.has(imap.CapCondStore)
	for _, f := range folders {
		if was, ok := m.seen[f.name]; ok && !full {
			c.arm()
			st, err := c.c.Status(f.name, &imap.StatusOptions{NumMessages: true, UIDNext: true, UIDValidity: true, HighestModSeq: condstore}).Wait()
			if err != nil {
				return selected, c.fail("status "+f.role, err, ctx)
			}
			if was.unchangedBy(st, condstore) {
				m.r.metrics.specialChecks.WithLabelValues("unchanged").Inc()
				continue
			}
		}
		selected = true
		if err := m.syncHeld(ctx, c, f); err != nil {
			return selected, err
		}
		m.r.metrics.specialChecks.WithLabelValues("synced").Inc()
	}
	return selected, nil
}

// syncFolder selects f (read-only), checks UIDVALIDITY, fetches messages
// above the cursor and flag changes, and writes them with the cursor.
func (m *mailboxRun) syncFolder(ctx context.Context, c *conn, f folder) error {
	condstore := c.has(imap.CapCondStore)
	c.arm()
	sel, err := c.c.Select(f.name, &imap.SelectOptions{ReadOnly: true, CondStore: condstore}).Wait()
	if err != nil {
		return c.fail("select "+f.role, err, ctx)
	}
	// Forgotten until this sync completes: a STATUS compared with it must
	// not pass over what a failed sync left unstored.
	delete(m.seen, f.name)
	cur, known := m.cursor(f.name)
	if known && cur.uidValidity != sel.UIDValidity {
		m.log.Info("uidvalidity changed: folder resynced", "role", f.role, "from", cur.uidValidity, "to", sel.UIDValidity)
		cur = cursor{folder: f.name, role: f.role, uidValidity: sel.UIDValidity}
		c.hold()
		if err := m.resetFolder(ctx, cur); err != nil {
			return err
		}
	} else if !known {
		cur = cursor{folder: f.name, role: f.role, uidValidity: sel.UIDValidity}
	}
	cur.role = f.role
	prevLast := cur.lastUID

	// New messages, in batches, each written with the cursor it reaches.
	if sel.NumMessages > 0 && (sel.UIDNext == 0 || uint32(sel.UIDNext) > cur.lastUID+1) {
		if err := m.fetchNew(ctx, c, f, &cur); err != nil {
			return err
		}
	}

	// Flag changes of messages already stored.
	var updates []flagUpdate
	switch {
	case condstore && sel.HighestModSeq > 0:
		if prevLast > 0 && cur.modseq > 0 && sel.HighestModSeq > cur.modseq {
			updates, err = m.fetchFlags(ctx, c, f, uidRange(1, prevLast), &imap.FetchOptions{UID: true, Flags: true, ModSeq: true, ChangedSince: cur.modseq}, prevLast, cur.stored+m.r.cfg.FetchBatch)
			if err != nil {
				return err
			}
		}
		cur.modseq = sel.HighestModSeq
	case prevLast > 0 && sel.NumMessages > 0:
		from := uint32(1)
		if w := uint32(m.r.cfg.FlagWindow); sel.NumMessages > w {
			from = sel.NumMessages - w + 1
		}
		var ss imap.SeqSet
		ss.AddRange(from, sel.NumMessages)
		updates, err = m.fetchFlags(ctx, c, f, ss, &imap.FetchOptions{UID: true, Flags: true}, prevLast, cur.stored+m.r.cfg.FetchBatch)
		if err != nil {
			return err
		}
		cur.modseq = 0
	}
	c.hold()
	if err := m.writeFlags(ctx, cur, updates); err != nil {
		return err
	}
	if cur.stored != int(sel.NumMessages) {
		if err := m.reconcile(ctx, c, f, cur); err != nil {
			return err
		}
	}
	if m.seen == nil {
		m.seen = map[string]folderState{}
	}
	m.seen[f.name] = folderState{uidValidity: sel.UIDValidity, uidNext: sel.UIDNext, messages: sel.NumMessages, modseq: sel.HighestModSeq}
	return nil
}

// reconcile deletes the rows of messages no longer in the folder (expunged,
// or moved away), found by a UID SEARCH ALL. It runs only when the folder's
// message count differs from the rows stored.
//
// The answer lists every message of the folder, about 8 bytes each (a
// million messages: 7 MB), more than one response's byte budget: its
// window is sized to the rows stored, which the server cannot raise
// without our storing them first, never to the count the server claims.
func (m *mailboxRun) reconcile(ctx context.Context, c *conn, f folder, cur cursor) error {
	c.raw.armWindow(c.cmdTO, searchBytesPerUID*int64(cur.stored+m.r.cfg.FetchBatch))
	data, err := c.c.UIDSearch(&imap.SearchCriteria{}, nil).Wait()
	if err != nil {
		return c.fail("search "+f.role, err, ctx)
	}
	set, ok := data.All.(imap.UIDSet)
	if data.All != nil && !ok {
		// Not an answer in UIDs: never delete on it.
		return &Error{Kind: KindProtocol, Op: "search " + f.role, Reason: "UID SEARCH answered without UIDs"}
	}
	uids, reason := presentUIDs(set, cur.lastUID, cur.stored+m.r.cfg.FetchBatch)
	if reason != "" {
		return &Error{Kind: KindProtocol, Op: "search " + f.role, Reason: reason}
	}
	c.hold()
	return m.deleteMissing(ctx, cur, uids)
}

// presentUIDs lists the UIDs of set at or below lastUID, refusing a set
// that names more than most of them, or "*". The set is the server's: a
// range of a few bytes (an ESEARCH "1:4294967295") names billions of
// UIDs, and a "*" (a "0" in a SEARCH answer) made go-imap's expansion
// panic (SearchData.AllUIDs), so it is walked range by range, never
// expanded whole. A folder holds no more UIDs at or below the cursor than
// the rows stored (UIDs only grow): most is that count, with slack.
func presentUIDs(set imap.UIDSet, lastUID uint32, most int) ([]int64, string) {
	uids := []int64{} // empty, not nil: an empty array, not NULL, to deleteMissing
	for _, r := range set {
		if r.Start == 0 || r.Stop == 0 {
			return nil, "UID SEARCH answered with a dynamic UID set"
		}
		lo, hi := min(r.Start, r.Stop), min(max(r.Start, r.Stop), imap.UID(lastUID))
		if lo > hi {
			continue
		}
		if int64(len(uids))+int64(hi-lo)+1 > int64(most) {
			return nil, "UID SEARCH answered with more UIDs than the folder holds"
		}
		for u := int64(lo); u <= int64(hi); u++ {
			uids = append(uids, u)
		}
	}
	return uids, ""
}

// searchBytesPerUID is the most a UID takes in a SEARCH answer: ten digits
// and a space.
const searchBytesPerUID = 11

func uidRange(from, to uint32) imap.UIDSet {
	var s imap.UIDSet
	s.AddRange(imap.UID(from), imap.UID(to))
	return s
}

// fetchNew fetches the messages above the cursor and writes them in
// batches. Each message is read item by item as it arrives (readMessage),
// never collected whole: its warmup header section is requested with a
// size bound and parsed from the stream, and whatever else a server sends
// is bounded by the connection's byte budget (deadlineConn).
func (m *mailboxRun) fetchNew(ctx context.Context, c *conn, f folder, cur *cursor) error {
	opts := &imap.FetchOptions{UID: true, Flags: true, InternalDate: true, RFC822Size: true, Envelope: true,
		ModSeq: c.has(imap.CapCondStore)}
	var warmup *imap.FetchItemBodySection
	if f.role == RoleInbox || f.role == RoleJunk {
		// Only the one header, without setting \Seen, and only its first
		// warmupMax bytes.
		warmup = &imap.FetchItemBodySection{Specifier: imap.PartSpecifierHeader, HeaderFields: []string{m.r.cfg.WarmupHeader}, Peek: true,
			Partial: &imap.SectionPartial{Offset: 0, Size: warmupMax}}
		opts.BodySection = []*imap.FetchItemBodySection{warmup}
	}
	var set imap.UIDSet
	set.AddRange(imap.UID(cur.lastUID+1), 0) // lastUID+1:*
	c.arm()
	cmd := c.c.Fetch(set, opts)
	batch := make([]message, 0, m.r.cfg.FetchBatch)
	// Sync lag is measured on incremental syncs only: a first sync stores
	// old mail, which says nothing about how far behind sync is.
	incremental := cur.lastUID > 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		// While the batch is written, go-imap reads ahead (up to 128
		// messages) in the same byte window; the window is not widened
		// for it (that would widen what a hostile server can make us
		// hold): a legitimate run of huge envelopes cut there fails after
		// the batch is stored, and the next attempt goes on from it.
		c.hold()
		err := m.writeMessages(ctx, cur, batch)
		if err == nil && incremental {
			now := m.r.cfg.Now()
			lag := m.r.metrics.lag.WithLabelValues(string(m.currentTier()))
			for _, b := range batch {
				lag.Observe(max(0, now.Sub(b.internalDate).Seconds()))
			}
		}
		batch = batch[:0]
		c.arm()
		return err
	}
	for {
		md := cmd.Next()
		if md == nil {
			break
		}
		msg := m.readMessage(md, warmup)
		c.arm() // the next message's deadline and byte window
		// n:* always returns the last message, even below n.
		if msg.uid <= cur.lastUID {
			continue
		}
		batch = append(batch, msg)
		cur.lastUID = max(cur.lastUID, msg.uid)
		if len(batch) >= m.r.cfg.FetchBatch {
			if err := flush(); err != nil {
				_ = cmd.Close()
				return err
			}
		}
	}
	// A connection that broke mid-message (a byte budget, a deadline)
	// fails here, before the batch holding that message is written.
	if err := cmd.Close(); err != nil {
		return c.fail("fetch "+f.role, err, ctx)
	}
	return flush()
}

// readMessage reads one FETCH response item by item. Envelope strings are
// cleaned and bounded; a body section is read only when it is the warmup
// section asked for (at most warmupMax bytes of it), and every other
// literal is discarded as it streams by (FetchMessageData.Next).
func (m *mailboxRun) readMessage(md *imapclient.FetchMessageData, warmup *imap.FetchItemBodySection) message {
	var msg message
	parsed := false
	for {
		item := md.Next()
		if item == nil {
			break
		}
		switch it := item.(type) {
		case imapclient.FetchItemDataUID:
			msg.uid = uint32(it.UID)
		case imapclient.FetchItemDataFlags:
			msg.flags = flagString(it.Flags)
		case imapclient.FetchItemDataInternalDate:
			msg.internalDate = it.Time
		case imapclient.FetchItemDataRFC822Size:
			msg.size = it.Size
		case imapclient.FetchItemDataModSeq:
			msg.modseq = it.ModSeq
		case imapclient.FetchItemDataEnvelope:
			setEnvelope(&msg, it.Envelope)
		case imapclient.FetchItemDataBodySection:
			if warmup == nil || parsed || it.Literal == nil || !isWarmupSection(it, warmup) {
				continue
			}
			parsed = true
			tag, outcome := parseWarmup(it.Literal, m.r.cfg.WarmupHeader, m.r.cfg.WarmupKey)
			if outcome != "" && tag == nil {
				m.r.metrics.warmupRejected.WithLabelValues(outcome).Inc()
			}
			msg.warmup = tag
		}
	}
	if msg.internalDate.IsZero() {
		msg.internalDate = time.Unix(0, 0).UTC()
	}
	return msg
}

// isWarmupSection reports whether a fetched body section answers the
// warmup section asked for, with or without the partial's origin echoed
// (RFC 9051 asks servers to echo it; not all do).
func isWarmupSection(it imapclient.FetchItemDataBodySection, warmup *imap.FetchItemBodySection) bool {
	whole := *warmup
	whole.Partial = nil
	return it.MatchCommand(warmup) || it.MatchCommand(&whole)
}

// fetchFlags returns the flags of the fetched messages at or below upTo,
// at most most of them: each FETCH response opens a byte window of its
// own, so without a count a server answering "* 1 FETCH (UID 1 FLAGS ())"
// for ever would grow the list up to the operation's byte budget (a
// gigabyte of answers, more of memory). A folder has no more messages to
// update than rows stored; most is that count, with slack.
func (m *mailboxRun) fetchFlags(ctx context.Context, c *conn, f folder, set imap.NumSet, opts *imap.FetchOptions, upTo uint32, most int) ([]flagUpdate, error) {
	c.arm()
	cmd := c.c.Fetch(set, opts)
	var out []flagUpdate
	for {
		md := cmd.Next()
		if md == nil {
			break
		}
		msg := m.readMessage(md, nil)
		c.arm()
		if msg.uid == 0 || msg.uid > upTo {
			continue
		}
		if len(out) >= most {
			_ = c.raw.Conn.Close() // the rest of the answer is not worth reading
			_ = cmd.Close()
			return nil, &Error{Kind: KindProtocol, Op: "fetch flags " + f.role, Reason: "the server answered with more messages than the folder holds"}
		}
		out = append(out, flagUpdate{uid: msg.uid, flags: msg.flags, modseq: msg.modseq})
	}
	if err := cmd.Close(); err != nil {
		return nil, c.fail("fetch flags "+f.role, err, ctx)
	}
	return out, nil
}

// setEnvelope copies the stored envelope fields into msg, cleaned and
// bounded.
func setEnvelope(msg *message, e *imap.Envelope) {
	if e == nil {
		return
	}
	msg.messageID = clean(e.MessageID, 998)
	msg.subject = clean(e.Subject, 998)
	if len(e.From) > 0 {
		a := e.From[0]
		addr := a.Addr()
		if a.Name != "" {
			addr = a.Name + " <" + addr + ">"
		}
		msg.from = clean(addr, 998)
	}
}

func flagString(flags []imap.Flag) string {
	s := make([]string, 0, len(flags))
	for _, f := range flags {
		// \Recent is per session (and gone in IMAP4rev2): not stored.
		if f == "" || strings.EqualFold(string(f), `\Recent`) || strings.ContainsAny(string(f), " \x00") {
			continue
		}
		s = append(s, string(f))
	}
	slices.Sort(s)
	s = slices.Compact(s)
	// Bounded as the envelope's strings are: a message's FLAGS list may be
	// as long as a response's byte budget, and a batch holds FetchBatch
	// messages; the keywords past the bound are not stored.
	n := 0
	for i, f := range s {
		if n += len(f) + 1; n > maxFlagsBytes+1 {
			s = s[:i]
			break
		}
	}
	return strings.Join(s, " ")
}

// maxFlagsBytes bounds a message's stored flags (a real message has a few
// dozen bytes of them).
const maxFlagsBytes = 1000

// clean makes header text storable: valid UTF-8, no NUL, bounded.
func clean(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) > n {
		s = s[:n]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}
