package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/topics"
)

// TestPlacementProjectorPassesLegacyHostileText: a decision written before
// the text rule (issue 9: a worker_registered whose address ends in NUL,
// which Postgres text cannot hold) no longer stalls the projection: it is
// read with the text cleaned, like every reader of the log reads it, and the
// projection reaches the end of the log.
func TestPlacementProjectorPassesLegacyHostileText(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 4)
	kcfg.ClientID = "placement-projector-test"
	brokers := kcfg.Brokers
	db := newDB(t)
	worker := workerID(1)
	reg := &domain.PlacementWorkerRegistered{
		PlacementMeta: domain.PlacementMeta{At: t0, Reason: domain.ReasonWorkerRegistered},
		WorkerID:      worker, Tier: domain.TierSharedPremium, Egress: domain.EgressColdSMTP, Address: "10.0.0.1:25", Capacity: 16,
	}
	r, err := topics.EncodeDecision(topics.Decision{ID: domain.NewEventID(), Source: "test", Data: reg,
		Cause: topics.Cause{ID: topics.CauseTick, Type: topics.CauseTick, Index: 0, Count: 1}})
	if err != nil {
		t.Fatal(err)
	}
	legacy := strings.Replace(string(r.Value), `"10.0.0.1:25"`, `"10.0.0.1:25\u0000\r\n\u202e"`, 1)
	if legacy == string(r.Value) {
		t.Fatal("the address was not replaced")
	}
	r.Value = []byte(legacy)
	cl, err := kafka.NewClient(kafka.Config{Brokers: brokers}, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), kafkatest.InNamespace(kcfg, r)...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// A later heartbeat of the same worker, decided by a fixed engine.
	produce(t, kcfg, []domain.PlacementDecision{&domain.PlacementWorkerChanged{
		PlacementMeta: domain.PlacementMeta{At: t0.Add(time.Second), Reason: domain.ReasonHeartbeat},
		WorkerID:      worker, Tier: domain.TierSharedPremium, Egress: domain.EgressColdSMTP, Address: "10.0.0.2:25", Capacity: 16,
	}})
	startProjector(t, kcfg, db.Pool, postgres.WithCommitted(func(c postgres.Commit) {
		for _, rec := range c.Records {
			if d, ok := rec.Decision.Data.(*domain.PlacementWorkerRegistered); ok && d.Address != "10.0.0.1:25\uFFFD\uFFFD\uFFFD\uFFFD" {
				t.Errorf("legacy address read as %+q", d.Address)
			}
		}
	}))
	waitCheckpoint(t, db.Pool, 2)
	var got string
	if err := db.Pool.QueryRow(context.Background(), `SELECT address FROM placement_workers WHERE worker_id = $1`, worker).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != "10.0.0.2:25" {
		t.Errorf("address %+q after the later heartbeat", got)
	}
	if err := postgres.CheckInvariants(context.Background(), db.Pool); err != nil {
		t.Fatal(err)
	}
}
