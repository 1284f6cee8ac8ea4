package projections_test

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/topics"
)

// poisonReason is a removal reason the registry refuses until the fix: a
// constraint the test adds and then drops, as a migration that was too
// strict and a later one that relaxes it would.
const poisonReason = "closed by the owner (refused until the fix)"

// TestRedriveEndToEnd: a mailbox.removed the registry cannot apply goes to
// the DLQ while the mailbox.state processor folds it; after the fix, a
// redrive hands it back to the registry, which projects it once; the
// redrive is recorded, a second redrive skips it, a forced one is applied
// no second time, and the mailbox.state processor applies none of the
// redriven copies.
func TestRedriveEndToEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool := e.db.Pool
	_, err := pool.Exec(ctx, `ALTER TABLE mailboxes ADD CONSTRAINT redrive_poison CHECK (removal_reason IS DISTINCT FROM '`+poisonReason+`')`)
	must(t, err)

	p, reg := e.projector(pool, projections.NewRegistry(),
		projections.WithRetry(projections.RetryPolicy{Attempts: 2, Backoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}))
	start(t, p)
	stateReg := prometheus.NewRegistry()
	proc, err := mailboxstate.New(e.kcfg, mailboxstate.WithGroup(testGroup), mailboxstate.WithRegisterer(stateReg), mailboxstate.WithLogger(mailplanetest.Logger(t)))
	must(t, err)
	stateCtx, stopState := context.WithCancel(ctx)
	stateDone := make(chan error, 1)
	go func() { stateDone <- proc.Run(stateCtx) }()
	t.Cleanup(func() {
		stopState()
		if err := <-stateDone; err != nil {
			t.Errorf("mailbox.state processor: %v", err)
		}
	})

	g := newGen(11, 4)
	mb := g.mailboxes[0]
	removed := g.event(&domain.MailboxRemoved{MailboxID: mb, Reason: poisonReason})
	e.produce(g.added(mb), removed, g.added(g.mailboxes[1]))

	var dead dlq.Entry
	waitFor(t, time.Minute, "the removal in the DLQ", func() (bool, error) {
		entries, err := dlq.List(ctx, e.kcfg, 0)
		for _, en := range entries {
			if en.Consumer == projections.RegistryName && string(en.Key) == mb {
				dead = en
				return true, nil
			}
		}
		return false, err
	})
	if dead.ErrorCode != domain.CodeInvalid || dead.ValueWithheld != "" {
		t.Fatalf("dead letter: code %s, withheld %q", dead.ErrorCode, dead.ValueWithheld)
	}
	waitCaughtUp(t, e.kcfg, pool, projections.RegistryName, topics.DomainTopics(), time.Minute)
	stateCount := func(outcome string) float64 {
		return counter(t, stateReg, "mailplane_mailbox_state_records_total", "outcome", outcome)
	}
	waitFor(t, time.Minute, "the mailbox.state processor to fold the removal", func() (bool, error) { return stateCount("tombstoned") == 1, nil })
	if n := count(t, pool, `SELECT count(*) FROM mailboxes WHERE mailbox_id = $1 AND removed_at IS NULL`, mb); n != 1 {
		t.Fatalf("before the fix the mailbox must be projected without its removal; rows: %d", n)
	}

	// The fix.
	_, err = pool.Exec(ctx, `ALTER TABLE mailboxes DROP CONSTRAINT redrive_poison`)
	must(t, err)

	ops := &domain.Caller{Name: "test-ops", Scopes: []string{domain.ScopeOps}, Source: "/ops"}
	redriveReg := prometheus.NewRegistry()
	metrics := dlq.NewRedriveMetrics(redriveReg)
	sel := dlq.Selection{Consumer: projections.RegistryName, Code: dead.ErrorCode, FromOffset: &dead.Offset, ToOffset: &dead.Offset}

	dry := sel
	dry.DryRun = true
	rep, err := dlq.Redrive(ctx, e.kcfg, pool, ops, dry)
	must(t, err)
	if rep.Count(dlq.OutcomeWouldRedrive) != 1 || len(rep.Items) != 1 || rep.RedriveID != "" {
		t.Fatalf("dry run: %+v", rep)
	}
	if n := count(t, pool, `SELECT count(*) FROM dlq_redrives`); n != 0 {
		t.Fatalf("a dry run recorded %d redrives", n)
	}

	rep, err = dlq.Redrive(ctx, e.kcfg, pool, ops, sel, dlq.WithRedriveMetrics(metrics))
	must(t, err)
	if rep.Count(dlq.OutcomeRedriven) != 1 || len(rep.Items) != 1 {
		t.Fatalf("redrive: %+v", rep)
	}
	first := rep.Items[0]
	if first.Entry.Offset != dead.Offset || first.Offset <= dead.SourceOffset || first.RedriveID != rep.RedriveID {
		t.Fatalf("redriven item: %+v (dead letter at %d, source offset %d)", first, dead.Offset, dead.SourceOffset)
	}

	// Projected once: the removal, and its event key applied once.
	waitFor(t, time.Minute, "the redriven removal projected", func() (bool, error) {
		return count(t, pool, `SELECT count(*) FROM mailboxes WHERE mailbox_id = $1 AND removal_reason = $2 AND removed_at = $3`,
			mb, poisonReason, removed.Time) == 1, nil
	})
	if n := count(t, pool, `SELECT count(*) FROM applied_events WHERE projector = $1 AND event_id = $2`, projections.RegistryName, removed.Key()); n != 1 {
		t.Fatalf("the removal's key is recorded %d times", n)
	}

	// Recorded: who, which, where it landed.
	var (
		state, actor, consumer, code, topic string
		partition                           int32
		landed                              int64
	)
	must(t, pool.QueryRow(ctx, `SELECT state, actor, consumer, error_code, source_topic, source_partition, redriven_offset
FROM dlq_redrives WHERE dlq_partition = $1 AND dlq_offset = $2 AND redrive_id = $3`, dead.Partition, dead.Offset, rep.RedriveID).
		Scan(&state, &actor, &consumer, &code, &topic, &partition, &landed))
	if state != "done" || actor != "test-ops" || consumer != projections.RegistryName || code != string(dead.ErrorCode) ||
		topic != e.kcfg.Topic(topics.MailboxEvents) || partition != dead.SourcePartition || landed != first.Offset {
		t.Fatalf("recorded: %s %s %s %s %s/%d@%d; want done test-ops registry %s %s/%d@%d", state, actor, consumer, code, topic, partition, landed,
			dead.ErrorCode, topics.MailboxEvents, dead.SourcePartition, first.Offset)
	}
	redrives, err := dlq.Redrives(ctx, pool, []dlq.Entry{dead})
	must(t, err)
	if r, ok := redrives[dlq.Location{Partition: dead.Partition, Offset: dead.Offset}]; !ok || !r.Done || r.Offset != first.Offset {
		t.Fatalf("Redrives: %+v", redrives)
	}
	var table bytes.Buffer
	must(t, dlq.Format(&table, []dlq.Entry{dead}, redrives))
	if !bytes.Contains(table.Bytes(), []byte("REDRIVEN")) || !bytes.Contains(table.Bytes(), []byte("yes @"+strconv.FormatInt(first.Offset, 10)+" ")) {
		t.Errorf("dlq list table does not show the redrive:\n%s", table.String())
	}

	// A second redrive skips it.
	rep, err = dlq.Redrive(ctx, e.kcfg, pool, ops, sel, dlq.WithRedriveMetrics(metrics))
	must(t, err)
	if rep.Count(dlq.OutcomeSkipped) != 1 || rep.Count(dlq.OutcomeRedriven) != 0 || rep.Items[0].Code != domain.CodeAlreadyRedriven {
		t.Fatalf("second redrive: %+v", rep)
	}

	// Forced again: appended, recorded, and still applied once.
	again := sel
	again.Again = true
	rep, err = dlq.Redrive(ctx, e.kcfg, pool, ops, again, dlq.WithRedriveMetrics(metrics))
	must(t, err)
	if rep.Count(dlq.OutcomeRedriven) != 1 {
		t.Fatalf("redrive --again: %+v", rep)
	}
	if got := settledCounter(t, reg, 1, "mailplane_projector_duplicates_skipped_total", "projector", projections.RegistryName); got != 1 {
		t.Fatalf("the projector skipped %v duplicates; want the forced copy", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM dlq_redrives WHERE dlq_offset = $1 AND state = 'done'`, dead.Offset); n != 2 {
		t.Fatalf("%d redrives recorded; want 2", n)
	}
	if got := counter(t, redriveReg, "mailplane_dlq_redriven_total", "consumer", projections.RegistryName, "code", string(dead.ErrorCode)); got != 2 {
		t.Fatalf("mailplane_dlq_redriven_total = %v; want 2", got)
	}

	// The mailbox.state processor read both copies and applied neither.
	waitFor(t, time.Minute, "the mailbox.state processor to pass the redriven copies", func() (bool, error) {
		return stateCount("other_consumer") == 2, nil
	})
	if tomb, dup := stateCount("tombstoned"), stateCount("duplicate"); tomb != 1 || dup != 0 {
		t.Fatalf("mailbox.state processor: tombstoned %v, duplicate %v; want 1 and 0", tomb, dup)
	}
}
