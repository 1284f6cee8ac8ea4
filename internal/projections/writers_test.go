package projections_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/projections"
)

// TestRegistryTransactionsOneAtATime: with two lanes and
// WithSerialWrites, the Registry's batches are prepared side by side but
// written one transaction at a time. A trigger on the applied ids insert, each
// transaction's first write of rows, takes a transaction-level advisory
// lock and holds the transaction a little; a transaction that finds the
// lock taken records an overlap.
func TestRegistryTransactionsOneAtATime(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pool := e.db.Pool
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := pool.Exec(ctx, `
CREATE TABLE tx_overlaps (at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE tx_seen (at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION note_overlap() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO tx_seen DEFAULT VALUES;
	IF NOT pg_try_advisory_xact_lock(hashtextextended('tx_overlaps.' || current_schema(), 0)) THEN
		INSERT INTO tx_overlaps DEFAULT VALUES;
	END IF;
	PERFORM pg_sleep(0.005);
	RETURN NULL;
END $$;
CREATE TRIGGER note_overlap AFTER INSERT ON applied_events FOR EACH STATEMENT EXECUTE FUNCTION note_overlap();`)
	must(t, err)

	g := newGen(15, 1)
	const n = 4000
	evs := make([]domain.Event, n)
	for i := range evs {
		evs[i] = g.added(g.uuid())
	}
	e.produce(evs...)
	p, _ := e.projector(pool, projections.NewRegistry(), projections.WithConcurrency(2), projections.WithBatchSize(100), projections.WithSerialWrites())
	start(t, p)
	waitFor(t, 60*time.Second, "every mailbox projected", func() (bool, error) {
		return count(t, pool, `SELECT count(*) FROM mailboxes`) == n, nil
	})
	// Catching up, transactions grow to four batches.
	if seen := count(t, pool, `SELECT count(*) FROM tx_seen`); seen < n/400 {
		t.Fatalf("%d transactions recorded ids, want at least %d", seen, n/400)
	}
	if got := count(t, pool, `SELECT count(*) FROM tx_overlaps`); got != 0 {
		t.Fatalf("%d registry transactions ran while another was open, want none", got)
	}
}

// TestBatchGrowsWhileCatchingUp: behind by many batches, a projector's
// transactions grow past its batch size, to four batches at most; once it
// has caught up, its batch limit is back to the batch size, and a trickle
// of events is applied in transactions of at most that.
func TestBatchGrowsWhileCatchingUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const batch = 50
	g := newGen(16, 1)
	backlog := make([]domain.Event, 4000)
	for i := range backlog {
		backlog[i] = g.added(g.uuid())
	}
	e.produce(backlog...)
	var mu sync.Mutex
	var sizes []int
	p, reg := e.projector(e.db.Pool, projections.NewRegistry(), projections.WithBatchSize(batch),
		projections.WithCommitted(func(evs []domain.Event) {
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, len(evs))
		}))
	start(t, p)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	mu.Lock()
	largest := slices.Max(sizes)
	sizes = nil
	mu.Unlock()
	if largest <= batch || largest > 4*batch {
		t.Fatalf("catching up, the largest transaction held %d events, want more than %d and at most %d", largest, batch, 4*batch)
	}

	waitFor(t, 10*time.Second, "the batch limit back to the batch size", func() (bool, error) {
		got := counter(t, reg, "mailplane_projector_batch_limit_records", "projector", projections.RegistryName)
		return got == batch, fmt.Errorf("batch limit %v", got)
	})
	for range 3 {
		trickle := make([]domain.Event, 120)
		for i := range trickle {
			trickle[i] = g.added(g.uuid())
		}
		e.produce(trickle...)
		waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, catchUp)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) == 0 || slices.Max(sizes) > batch {
		t.Fatalf("caught up, transactions held %v events, want at most %d each", sizes, batch)
	}
}
