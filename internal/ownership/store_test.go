package ownership

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
)

var (
	alpha = &domain.Caller{Name: "alpha", Scopes: []string{domain.ScopePublishPublic}, Source: "/alpha"}
	beta  = &domain.Caller{Name: "beta", Scopes: []string{domain.ScopePublishPublic}, Source: "/beta"}
	ops   = &domain.Caller{Name: "ops", Scopes: []string{domain.ScopeOps}, Source: "/ops"}
)

func newStore(t *testing.T) (*Store, *pgtest.DB) { return newStoreTB(t) }

func newStoreTB(t testing.TB) (*Store, *pgtest.DB) {
	t.Helper()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	return NewStore(db.Pool), db
}

func added(src, mailbox, org string) domain.Event {
	return domain.Event{ID: domain.NewEventID(), Type: domain.TypeMailboxAdded, Source: src, Subject: mailbox, Time: time.Now().UTC(),
		Data: &domain.MailboxAdded{MailboxID: mailbox, OrgID: org, UserID: uuid.NewString(), Address: "a@example.com",
			Provider: domain.ProviderSMTPIMAP, IMAP: domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit, Username: "a"},
			SealedCredentials: &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAA", Ciphertext: "c2VhbGVk"}}}
}

func removed(src, mailbox string) domain.Event {
	return domain.Event{ID: domain.NewEventID(), Type: domain.TypeMailboxRemoved, Source: src, Subject: mailbox, Time: time.Now().UTC(),
		Data: &domain.MailboxRemoved{MailboxID: mailbox, Reason: "gone"}}
}

func transferred(mailbox, to string) domain.Event {
	return domain.Event{ID: domain.NewEventID(), Type: domain.TypeMailboxOwnerTransferred, Source: "/ops", Subject: mailbox,
		Data: &domain.MailboxOwnerTransferred{MailboxID: mailbox, Owner: to, Comment: "ticket"}}
}

func decide(t *testing.T, s *Store, c *domain.Caller, evs ...domain.Event) []Refusal {
	t.Helper()
	r, err := s.Decide(t.Context(), c, evs)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func owner(t *testing.T, s *Store, k Key) Claim {
	t.Helper()
	cs, err := s.Claims(t.Context(), k)
	if err != nil {
		t.Fatal(err)
	}
	return cs[k]
}

// TestRacingAddsOfOneNewMailbox: two producers add the same new mailbox
// (and org) at once, many times over: exactly one wins each time, and the
// claim is the winner's.
func TestRacingAddsOfOneNewMailbox(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	for round := range 40 {
		mb, org := uuid.NewString(), uuid.NewString()
		var wg sync.WaitGroup
		refused := make([]bool, 2)
		start := make(chan struct{})
		for i, c := range []*domain.Caller{alpha, beta} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, err := s.Decide(context.Background(), c, []domain.Event{added(c.Source, mb, org)})
				if err != nil {
					t.Error(err)
				}
				refused[i] = len(r) > 0
			}()
		}
		close(start)
		wg.Wait()
		if refused[0] == refused[1] {
			t.Fatalf("round %d: refused alpha %v, beta %v: want exactly one winner", round, refused[0], refused[1])
		}
		winner := alpha
		if refused[0] {
			winner = beta
		}
		if got := owner(t, s, Key{domain.OwnedMailbox, mb}); got.Owner != winner.Source {
			t.Fatalf("round %d: mailbox claimed by %q, the winner is %q", round, got.Owner, winner.Source)
		}
		if got := owner(t, s, Key{domain.OwnedOrg, org}); got.Owner != winner.Source {
			t.Fatalf("round %d: org claimed by %q, the winner is %q", round, got.Owner, winner.Source)
		}
	}
}

