package projections_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/projections"
)

// fakeClock is a projector clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// floors returns the partitions' forgotten_below and next_offset.
func floors(t testing.TB, e *env) (below, next map[tp]int64) {
	t.Helper()
	rows, err := e.db.Pool.Query(t.Context(), `SELECT topic, partition, forgotten_below, next_offset FROM projector_offsets WHERE projector = 'registry'`)
	must(t, err)
	defer rows.Close()
	below, next = map[tp]int64{}, map[tp]int64{}
	for rows.Next() {
		var k tp
		var b, n int64
		must(t, rows.Scan(&k.topic, &k.partition, &b, &n))
		below[k], next[k] = b, n
	}
	must(t, rows.Err())
	return below, next
}

func appliedIDs(t testing.TB, e *env, ids ...string) int {
	t.Helper()
	return count(t, e.db.Pool, `SELECT count(*) FROM applied_events WHERE projector = 'registry' AND event_id = ANY($1::uuid[])`, ids)
}

func keys(evs []domain.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Key()
	}
	return out
}

// TestDedupeWindow walks the layered guarantee: a copy inside the window is
// refused by its id; the prune forgets ids only once they are older than
// the window, raising each partition's floor to where it stood; after that
// a record from before the position is refused by position (a new member
// whose Kafka group starts from 0 applies none of it), the position cannot
// be moved below the floor (Seek, or SQL), and a copy produced after the
// window is applied again, as documented.
func TestDedupeWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(151, 40)
	clock := &fakeClock{t: time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)}
	const window = time.Hour
	opts := []projections.Option{projections.WithClock(clock.now), projections.WithDedupeWindow(window)}
	p, reg := e.projector(e.db.Pool, projections.NewRegistry(), opts...)
	stop := start(t, p)

	first := g.events(400)
	e.produce(first...)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	if n := appliedIDs(t, e, keys(first)...); n != len(first) {
		t.Fatalf("applied ids = %d, want %d", n, len(first))
	}

	// Inside the window: a producer's retry (the same event at a new
	// offset) is refused by id.
	e.produce(first[0])
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	if got := settledCounter(t, reg, 1, "mailplane_projector_duplicates_skipped_total", "projector", "registry"); got != 1 {
		t.Fatalf("duplicates skipped = %v, want 1", got)
	}

	// A prune inside the window forgets nothing.
	res, err := p.Prune(t.Context())
	must(t, err)
	if res.IDs != 0 || !res.Before.IsZero() {
		t.Fatalf("prune inside the window: %+v, want nothing forgotten", res)
	}
	clock.add(window / 2)
	res, err = p.Prune(t.Context())
	must(t, err)
	if res.IDs != 0 {
		t.Fatalf("prune at half the window forgot %d ids", res.IDs)
	}

	// Past the window: the marks taken by the first prune are old enough.
	// The ids applied before them (less the slack) go; the floors rise to
	// the positions marked.
	_, wantNext := floors(t, e)
	clock.add(window)
	res, err = p.Prune(t.Context())
	must(t, err)
	if res.IDs != int64(len(first)) {
		t.Fatalf("prune past the window forgot %d ids, want %d (%+v)", res.IDs, len(first), res)
	}
	if n := appliedIDs(t, e, keys(first)...); n != 0 {
		t.Fatalf("%d ids older than the window are still kept", n)
	}
	if got := counter(t, reg, "mailplane_projector_applied_ids_pruned_total", "projector", "registry"); got != float64(len(first)) {
		t.Fatalf("pruned counter = %v, want %d", got, len(first))
	}
	below, next := floors(t, e)
	for k, n := range wantNext {
		if below[k] != n || next[k] != n {
			t.Errorf("%v: forgotten_below %d, next_offset %d; want both %d", k, below[k], next[k], n)
		}
	}
	stop()

	// By position: a new member reads from Postgres's positions, not its
	// (empty) Kafka group: none of the records whose ids are forgotten is
	// applied again.
	p2, reg2 := e.projector(e.db.Pool, projections.NewRegistry(),
		append(opts, projections.WithGroup(withGroupName(testGroup, "after-prune")))...)
	start(t, p2)
	marker := g.event(&domain.UserActive{UserID: g.pick(g.users), Source: domain.ActivityLogin})
	e.produce(marker)
	waitFor(t, catchUp, "marker applied", func() (bool, error) { return appliedIDs(t, e, marker.Key()) == 1, nil })
	if got := settledCounter(t, reg2, 1, "mailplane_projector_records_applied_total", "projector", "registry"); got != 1 {
		t.Fatalf("the new member applied %v events, want only the marker", got)
	}
	if n := appliedIDs(t, e, keys(first)...); n != 0 {
		t.Fatalf("the new member applied %d pruned events again", n)
	}

	// The position cannot go below the floor: Seek refuses, and so does
	// Postgres to an operator's UPDATE.
	var k tp
	for k = range below {
		if below[k] > 0 {
			break
		}
	}
	if _, err := projections.Seek(t.Context(), e.db.Pool, e.kcfg.Namespace, projections.RegistryName, k.topic, k.partition, 0, clock.now()); !errors.Is(err, projections.ErrBelowFloor) {
		t.Fatalf("seek below the floor: %v, want ErrBelowFloor", err)
	}
	_, err = e.db.Pool.Exec(t.Context(), `UPDATE projector_offsets SET next_offset = 0 WHERE projector = 'registry' AND topic = $1 AND partition = $2`, k.topic, k.partition)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23514" {
		t.Fatalf("UPDATE below the floor: %v, want a check violation", err)
	}

	// After the window, a copy is applied again: the window is the
	// promise (dedupe.go).
	e.produce(first[1])
	waitFor(t, catchUp, "late copy applied", func() (bool, error) { return appliedIDs(t, e, first[1].Key()) == 1, nil })
	if got := counter(t, reg2, "mailplane_projector_duplicates_skipped_total", "projector", "registry"); got != 0 {
		t.Fatalf("a copy older than the window was refused: %v", got)
	}
}

