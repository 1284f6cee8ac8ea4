package ownership

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/producer"
)

// TestFold: the owner of a mailbox is the tenant of its first add since
// its last removal; a transfer moves it; an org is the earliest adder's
// unless transferred; a source no tenant speaks as owns what it added.
func TestFold(t *testing.T) {
	t.Parallel()
	f := NewFold([]string{"/alpha", "/beta", "/", "urn:acme:"})
	mb1, mb2, mb3, orgA, orgB := uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString()
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	// Partition 1 is read first but holds the later add of orgA.
	f.Apply(added("/beta/import", mb2, orgA), at(5), 1, 0)
	f.Apply(added("/alpha/sessions", mb1, orgA), at(1), 0, 0)
	f.Apply(added("/beta", mb1, orgB), at(2), 0, 1) // the old attack: changes no owner
	f.Apply(removed("/alpha", mb2), at(6), 1, 1)
	f.Apply(added("urn:acme:importer", mb2, orgB), at(7), 1, 2)
	f.Apply(added("mailplane/cli", mb3, orgB), at(8), 2, 0)
	f.Apply(transferred(mb3, "/alpha"), at(9), 2, 1)
	f.Apply(domain.Event{Type: domain.TypeOrgOwnerTransferred, Data: &domain.OrgOwnerTransferred{OrgID: orgB, Owner: "/alpha", Comment: "c"}}, at(0), 0, 0)
	mbOld := uuid.NewString()
	f.Apply(added("/alpha", mbOld, orgA), at(3), 3, 0)
	f.Apply(removed("/alpha", mbOld), at(4), 3, 1)

	want := map[Key]string{
		{domain.OwnedMailbox, mb1}: "/alpha",
		{domain.OwnedMailbox, mb2}: "urn:acme:",
		{domain.OwnedMailbox, mb3}: "/alpha",
		{domain.OwnedOrg, orgA}:    "/alpha",
		{domain.OwnedOrg, orgB}:    "/alpha",
	}
	got := f.Claims()
	if len(got) != len(want) {
		t.Errorf("claims %v, want %v", got, want)
	}
	for k, o := range want {
		if got[k] != o {
			t.Errorf("%s: owner %q, want %q", k, got[k], o)
		}
	}
	if u := f.Unmapped(); !slices.Equal(u, []string{"mailplane/cli"}) {
		t.Errorf("unmapped sources %v", u)
	}
}

// TestBackfillFromTheLog: existing mailboxes get their owner from the
// source of their first mailbox.added on the log; claims written at
// ingest since are kept; the API checks ownership only once a backfill
// is recorded.
func TestBackfillFromTheLog(t *testing.T) {
	t.Parallel()
	s, db := newStore(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// An existing installation: no backfill yet.
	if _, err := db.Pool.Exec(ctx, `DELETE FROM ownership_backfills`); err != nil {
		t.Fatal(err)
	}
	g := NewGuard(s)
	mb1, mb2, mb3, org := uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString()
	err := g.Check(ctx, alpha, []domain.Event{added("/alpha", mb1, org)})
	if domain.ErrorCode(err) != domain.CodeUnavailable {
		t.Fatalf("before the backfill: %v", err)
	}
	if err := g.Check(ctx, alpha, []domain.Event{{Type: domain.TypeUserActive, Data: &domain.UserActive{UserID: uuid.NewString()}}}); err != nil {
		t.Fatalf("user.active before the backfill: %v", err)
	}

	kcfg := kafkatest.Config(t, 4)
	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	pc := producer.New(kc, producer.WithNamespace(kcfg.Namespace))
	// mb1: alpha's, re-added by beta before ownership existed; mb2: removed;
	// mb3: beta's, but claimed at ingest by alpha since (kept).
	if _, err := pc.Publish(ctx, added("/alpha/sessions", mb1, org), added("/beta", mb1, uuid.NewString()),
		added("/alpha", mb2, org), removed("/alpha", mb2), added("/beta", mb3, uuid.NewString())); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO ownership_claims (kind, id, owner, claimed_at) VALUES ('mailbox', $1, '/alpha', now())`, mb3); err != nil {
		t.Fatal(err)
	}
	rep, err := Backfill(ctx, kcfg, s, []string{"/alpha", "/beta"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Mailboxes != 2 || rep.Orgs != 3 || rep.Written != 4 || len(rep.Unmapped) != 0 {
		t.Errorf("report %+v", rep)
	}
	for k, o := range map[Key]string{{domain.OwnedMailbox, mb1}: "/alpha", {domain.OwnedMailbox, mb2}: "", {domain.OwnedMailbox, mb3}: "/alpha", {domain.OwnedOrg, org}: "/alpha"} {
		if c := owner(t, s, k); c.Owner != o {
			t.Errorf("%s: owner %q, want %q", k, c.Owner, o)
		}
	}
	// Now the API checks: beta is refused alpha's mailbox, alpha is not.
	var re *RefusedError
	if err := g.Check(ctx, beta, []domain.Event{added("/beta", mb1, uuid.NewString())}); domain.ErrorCode(err) != domain.CodeNotOwner {
		t.Fatalf("beta after the backfill: %v", err)
	} else if !asRefused(err, &re) || !slices.Equal(re.EventIndexes(), []int{0}) {
		t.Fatalf("refusal %v does not name event 0", err)
	}
	if err := g.Check(ctx, alpha, []domain.Event{added("/alpha", mb1, org)}); err != nil {
		t.Fatalf("alpha after the backfill: %v", err)
	}
	// Again: nothing more to write.
	if rep, err := Backfill(ctx, kcfg, s, []string{"/alpha", "/beta"}); err != nil || rep.Written != 0 {
		t.Fatalf("second backfill: %+v %v", rep, err)
	}
}

func asRefused(err error, re **RefusedError) bool {
	r, ok := err.(*RefusedError)
	*re = r
	return ok
}
