package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/applyonce"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/internal/rebuild"
)

// refusing is the registry refusing the events of refused, as a projection
// refuses what it cannot apply.
type refusing struct {
	projections.Projection
	refused []string // event ids
}

func (p refusing) Apply(ctx context.Context, tx pgx.Tx, recs []projections.Record) error {
	for _, r := range recs {
		if slices.Contains(p.refused, r.Event.ID) {
			return applyonce.Permanent(domain.CodeConflict, fmt.Errorf("refused event %s", r.Event.ID))
		}
	}
	return p.Projection.Apply(ctx, tx, recs)
}

// TestRebuildPassesPoison: a record that does not decode and an event the
// projection refuses, in the middle of the log, go to the DLQ from the
// live projector and are passed by the rebuild, which finds the refused
// one by the projector's own poison path: the rebuild counts both as
// poison and equals the live projection.
func TestRebuildPassesPoison(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newEnv(t)
	g := newGen(11)
	evs := g.registry(60)
	bad := g.added(id(2, 99)) // a mailbox no later event names
	proj := refusing{Projection: projections.NewRegistry(), refused: []string{bad.ID}}
	e.produce(evs[:30]...)
	e.produce(bad)
	topic := proj.Topics()[0]
	undecodable := &kgo.Record{Topic: topic, Key: []byte(id(2, 3)), Value: []byte(`{not json`), Timestamp: g.t0}
	if err := e.prod.ProduceSync(ctx, kafkatest.InNamespace(e.kcfg, undecodable)...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	e.produce(evs[30:]...)

	p, err := projections.New(e.kcfg, e.db.Pool, proj,
		projections.WithGroup(kafka.GroupConfig{SessionTimeout: kafkatest.SessionTimeout(2 * time.Second), HeartbeatInterval: 200 * time.Millisecond}),
		projections.WithRetry(projections.RetryPolicy{Attempts: 2, Backoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}),
		projections.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	live, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(live) }()
	defer func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("live projector: %v", err)
		}
	}()
	e.waitLive(proj.Name(), proj.Topics())
	entries, err := dlq.List(ctx, e.kcfg, 0)
	if err != nil || len(entries) != 2 {
		t.Fatalf("the live projector dead-lettered %d records (%v), want 2", len(entries), err)
	}

	spec := rebuild.RegistrySpec()
	spec.Projection = proj
	rb, err := rebuild.Start(ctx, spec, rebuild.Config{Kafka: e.kcfg, Live: e.db.Pool, Schema: e.db.Schema + "_registry_7"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		rb.Close()
		_ = rebuild.Drop(context.Background(), e.db.Pool, rb.Schema())
	}()
	if rb.Poison() != 2 || rb.Records() == 0 {
		t.Errorf("the rebuild passed %d records as poison and applied %d, want 2 and the rest", rb.Poison(), rb.Records())
	}
	if n := e.count(`SELECT count(*) FROM `+pgx.Identifier{rb.Schema(), "mailboxes"}.Sanitize()+` WHERE mailbox_id = $1`, id(2, 99)); n != 0 {
		t.Error("the rebuild applied the refused event")
	}
	rep, err := rb.Verify(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Equal() {
		t.Fatalf("rebuild differs from live: %+v", rep)
	}
}