// TestDedupeWindowSeekBack: a seek back inside the window re-reads records
// that their ids refuse; if the ids are forgotten before the projector
// re-reads them, the prune raises the position to where it stood before
// the seek, so they are refused by position instead.
func TestDedupeWindowSeekBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(152, 40)
	clock := &fakeClock{t: time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)}
	const window = time.Hour
	opts := []projections.Option{projections.WithClock(clock.now), projections.WithDedupeWindow(window)}
	p, _ := e.projector(e.db.Pool, projections.NewRegistry(), opts...)
	stop := start(t, p)
	evs := g.events(300)
	e.produce(evs...)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	_, before := floors(t, e)

	stop()

	// Inside the window: every partition back to 0 (a running projector
	// notices at its next transaction; a restarted one at once); all
	// re-read, all refused by id.
	for k := range before {
		_, err := projections.Seek(t.Context(), e.db.Pool, e.kcfg.Namespace, projections.RegistryName, k.topic, k.partition, 0, clock.now())
		must(t, err)
	}
	p1, reg1 := e.projector(e.db.Pool, projections.NewRegistry(), opts...)
	stop = start(t, p1)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	if got := settledCounter(t, reg1, float64(len(evs)), "mailplane_projector_duplicates_skipped_total", "projector", "registry"); got != float64(len(evs)) {
		t.Fatalf("re-read after a seek back: %v refused, want %d", got, len(evs))
	}
	stop()

	// Projector stopped; seek back again, then the window passes and the
	// ids go before anyone re-reads.
	for k := range before {
		_, err := projections.Seek(t.Context(), e.db.Pool, e.kcfg.Namespace, projections.RegistryName, k.topic, k.partition, 0, clock.now())
		must(t, err)
	}
	p2, reg2 := e.projector(e.db.Pool, projections.NewRegistry(), opts...)
	for range 3 {
		clock.add(window)
		_, err := p2.Prune(t.Context())
		must(t, err)
	}
	if n := appliedIDs(t, e, keys(evs)...); n != 0 {
		t.Fatalf("%d ids kept past the window", n)
	}
	below, next := floors(t, e)
	for k, n := range before {
		if below[k] != n || next[k] != n {
			t.Errorf("%v: forgotten_below %d, next_offset %d; want both %d (where it stood before the seek)", k, below[k], next[k], n)
		}
	}
	start(t, p2)
	marker := g.event(&domain.UserActive{UserID: g.pick(g.users), Source: domain.ActivityLogin})
	e.produce(marker)
	waitFor(t, catchUp, "marker applied", func() (bool, error) { return appliedIDs(t, e, marker.Key()) == 1, nil })
	if got := settledCounter(t, reg2, 1, "mailplane_projector_records_applied_total", "projector", "registry"); got != 1 {
		t.Fatalf("applied %v events after the prune, want only the marker", got)
	}
	if n := appliedIDs(t, e, keys(evs)...); n != 0 {
		t.Fatalf("%d events seeked over were applied again", n)
	}
}

// TestDedupeWindowPrunesWhileRunning: the projector prunes by itself, on
// the real clock, while it applies.
func TestDedupeWindowPrunesWhileRunning(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGen(153, 40)
	p, reg := e.projector(e.db.Pool, projections.NewRegistry(),
		projections.WithDedupeWindow(time.Second), projections.WithTxTimeout(time.Second))
	start(t, p)
	evs := g.events(500)
	e.produce(evs...)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	waitFor(t, time.Minute, "every id pruned", func() (bool, error) {
		return ctx.Err() == nil && appliedIDs(t, e, keys(evs)...) == 0 &&
			counter(t, reg, "mailplane_projector_applied_ids_pruned_total", "projector", "registry") >= float64(len(evs)), nil
	})
	below, next := floors(t, e)
	var sum int64
	for k := range next {
		if below[k] > next[k] {
			t.Errorf("%v: floor %d above the position %d", k, below[k], next[k])
		}
		sum += below[k]
	}
	if sum == 0 {
		t.Fatal("ids pruned, no floor raised")
	}
}
