package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/placement/postgres"
)

// TestPlacementProjectorRetriesAFailedCommit: while the database refuses
// the projector's commits, it retries the batch with backoff, counting
// each failure and showing the lag; once the database takes them, every
// decision is applied exactly once and the projection restores to the
// engine's state.
func TestPlacementProjectorRetriesAFailedCommit(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 4)
	kcfg.ClientID = "placement-projector-retry-test"
	db := newDB(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
CREATE TABLE refuse_commits (refuse bool);
INSERT INTO refuse_commits VALUES (true);
CREATE FUNCTION refuse_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM refuse_commits) THEN
		RAISE EXCEPTION 'commits refused by the test' USING ERRCODE = '40001';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER refuse_checkpoint BEFORE INSERT OR UPDATE ON placement_checkpoint
	FOR EACH ROW EXECUTE FUNCTION refuse_checkpoint();`); err != nil {
		t.Fatal(err)
	}

	st := placement.NewState(testConfig)
	g := newInputGen(7)
	now := t0
	var ds []domain.PlacementDecision
	for len(ds) < 100 {
		ds = append(ds, st.Apply(g.next(&now))...)
	}
	produce(t, kcfg, ds)

	var mu sync.Mutex
	committed := 0
	reg := prometheus.NewRegistry()
	startProjector(t, kcfg, db.Pool, postgres.WithRegisterer(reg), postgres.WithCommitted(func(c postgres.Commit) {
		mu.Lock()
		committed += c.Decisions
		mu.Unlock()
	}))
	deadline := time.Now().Add(15 * time.Second)
	for metric(t, reg, "mailplane_projector_retries_total", map[string]string{"projector": "placement", "kind": "transient"}) < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the projector did not retry the refused commit")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if lag := metric(t, reg, "mailplane_consumer_lag_records", map[string]string{"consumer": "placement-projection", "partition": "0"}); lag != float64(len(ds)) {
		t.Errorf("lag %v while every commit is refused, want %d", lag, len(ds))
	}
	if _, err := db.Pool.Exec(ctx, `DELETE FROM refuse_commits`); err != nil {
		t.Fatal(err)
	}
	waitCheckpoint(t, db.Pool, int64(len(ds)))
	mu.Lock()
	if committed != len(ds) {
		t.Errorf("decisions committed: %d, want %d", committed, len(ds))
	}
	mu.Unlock()
	st2, _ := restored(t, db.Pool)
	if a, b := toJSON(st2.Snapshot()), toJSON(st.Snapshot()); a != b {
		t.Fatalf("the projection restores to\n%s\nthe decider's state is\n%s", a, b)
	}
	deadline = time.Now().Add(10 * time.Second)
	for metric(t, reg, "mailplane_consumer_lag_records", map[string]string{"consumer": "placement-projection", "partition": "0"}) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the lag did not come down once the commits went through")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
