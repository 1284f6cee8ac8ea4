// Package ownership keeps who owns each mailbox and org (the rules are
// domain/ownership.go's): the claims in Postgres (migration 0012), written
// by the ingest API before it produces (Guard), and their backfill from the
// log (Backfill, `mailplane ownership backfill`).
//
// A claim is written in one transaction before the event that needs it is
// produced, so the check holds under concurrency: every transaction on a
// mailbox or org first takes that key's advisory lock, so two producers
// adding the same new mailbox at once are served one after the other and
// the second finds the first's claim. What the log never received still
// leaves its claim: an add whose produce failed after its claim is the
// caller's (its retry, with the same or another event id, is accepted; it
// only keeps other tenants from the id). A removal is the exception: it
// marks the claim and drops it only once the log acknowledged the
// removal, so a removal that never reached the log never frees a live
// mailbox for another tenant. Once the log acknowledged an add, its claim
// is made sure of again (Store.Settle), so an owner's add and removal of
// one mailbox in flight at once leave it claimed whenever the log holds
// it live.
package ownership

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailplane/mailplane/domain"
)

// DB is what the store needs of Postgres; *pgxpool.Pool is one.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Key names a mailbox or an org.
type Key struct {
	Kind domain.OwnedKind
	ID   string
}

func (k Key) String() string { return string(k.Kind) + " " + k.ID }

// Claim is the stored owner of a key.
type Claim struct {
	Owner string
	// Releasing is the event key of the owner's mailbox.removed awaiting
	// the log's acknowledgement ("" when none).
	Releasing string
}

// Refusal is one event the caller may not publish: its index in the
// request and the key another tenant owns.
type Refusal struct {
	Index int
	Key   Key
}

// Store reads and writes the claims.
type Store struct{ db DB }

// NewStore returns the store of db (a pool whose search_path holds the
// migrated tables).
func NewStore(db DB) *Store { return &Store{db: db} }

// The advisory locks of ownership: a fixed class and one of lockBuckets
// buckets a key hashes to, so they meet no other lock of the database
// (the migrations' class is another constant). Buckets, not one lock a
// key: a batch of 1,000 adds would otherwise take 1,001 locks, and
// Postgres's lock table is shared by every transaction (64 a connection
// by default). A transaction holds at most lockBuckets of them; keys
// sharing a bucket only wait on each other.
const (
	lockClass   = 0x6f776e72 // "ownr"
	lockBuckets = 64         // a power of two (the mask below)
	selectSQL   = `SELECT kind, id::text, owner, COALESCE(releasing::text, '')
FROM ownership_claims WHERE (kind, id) IN (SELECT k, i::uuid FROM unnest($1::text[], $2::text[]) AS u(k, i))`
	upsertSQL = `INSERT INTO ownership_claims AS c (kind, id, owner, claimed_at, releasing)
SELECT k, i::uuid, o, now(), NULLIF(r, '')::uuid FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS u(k, i, o, r)
ON CONFLICT (kind, id) DO UPDATE SET
    owner      = EXCLUDED.owner,
    claimed_at = CASE WHEN c.owner = EXCLUDED.owner THEN c.claimed_at ELSE EXCLUDED.claimed_at END,
    releasing  = EXCLUDED.releasing`
	deleteSQL = `DELETE FROM ownership_claims WHERE kind = 'mailbox'
AND (id, releasing) IN (SELECT i::uuid, r::uuid FROM unnest($1::text[], $2::text[]) AS u(i, r))`
	insertMissingSQL = `INSERT INTO ownership_claims (kind, id, owner, claimed_at)
SELECT k, i::uuid, o, now() FROM unnest($1::text[], $2::text[], $3::text[]) AS u(k, i, o)
ON CONFLICT (kind, id) DO NOTHING`
)

// lockSQL takes the transaction-scoped locks of keys' buckets, in bucket
// order, so two transactions never wait on each other in a circle.
var lockSQL = fmt.Sprintf(`SELECT pg_advisory_xact_lock($1::int4, b)
FROM (SELECT DISTINCT hashtext(k || ':' || i) & %d AS b FROM unnest($2::text[], $3::text[]) AS u(k, i)) AS l
ORDER BY b`, lockBuckets-1)

