package workerapi_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/apitest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/internal/workerapi"
	"github.com/mailplane/mailplane/topics"
)

// newDB returns a private schema with mailplane's migrations, which hold
// the placement projection's tables this package reads (0005_placement).
func newDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	return db.Pool
}

// projector writes the assignment tables the way the placement projector
// is meant to: one transaction per decision, with the decision-log offset
// in projector_offsets.
type projector struct {
	t    testing.TB
	pool *pgxpool.Pool
	name string
	next int64
}

func newProjector(t testing.TB, pool *pgxpool.Pool) *projector {
	return &projector{t: t, pool: pool, name: postgres.Name}
}

// id builds fixed UUIDs: id('w', 1) = 00000000-0000-7000-8000-0000000000w1.
func id(kind byte, n int) string {
	const hex = "0123456789abcdef"
	b := []byte("00000000-0000-7000-8000-000000000000")
	b[len(b)-2] = kind
	b[len(b)-1] = hex[n]
	return string(b)
}

var (
	w1, w2 = id('a', 1), id('a', 2)
	org    = id('c', 1)
	mbA    = id('b', 0xa)
	mbB    = id('b', 0xb)
	mbC    = id('b', 0xc)
	mbD    = id('b', 0xd)
	mbE    = id('b', 0xe)
)

func decisionTime(off int64) time.Time {
	return time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(off) * time.Minute)
}