// TestClaimWithoutTheLog: an add whose produce failed after its claim
// leaves the claim to its caller: its retry (another event id) is
// accepted, another tenant is refused. A removal that did not reach the
// log frees nothing; once it did, the mailbox is anyone's, and an add by
// the owner in between keeps it claimed.
func TestClaimWithoutTheLog(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	mb, org := uuid.NewString(), uuid.NewString()
	if r := decide(t, s, alpha, added("/alpha", mb, org)); r != nil {
		t.Fatalf("first add refused: %v", r)
	}
	// Nothing produced. The retry:
	if r := decide(t, s, alpha, added("/alpha/sessions", mb, org)); r != nil {
		t.Fatalf("retry refused: %v", r)
	}
	if r := decide(t, s, beta, added("/beta", mb, uuid.NewString())); len(r) != 1 || r[0].Key != (Key{domain.OwnedMailbox, mb}) {
		t.Fatalf("another tenant's add: %v", r)
	}

	rm := removed("/alpha", mb)
	if r := decide(t, s, alpha, rm); r != nil {
		t.Fatalf("removal refused: %v", r)
	}
	if c := owner(t, s, Key{domain.OwnedMailbox, mb}); c.Owner != "/alpha" || c.Releasing != rm.Key() {
		t.Fatalf("pending removal: %+v", c)
	}
	// Not on the log yet: still alpha's.
	if r := decide(t, s, beta, added("/beta", mb, uuid.NewString())); len(r) != 1 {
		t.Fatalf("another tenant during a pending removal: %v", r)
	}
	if err := s.Settle(t.Context(), alpha, []domain.Event{rm}); err != nil {
		t.Fatal(err)
	}
	if c := owner(t, s, Key{domain.OwnedMailbox, mb}); c.Owner != "" {
		t.Fatalf("released mailbox still claimed: %+v", c)
	}
	// The org stays alpha's.
	if c := owner(t, s, Key{domain.OwnedOrg, org}); c.Owner != "/alpha" {
		t.Fatalf("org after the removal: %+v", c)
	}
	// Removal released: another tenant registers it (in its own org).
	if r := decide(t, s, beta, added("/beta", mb, uuid.NewString())); r != nil {
		t.Fatalf("add after the release: %v", r)
	}
	if c := owner(t, s, Key{domain.OwnedMailbox, mb}); c.Owner != "/beta" {
		t.Fatalf("after beta's add: %+v", c)
	}

	// A removal followed by the owner's add before the removal landed:
	// the late release leaves the add's claim.
	mb2 := uuid.NewString()
	decide(t, s, alpha, added("/alpha", mb2, org))
	rm2 := removed("/alpha", mb2)
	decide(t, s, alpha, rm2)
	decide(t, s, alpha, added("/alpha", mb2, org))
	if err := s.Settle(t.Context(), alpha, []domain.Event{rm2}); err != nil {
		t.Fatal(err)
	}
	if c := owner(t, s, Key{domain.OwnedMailbox, mb2}); c.Owner != "/alpha" || c.Releasing != "" {
		t.Fatalf("re-added mailbox after a late release: %+v", c)
	}

	// The owner's add checked before its removal, but on the log after
	// it: the removal's release drops the claim, the add's settling
	// claims the live mailbox again, and another tenant is refused.
	mb3 := uuid.NewString()
	decide(t, s, alpha, added("/alpha", mb3, org))
	add3 := added("/alpha", mb3, org)
	decide(t, s, alpha, add3)
	rm3 := removed("/alpha", mb3)
	decide(t, s, alpha, rm3)
	if err := s.Settle(t.Context(), alpha, []domain.Event{rm3}); err != nil {
		t.Fatal(err)
	}
	if err := s.Settle(t.Context(), alpha, []domain.Event{add3}); err != nil {
		t.Fatal(err)
	}
	if c := owner(t, s, Key{domain.OwnedMailbox, mb3}); c.Owner != "/alpha" {
		t.Fatalf("live mailbox after its add landed last: %+v", c)
	}
	if r := decide(t, s, beta, added("/beta", mb3, uuid.NewString())); len(r) != 1 {
		t.Fatalf("another tenant after the add landed last: %v", r)
	}
	// One request adding and then removing: removed, unclaimed.
	mb4 := uuid.NewString()
	both := []domain.Event{added("/alpha", mb4, org), removed("/alpha", mb4)}
	decide(t, s, alpha, both...)
	if err := s.Settle(t.Context(), alpha, both); err != nil {
		t.Fatal(err)
	}
	if c := owner(t, s, Key{domain.OwnedMailbox, mb4}); c.Owner != "" {
		t.Fatalf("added then removed in one request: %+v", c)
	}
}

// TestDecideIsAllOrNothing: a request with one foreign event writes no
// claim for the others; every foreign event is named.
func TestDecideIsAllOrNothing(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	mine, theirs, org := uuid.NewString(), uuid.NewString(), uuid.NewString()
	decide(t, s, alpha, added("/alpha", theirs, org))
	fresh := uuid.NewString()
	r := decide(t, s, beta, added("/beta", mine, fresh), removed("/beta", theirs), added("/beta", uuid.NewString(), org))
	if len(r) != 2 || r[0].Index != 1 || r[1].Index != 2 || r[1].Key != (Key{domain.OwnedOrg, org}) {
		t.Fatalf("refusals: %+v", r)
	}
	if c := owner(t, s, Key{domain.OwnedMailbox, mine}); c.Owner != "" {
		t.Fatalf("a refused request claimed %s: %+v", mine, c)
	}
	if c := owner(t, s, Key{domain.OwnedOrg, fresh}); c.Owner != "" {
		t.Fatalf("a refused request claimed org %s: %+v", fresh, c)
	}
	// Ops acts on anything; a transfer moves the claim.
	if r := decide(t, s, ops, added("/ops", theirs, uuid.NewString()), transferred(theirs, "/beta")); r != nil {
		t.Fatalf("ops: %v", r)
	}
	if c := owner(t, s, Key{domain.OwnedMailbox, theirs}); c.Owner != "/beta" {
		t.Fatalf("after the transfer: %+v", c)
	}
	// Heartbeats and user.active need no claim and touch no row.
	hb := domain.Event{ID: domain.NewEventID(), Type: domain.TypeWorkerHeartbeat, Source: "/w", Data: &domain.WorkerHeartbeat{WorkerID: uuid.NewString()}}
	if r := decide(t, s, beta, hb); r != nil {
		t.Fatalf("heartbeat: %v", r)
	}
}
