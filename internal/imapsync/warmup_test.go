package imapsync_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/imapsync"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/topics"
)

const warmSender = "0190a5b2-4c5e-7b1a-9c3d-00000000aa01"

func warmupMsg(id, subject string) []byte {
	return fmt.Appendf(nil, "From: Warm <warm@warm.example>\r\nTo: alice@example.org\r\nSubject: %s\r\n"+
		"Message-ID: <%s@warm.example>\r\nDate: Wed, 04 Mar 2026 11:00:00 +0000\r\n"+
		"%s: mailbox=%s; id=%s\r\nContent-Type: text/plain\r\n\r\nwarmup\r\n", subject, id, imapsync.DefaultWarmupHeader, warmSender, id)
}

// observations decodes the warmup_observed records waiting in the outbox.
func (h *harness) observations() map[string]*domain.WarmupObserved {
	h.t.Helper()
	recs, err := outbox.Pending(context.Background(), h.db.Pool, 1000)
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]*domain.WarmupObserved{}
	for _, r := range recs {
		if r.Topic != topics.MailboxObservations {
			continue // sync's own records (ownership, tiers)
		}
		ev, err := topics.Decode(r)
		if err != nil {
			h.t.Fatalf("outbox record: %v", err)
		}
		o, ok := ev.Data.(*domain.WarmupObserved)
		if !ok || string(r.Key) != o.MailboxID {
			h.t.Fatalf("outbox holds %s on %s", ev.Type, r.Topic)
		}
		if _, dup := out[o.WarmupID]; dup {
			h.t.Fatalf("warmup %s reported twice", o.WarmupID)
		}
		out[o.WarmupID] = o
	}
	return out
}

// Warmup messages in INBOX and Junk are reported once each, with where
// they landed; a malformed header and the Sent folder are not; a resync
// after UIDVALIDITY changed reports nothing again.
func testWarmupObserved(t *testing.T, srv testServer) {
	srv.deliver(t, user, "INBOX", warmupMsg("in-1", "warm inbox"))
	srv.deliver(t, user, srv.junk(), warmupMsg("junk-1", "warm junk"))
	srv.deliver(t, user, srv.junk(), readMsg(t, "junk1.eml")) // malformed header: "w2"
	srv.deliver(t, user, srv.sent(), warmupMsg("sent-1", "own copy"))
	h := setup(t, srv, domain.SyncTierWarm, func(_ *imapsync.Config, j *mailsync.Job) { j.PollWarm = 300 * time.Millisecond }, "")
	h.start()
	h.waitRows(4, 15*time.Second)
	var obs map[string]*domain.WarmupObserved
	waitFor(t, 5*time.Second, "two observations", func() (bool, string) {
		obs = h.observations()
		return len(obs) == 2, fmt.Sprint(len(obs))
	})
	if o := obs["in-1"]; o == nil || o.Placement != domain.PlacedInbox || o.MailboxID != warmSender || o.RecipientMailboxID != mailboxID || o.LandedAt.IsZero() {
		t.Errorf("in-1: %+v", o)
	}
	if o := obs["junk-1"]; o == nil || o.Placement != domain.PlacedJunk {
		t.Errorf("junk-1: %+v", o)
	}
	// The same message moved to Junk later, and a new one: only the new
	// one is reported.
	srv.deliver(t, user, srv.junk(), warmupMsg("in-1", "moved"))
	srv.deliver(t, user, "INBOX", warmupMsg("in-2", "second"))
	h.waitRows(6, 15*time.Second)
	uv := srv.newUIDValidity(t, user, "INBOX")
	waitFor(t, 10*time.Second, "INBOX resynced", func() (bool, string) {
		var n int
		_ = h.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM imap_messages WHERE folder = 'INBOX' AND uidvalidity = $1`, int64(uv)).Scan(&n)
		return n == 2, fmt.Sprint(n, " rows under the new UIDVALIDITY")
	})
	obs = h.observations()
	if len(obs) != 3 || obs["in-1"].Placement != domain.PlacedInbox || obs["in-2"] == nil {
		t.Errorf("observations after the move and resync: %d %+v", len(obs), obs)
	}
}