func (p *projector) apply(f func(ctx context.Context, tx pgx.Tx, off int64) error) {
	p.t.Helper()
	ctx := context.Background()
	off := p.next
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if err := f(ctx, tx, off); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
INSERT INTO projector_offsets (projector, topic, partition, next_offset, updated_at)
VALUES ($1, $2, 0, $3, $4)
ON CONFLICT (projector, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = EXCLUDED.updated_at`,
			p.name, topics.PlacementDecisions, off+1, decisionTime(off))
		return err
	})
	if err != nil {
		p.t.Fatalf("decision %d: %v", off, err)
	}
	p.next++
}

func change(ctx context.Context, tx pgx.Tx, worker string, off int64, mailbox, kind string) error {
	_, err := tx.Exec(ctx, `INSERT INTO placement_assignment_changes (worker_id, decision_offset, mailbox_id, change)
VALUES ($1, $2, $3, $4)`, worker, off, mailbox, kind)
	return err
}

func (p *projector) assign(mailbox, worker string, band domain.RiskPool, weight int64) {
	p.t.Helper()
	p.apply(func(ctx context.Context, tx pgx.Tx, off int64) error {
		_, err := tx.Exec(ctx, `INSERT INTO placement_assignments
  (mailbox_id, worker_id, org_id, band, weight_milli, assigned_at, decision_offset)
VALUES ($1, $2, $3, $4, $5, $6, $7)`, mailbox, worker, org, string(band), weight, decisionTime(off), off)
		if err != nil {
			return err
		}
		return change(ctx, tx, worker, off, mailbox, "added")
	})
}

func (p *projector) move(mailbox, from, to string, band domain.RiskPool) {
	p.t.Helper()
	p.apply(func(ctx context.Context, tx pgx.Tx, off int64) error {
		tag, err := tx.Exec(ctx, `UPDATE placement_assignments
SET worker_id = $2, band = $3, assigned_at = $4, decision_offset = $5
WHERE mailbox_id = $1`, mailbox, to, string(band), decisionTime(off), off)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return errors.New("no such assignment")
		}
		if err := change(ctx, tx, from, off, mailbox, "removed"); err != nil {
			return err
		}
		return change(ctx, tx, to, off, mailbox, "added")
	})
}

func (p *projector) unassign(mailbox, worker string) {
	p.t.Helper()
	p.apply(func(ctx context.Context, tx pgx.Tx, off int64) error {
		if _, err := tx.Exec(ctx, `DELETE FROM placement_assignments WHERE mailbox_id = $1`, mailbox); err != nil {
			return err
		}
		return change(ctx, tx, worker, off, mailbox, "removed")
	})
}

// other decisions (a worker registered, a plan recorded) move the log on
// without touching assignments.
func (p *projector) other() {
	p.t.Helper()
	p.apply(func(context.Context, pgx.Tx, int64) error { return nil })
}

func ids(as []workerapi.Assignment) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.MailboxID
	}
	return out
}

func assertResult(t testing.TB, name string, got workerapi.Result, err error, full bool, mailboxes, added, removed []string, token int64) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if got.Full != full || got.Token != workerapi.TokenAt(token) ||
		!slices.Equal(ids(got.Mailboxes), mailboxes) || !slices.Equal(ids(got.Added), added) ||
		!slices.Equal(got.Removed, removed) {
		t.Errorf("%s: got full=%v mailboxes=%v added=%v removed=%v token=%d;\nwant full=%v mailboxes=%v added=%v removed=%v token=%d",
			name, got.Full, ids(got.Mailboxes), ids(got.Added), got.Removed, got.Token.Offset(),
			full, mailboxes, added, removed, token)
	}
}

// TestPGStore runs a fixed history of decisions through the placement
// tables and checks full lists, net changes since tokens, the retention
// horizon and tokens from another history.
func TestPGStore(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	s := postgres.NewStore(pool)
	ctx := context.Background()
	none := []string{}

	// A fresh projection: nothing, at offset 0.
	res, err := s.Assignments(ctx, w1, workerapi.Token{})
	assertResult(t, "fresh, full", res, err, true, none, none, nil, 0)
	res, err = s.Assignments(ctx, w1, workerapi.TokenAt(0))
	assertResult(t, "fresh, since 0", res, err, false, none, none, nil, 0)

	p := newProjector(t, pool)
	p.assign(mbA, w1, domain.RiskClean, 1000) // 0
	p.assign(mbB, w1, domain.RiskClean, 400)  // 1
	p.assign(mbC, w2, domain.RiskClean, 50)   // 2
	t3 := workerapi.TokenAt(p.next)           // 3

	res, err = s.Assignments(ctx, w1, workerapi.Token{})
	assertResult(t, "w1 full at 3", res, err, true, []string{mbA, mbB}, nil, nil, 3)
	if a := res.Mailboxes[1]; a.OrgID != org || a.Band != domain.RiskClean || a.WeightMilli != 400 || !a.AssignedAt.Equal(decisionTime(1)) {
		t.Errorf("w1 full: details of %s: %+v", mbB, a)
	}

	p.assign(mbD, w1, domain.RiskClean, 1000) // 3: added ...
	p.unassign(mbD, w1)                       // 4: ... and removed again: not reported
	p.move(mbA, w1, w2, domain.RiskClean)     // 5: A leaves w1
	p.move(mbC, w2, w1, domain.RiskClean)     // 6: C comes to w1
	p.move(mbB, w1, w2, domain.RiskRisky)     // 7: B leaves w1 ...
	p.move(mbB, w2, w1, domain.RiskRisky)     // 8: ... and comes back, changed: added
	p.assign(mbE, w2, domain.RiskClean, 1000) // 9
	p.other()                                 // 10
	// next = 11

	res, err = s.Assignments(ctx, w1, workerapi.Token{})
	assertResult(t, "w1 full at 11", res, err, true, []string{mbB, mbC}, nil, nil, 11)
	res, err = s.Assignments(ctx, w2, workerapi.Token{})
	assertResult(t, "w2 full at 11", res, err, true, []string{mbA, mbE}, nil, nil, 11)

	res, err = s.Assignments(ctx, w1, t3)
	assertResult(t, "w1 since 3", res, err, false, nil, []string{mbB, mbC}, []string{mbA}, 11)
	if b := res.Added[0]; b.Band != domain.RiskRisky || !b.AssignedAt.Equal(decisionTime(8)) {
		t.Errorf("w1 since 3: %s has stale details %+v", mbB, b)
	}
	res, err = s.Assignments(ctx, w2, t3)
	// B came and went on w2 after 3: nothing to say about it.
	assertResult(t, "w2 since 3", res, err, false, nil, []string{mbA, mbE}, []string{mbC}, 11)
	res, err = s.Assignments(ctx, w1, workerapi.TokenAt(0))
	// Since the very start: A came and left, D came and left.
	assertResult(t, "w1 since 0", res, err, false, nil, []string{mbB, mbC}, nil, 11)
	res, err = s.Assignments(ctx, w1, workerapi.TokenAt(11))
	assertResult(t, "w1 up to date", res, err, false, nil, nil, nil, 11)
	res, err = s.Assignments(ctx, w1, workerapi.TokenAt(10))
	assertResult(t, "w1 since 10 (no assignment decision)", res, err, false, nil, nil, nil, 11)

	unknown := id('a', 9)
	res, err = s.Assignments(ctx, unknown, workerapi.Token{})
	assertResult(t, "unknown worker, full", res, err, true, none, nil, nil, 11)
	res, err = s.Assignments(ctx, unknown, t3)
	assertResult(t, "unknown worker, since 3", res, err, false, nil, nil, nil, 11)

	// A token ahead of the projection is from another history.
	if _, err := s.Assignments(ctx, w1, workerapi.TokenAt(12)); !errors.Is(err, workerapi.ErrTokenExpired) {
		t.Errorf("token ahead of the projection: %v", err)
	}

	// Prune below 5: tokens below the horizon expire, the rest still work.
	n, err := postgres.PruneChanges(ctx, pool, 5)
	if err != nil || n != 5 { // offsets 0-4: A, B, C, D added, D removed
		t.Fatalf("prune: %d rows, %v", n, err)
	}
	if _, err := s.Assignments(ctx, w1, t3); !errors.Is(err, workerapi.ErrTokenExpired) {
		t.Errorf("token below the horizon: %v", err)
	}
	res, err = s.Assignments(ctx, w1, workerapi.TokenAt(5))
	assertResult(t, "w1 since 5 after prune", res, err, false, nil, []string{mbB, mbC}, []string{mbA}, 11)
	// The horizon never moves down.
	if _, err := postgres.PruneChanges(ctx, pool, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Assignments(ctx, w1, workerapi.TokenAt(4)); !errors.Is(err, workerapi.ErrTokenExpired) {
		t.Errorf("horizon moved down: %v", err)
	}
	if _, err := postgres.PruneChanges(ctx, pool, -1); err == nil {
		t.Error("negative horizon accepted")
	}

	// The position is the named projector's.
	other := postgres.NewStore(pool, postgres.WithStoreProjector("placement-rebuild"))
	res, err = other.Assignments(ctx, w1, workerapi.Token{})
	assertResult(t, "another projector's position", res, err, true, []string{mbB, mbC}, nil, nil, 0)

	// A canceled context is an error, not an empty answer.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Assignments(cctx, w1, workerapi.Token{}); err == nil || errors.Is(err, workerapi.ErrTokenExpired) {
		t.Errorf("canceled context: %v", err)
	}
}

// TestAssignmentsOverHTTP polls through the API against Postgres: full
// list, then only the changes, then a resync after pruning.
func TestAssignmentsOverHTTP(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	e := newEnv(t, workerapi.WithAssignmentStore(postgres.NewStore(pool)))
	p := newProjector(t, pool)
	path := "/v1/workers/" + w1 + "/assignments"

	p.assign(mbA, w1, domain.RiskClean, 1000)
	p.assign(mbB, w1, domain.RiskQuarantine, 1000)

	resp, b := e.Do(req{Token: readerToken, Method: http.MethodGet, Path: path})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("full: %d %s", resp.StatusCode, b)
	}
	full := apitest.DecodeStrict[workerapi.FullResponse](t, b)
	if !slices.Equal(ids(full.Mailboxes), []string{mbA, mbB}) || full.Mailboxes[1].Band != domain.RiskQuarantine {
		t.Fatalf("full: %s", b)
	}

	p.unassign(mbA, w1)
	p.assign(mbC, w1, domain.RiskClean, 50)

	resp, b = e.Do(req{Token: readerToken, Method: http.MethodGet, Path: path + "?since=" + full.Token})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("changes: %d %s", resp.StatusCode, b)
	}
	ch := apitest.DecodeStrict[workerapi.ChangesResponse](t, b)
	if !slices.Equal(ids(ch.Added), []string{mbC}) || len(ch.Removed) != 1 || ch.Removed[0].MailboxID != mbA ||
		ch.Token != workerapi.TokenAt(4).String() {
		t.Fatalf("changes: %s", b)
	}

	resp, b = e.Do(req{Token: readerToken, Method: http.MethodGet, Path: path + "?since=" + ch.Token})
	if resp.StatusCode != http.StatusOK || string(b) != `{"worker_id":"`+w1+`","full":false,"added":[],"removed":[],"token":"`+ch.Token+`"}`+"\n" {
		t.Fatalf("nothing new: %d %s", resp.StatusCode, b)
	}

	if _, err := postgres.PruneChanges(context.Background(), pool, 3); err != nil {
		t.Fatal(err)
	}
	resp, b = e.Do(req{Token: readerToken, Method: http.MethodGet, Path: path + "?since=" + full.Token})
	if resp.StatusCode != http.StatusGone || apitest.DecodeStrict[api.ErrorResponse](t, b).Error.Code != workerapi.CodeExpired {
		t.Fatalf("after prune: %d %s", resp.StatusCode, b)
	}
	e.assertNothingProduced()
}