// effect is one event's ownership effect with the event's index and key.
type effect struct {
	domain.OwnershipEffect
	index int
	event string // the event's key (a UUID)
}

// Decide checks and records what events do to ownership, for caller, in
// one transaction: it returns the events refused (another tenant owns
// what they act on; nothing is written then) or nil once every claim,
// transfer and pending removal is committed. The caller produces the
// events only after. Events without an ownership effect cost nothing: a
// request of heartbeats never reaches Postgres.
func (s *Store) Decide(ctx context.Context, caller *domain.Caller, events []domain.Event) ([]Refusal, error) {
	var effects []effect
	for i, ev := range events {
		for _, e := range domain.OwnershipEffects(ev.Data) {
			effects = append(effects, effect{OwnershipEffect: e, index: i, event: ev.Key()})
		}
	}
	if len(effects) == 0 {
		return nil, nil
	}
	tenant := caller.Tenant()
	keys := make([]Key, 0, len(effects))
	for _, e := range effects {
		keys = append(keys, Key{e.Kind, e.ID})
	}
	slices.SortFunc(keys, compareKeys)
	keys = slices.Compact(keys)

	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after commit
	kinds, ids := keyColumns(keys)
	if _, err := tx.Exec(ctx, lockSQL, lockClass, kinds, ids); err != nil {
		return nil, fmt.Errorf("ownership: lock: %w", err)
	}
	claims, err := readClaims(ctx, tx, kinds, ids)
	if err != nil {
		return nil, err
	}

	// Apply the request's events in order to what is stored: the first
	// refusal of an event is reported, and every event is looked at, so a
	// client learns of all its foreign events at once.
	changed := map[Key]bool{}
	var refused []Refusal
	refuse := func(e effect, k Key) {
		if len(refused) == 0 || refused[len(refused)-1].Index != e.index {
			refused = append(refused, Refusal{Index: e.index, Key: k})
		}
	}
	for _, e := range effects {
		k := Key{e.Kind, e.ID}
		c := claims[k]
		if !caller.MayActOn(c.Owner) || (e.TransferTo != "" && !caller.Has(domain.ScopeOps)) {
			refuse(e, k)
			continue
		}
		next := c
		switch {
		case e.TransferTo != "":
			next = Claim{Owner: e.TransferTo}
		case e.Claims:
			if c.Owner == "" && tenant == "" {
				// Only a caller with a source registers anything (a
				// worker credential publishes no mailbox events).
				refuse(e, k)
				continue
			}
			if c.Owner == "" {
				next.Owner = tenant
			}
			next.Releasing = "" // an add after a removal: the mailbox stays claimed
		case e.Releases && c.Owner != "": // unowned: nothing to release
			next.Releasing = e.event
		}
		if next != c {
			claims[k] = next
			changed[k] = true
		}
	}
	if len(refused) > 0 {
		return refused, nil
	}
	if len(changed) > 0 {
		var k, i, o, r []string
		for _, key := range keys {
			if changed[key] {
				c := claims[key]
				k, i, o, r = append(k, string(key.Kind)), append(i, key.ID), append(o, c.Owner), append(r, c.Releasing)
			}
		}
		if _, err := tx.Exec(ctx, upsertSQL, k, i, o, r); err != nil {
			return nil, fmt.Errorf("ownership: write claims: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("ownership: commit: %w", err)
	}
	return nil, nil
}

// Settle records that the log acknowledged events that Decide let
// through for caller. Their mailbox.added events claim their mailboxes
// again where no claim is left: a removal by the same owner, checked
// after the add but on the log before it, has dropped the claim of a
// mailbox the log now holds live. Then their mailbox.removed events drop
// the claims still pending on them: a claim that an add by its owner took
// back since is kept.
func (s *Store) Settle(ctx context.Context, caller *domain.Caller, events []domain.Event) error {
	var addKinds, adds, owners, ids, removals []string
	tenant := caller.Tenant()
	for _, ev := range events {
		for _, e := range domain.OwnershipEffects(ev.Data) {
			switch {
			case e.Claims && e.Kind == domain.OwnedMailbox && tenant != "":
				addKinds, adds, owners = append(addKinds, string(e.Kind)), append(adds, e.ID), append(owners, tenant)
			case e.Releases:
				ids, removals = append(ids, e.ID), append(removals, ev.Key())
			}
		}
	}
	if len(adds) > 0 {
		if _, err := s.db.Exec(ctx, insertMissingSQL, addKinds, adds, owners); err != nil {
			return fmt.Errorf("ownership: settle adds: %w", err)
		}
	}
	if len(ids) > 0 {
		if _, err := s.db.Exec(ctx, deleteSQL, ids, removals); err != nil {
			return fmt.Errorf("ownership: release: %w", err)
		}
	}
	return nil
}

// Claims returns the stored claims of keys (absent: unowned).
func (s *Store) Claims(ctx context.Context, keys ...Key) (map[Key]Claim, error) {
	kinds, ids := keyColumns(keys)
	return readClaims(ctx, s.db, kinds, ids)
}

// insertMissing writes claims for keys that have none, in batches, each
// under the keys' locks; it returns how many it wrote.
func (s *Store) insertMissing(ctx context.Context, claims map[Key]string) (int64, error) {
	keys := make([]Key, 0, len(claims))
	for k := range claims {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareKeys)
	var n int64
	for len(keys) > 0 {
		batch := keys[:min(len(keys), 5000)]
		keys = keys[len(batch):]
		kinds, ids := keyColumns(batch)
		owners := make([]string, len(batch))
		for j, k := range batch {
			owners[j] = claims[k]
		}
		err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, lockSQL, lockClass, kinds, ids); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, insertMissingSQL, kinds, ids, owners)
			n += tag.RowsAffected()
			return err
		})
		if err != nil {
			return n, fmt.Errorf("ownership: write backfilled claims: %w", err)
		}
	}
	return n, nil
}

