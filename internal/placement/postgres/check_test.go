package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/topics"
)

// TestCheckPlacementInvariantsDeadWorkers: a projection where a worker
// died (its mailbox moved) and another was forgotten passes the checks,
// and a dead worker row that carries mailboxes is reported.
func TestCheckPlacementInvariantsDeadWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	// (Two of three silent would hold liveness: here they must die.)
	st := placement.NewState(placement.Config{HeartbeatInterval: 10 * time.Second, WorkerRetention: time.Hour, LivenessHoldMinWorkers: 1 << 30})
	at := t0
	var recs []postgres.Record
	apply := func(ev domain.Data) {
		for _, d := range st.Apply(placement.Input{At: at, Event: ev}) {
			recs = append(recs, postgres.Record{Offset: int64(len(recs)), Decision: topics.Decision{ID: uuid.Must(uuid.NewV7()).String(), Data: d}})
		}
	}
	hb := func(i int) {
		apply(&domain.WorkerHeartbeat{WorkerID: workerID(i), Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP})
	}
	hb(1)
	hb(2)
	hb(3)
	apply(&domain.MailboxAdded{MailboxID: mailboxID(1), OrgID: orgID(1), UserID: orgID(1), Address: "a@b.c", Provider: domain.ProviderSMTPIMAP})
	at = at.Add(40 * time.Minute)
	hb(2)
	apply(nil) // 1 and 3 die; the mailbox moves to 2
	at = at.Add(40 * time.Minute)
	hb(2)
	hb(3)      // 3 revives
	apply(nil) // 1 is forgotten
	if _, ok := st.Worker(workerID(1)); ok {
		t.Fatal("worker 1 not forgotten")
	}
	applyRecords(t, db.Pool, recs, int64(len(recs)))
	if err := postgres.CheckInvariants(ctx, db.Pool); err != nil {
		t.Fatalf("a consistent projection: %v", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM placement_workers WHERE worker_id = $1`, workerID(1)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the forgotten worker has %d rows (%v)", n, err)
	}

	// Worker 3 dies again; then its row claims the mailbox.
	at = at.Add(40 * time.Minute)
	hb(2)
	from := len(recs)
	apply(nil)
	applyRecords(t, db.Pool, recs[from:], int64(len(recs)))
	if _, err := db.Pool.Exec(ctx, `UPDATE placement_mailboxes SET worker_id = $1 WHERE mailbox_id = $2`, workerID(3), mailboxID(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE placement_workers SET mailboxes = 1 - mailboxes, load_milli = 1000 - load_milli`); err != nil {
		t.Fatal(err)
	}
	err := postgres.CheckInvariants(ctx, db.Pool)
	if err == nil || !strings.Contains(err.Error(), "dead worker "+workerID(3)+" carries 1 mailboxes") {
		t.Fatalf("a dead worker carrying a mailbox: %v", err)
	}
}
