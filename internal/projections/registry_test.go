package projections

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
)

// TestRegistryCreatedRowThatExists applies a batch whose mailbox.added
// names a mailbox that has a row already: the created rows' COPY (which
// skips the key lookup) hits the primary key, rolls back to its savepoint,
// and the batch is written through the lookup instead, leaving the rows a
// merge would; the next batches look every key up, and their rows are the
// same.
func TestRegistryCreatedRowThatExists(t *testing.T) {
	t.Parallel()
	pool := pgtest.Schema(t)
	ctx := context.Background()
	if err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	n := 0
	ev := func(d domain.Data) domain.Event {
		n++
		return domain.Event{ID: uuid.NewString(), Type: d.EventType(), Time: t0.Add(time.Duration(n) * time.Second), Data: d}
	}
	org, user := uuid.NewString(), uuid.NewString()
	added := func(id, address string) domain.Event {
		return ev(&domain.MailboxAdded{MailboxID: id, OrgID: org, UserID: user, Address: address, Provider: domain.Provider("gmail"),
			IMAP: domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: "implicit", Username: address}})
	}
	health := func(id string, score float64) domain.Event {
		return ev(&domain.MailboxHealthScored{MailboxID: id, State: domain.HealthWatch, Score: score, Reason: "r"})
	}
	m1, m2, m3, m4 := uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString()
	r := NewRegistry()
	apply := func(events ...domain.Event) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return r.Apply(ctx, tx, records(events)) }); err != nil {
			t.Fatal(err)
		}
	}

	apply(added(m1, "one@example.com"), added(m2, "two@example.com"), health(m2, 40))
	if got := r.noGuess.Load(); got != 0 {
		t.Fatalf("all keys new, yet noGuess = %d", got)
	}
	// m2's add finds its row: the batch goes through the lookup; m1 has a
	// row too and takes the merge, m3 is new.
	apply(health(m1, 70), added(m2, "two-again@example.com"), added(m3, "three@example.com"))
	if got := r.noGuess.Load(); got != guessBackoff {
		t.Fatalf("after a miss noGuess = %d, want %d", got, guessBackoff)
	}
	apply(added(m4, "four@example.com"))
	if got := r.noGuess.Load(); got != guessBackoff-1 {
		t.Fatalf("noGuess = %d, want %d", got, guessBackoff-1)
	}

	type row struct {
		address string
		score   *float64
	}
	got := map[string]row{}
	rows, err := pool.Query(ctx, `SELECT mailbox_id::text, address, health_score FROM mailboxes`)
	if err != nil {
		t.Fatal(err)
	}
	var (
		id, address string
		score       *float64
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &address, &score}, func() error {
		got[id] = row{address, score}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	f := func(x float64) *float64 { return &x }
	want := map[string]row{
		m1: {"one@example.com", f(70)},
		m2: {"two-again@example.com", f(40)}, // the re-add keeps the health group
		m3: {"three@example.com", nil},
		m4: {"four@example.com", nil},
	}
	if len(got) != len(want) {
		t.Fatalf("rows %v, want %v", got, want)
	}
	for id, w := range want {
		g := got[id]
		if g.address != w.address || (g.score == nil) != (w.score == nil) || g.score != nil && *g.score != *w.score {
			t.Errorf("mailbox %s: address %q score %v, want %q %v", id, g.address, g.score, w.address, w.score)
		}
	}
}

// TestRegistryDisabled: a mailbox.disabled shows on the mailbox's row, with
// its cause and reason, through both the created-rows path and the merge;
// a later mailbox.added clears it.
func TestRegistryDisabled(t *testing.T) {
	t.Parallel()
	pool := pgtest.Schema(t)
	ctx := context.Background()
	if err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	n := 0
	ev := func(d domain.Data) domain.Event {
		n++
		return domain.Event{ID: uuid.NewString(), Type: d.EventType(), Time: t0.Add(time.Duration(n) * time.Second), Data: d}
	}
	added := func(id string) domain.Event {
		return ev(&domain.MailboxAdded{MailboxID: id, OrgID: uuid.NewString(), UserID: uuid.NewString(), Address: "a@example.com",
			Provider: domain.ProviderSMTPIMAP, IMAP: domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: "implicit", Username: "a"}})
	}
	disabled := func(id string) domain.Event {
		return ev(&domain.MailboxDisabled{MailboxID: id, Cause: domain.DisableAuthFailing, Reason: "LOGIN refused"})
	}
	r := NewRegistry()
	apply := func(events ...domain.Event) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return r.Apply(ctx, tx, records(events)) }); err != nil {
			t.Fatal(err)
		}
	}
	state := func(id string) (at *time.Time, reason *string) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT disabled_at, disabled_reason FROM mailboxes WHERE mailbox_id = $1`, id).Scan(&at, &reason); err != nil {
			t.Fatal(err)
		}
		return at, reason
	}
	m1, m2 := uuid.NewString(), uuid.NewString()
	apply(added(m1), disabled(m1), added(m2)) // new rows, disabled in the same batch
	if at, reason := state(m1); at == nil || !at.Equal(t0.Add(2*time.Second)) || reason == nil || *reason != "auth_failing: LOGIN refused" {
		t.Fatalf("m1: %v %v", at, reason)
	}
	if at, _ := state(m2); at != nil {
		t.Fatalf("m2 disabled: %v", at)
	}
	apply(disabled(m2)) // the merge path
	if at, _ := state(m2); at == nil {
		t.Fatal("m2 not disabled")
	}
	apply(ev(&domain.MailboxHealthScored{MailboxID: m2, State: domain.HealthWatch, Score: 90, Reason: "r"}))
	if at, _ := state(m2); at == nil {
		t.Fatal("a health score cleared the disable")
	}
	apply(added(m2)) // added again: enabled
	if at, reason := state(m2); at != nil || reason != nil {
		t.Fatalf("m2 still disabled after an add: %v %v", at, reason)
	}
}

// records gives events positions of their own, for applying them directly
// (the projector passes the log's).
func records(events []domain.Event) []Record {
	recs := make([]Record, len(events))
	for i, ev := range events {
		recs[i] = Record{Event: ev, Topic: "direct", Offset: int64(i)}
	}
	return recs
}