// Backfilled reports whether the claims were backfilled from the log
// (or there was nothing to backfill: migration 0012).
func (s *Store) Backfilled(ctx context.Context) (bool, error) {
	rows, err := s.db.Query(ctx, `SELECT EXISTS (SELECT 1 FROM ownership_backfills)`)
	if err != nil {
		return false, fmt.Errorf("ownership: backfills: %w", err)
	}
	ok, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if err != nil {
		return false, fmt.Errorf("ownership: backfills: %w", err)
	}
	return ok, nil
}

func (s *Store) recordBackfill(ctx context.Context, r BackfillReport) error {
	_, err := s.db.Exec(ctx, `INSERT INTO ownership_backfills (backfilled_at, mailboxes, orgs, written, unmapped)
VALUES (now(), $1, $2, $3, $4)`, r.Mailboxes, r.Orgs, r.Written, r.UnmappedClaims)
	if err != nil {
		return fmt.Errorf("ownership: record the backfill: %w", err)
	}
	return nil
}

// hasEffects reports whether any of events changes or needs a claim.
func hasEffects(events []domain.Event) bool {
	for _, ev := range events {
		if len(domain.OwnershipEffects(ev.Data)) > 0 {
			return true
		}
	}
	return false
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func readClaims(ctx context.Context, q querier, kinds, ids []string) (map[Key]Claim, error) {
	rows, err := q.Query(ctx, selectSQL, kinds, ids)
	if err != nil {
		return nil, fmt.Errorf("ownership: read claims: %w", err)
	}
	out := map[Key]Claim{}
	for rows.Next() {
		var kind, id string
		var c Claim
		if err := rows.Scan(&kind, &id, &c.Owner, &c.Releasing); err != nil {
			rows.Close()
			return nil, err
		}
		out[Key{domain.OwnedKind(kind), id}] = c
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ownership: read claims: %w", err)
	}
	return out, nil
}

func keyColumns(keys []Key) (kinds, ids []string) {
	kinds, ids = make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		kinds[i], ids[i] = string(k.Kind), k.ID
	}
	return kinds, ids
}

func compareKeys(a, b Key) int {
	if c := strings.Compare(string(a.Kind), string(b.Kind)); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}
