package mailboxstate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/topics"
)

// TestSkipsRecordsRedrivenForOthers: a mailbox.added redriven from the DLQ
// for another consumer (the registry) is not folded, yet its offset is
// committed with the batch and counted as other_consumer; one redriven for
// the processor itself is folded.
func TestSkipsRecordsRedrivenForOthers(t *testing.T) {
	t.Parallel()
	kcfg := broker(t)
	g := newGen(31)
	other, mine, plain := g.added(g.uuid()), g.added(g.uuid()), g.added(g.uuid())
	redriven := func(e domain.Event, consumer string) domain.Event {
		src := encode(t, e)[0]
		dead := dlq.Parse(dlq.NewRecord(kcfg.Namespace, src, dlq.Failure{Consumer: consumer, Code: domain.CodeInvalid, Err: "check violation", Attempts: 3}))
		produce(t, kcfg, dlq.RedriveRecord(dead, domain.NewEventID()))
		return e
	}
	redriven(other, "registry")
	redriven(mine, mailboxstate.ConsumerName)
	produce(t, kcfg, encode(t, plain)...)
	reg := prometheus.NewRegistry()
	start(t, kcfg, mailboxstate.WithRegisterer(reg))
	waitConsumed(t, kcfg)
	ids, _ := history(t, kcfg)
	if got := ids[other.Subject]; len(got) != 0 {
		t.Errorf("the mailbox redriven for the registry has state records %v", got)
	}
	for _, e := range []domain.Event{mine, plain} {
		if got := ids[e.Subject]; len(got) != 1 || got[0] != e.ID {
			t.Errorf("%s: state records from %v, want [%s]", e.Subject, got, e.ID)
		}
	}
	if n := counter(t, reg, "mailplane_mailbox_state_records_total", "other_consumer"); n != 1 {
		t.Errorf("other_consumer records %v, want 1", n)
	}
	if n := counter(t, reg, "mailplane_mailbox_state_records_total", "upserted"); n != 2 {
		t.Errorf("upserted records %v, want 2", n)
	}
}

// TestFencedRunReturnsErrFenced: a second processor started with the same
// transactional id fences the first: the first's next transaction is
// refused and its Run returns ErrFenced instead of folding on.
func TestFencedRunReturnsErrFenced(t *testing.T) {
	t.Parallel()
	kcfg := broker(t)
	g := newGen(37)
	p1, err := mailboxstate.New(kcfg, mailboxstate.WithGroup(testGroup))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- p1.Run(ctx) }()
	produce(t, kcfg, encode(t, g.added(g.uuid()))...)
	waitConsumed(t, kcfg)

	// The usurper reads in a group of its own: it folds (and so fences)
	// without taking the first one's partitions.
	usurper := testGroup
	usurper.Group = "mailplane-mailbox-state-usurper"
	start(t, kcfg, mailboxstate.WithGroup(usurper))
	waitCommitted(t, kcfg, topics.MailboxState, 2) // the usurper's copy of the first fold
	produce(t, kcfg, encode(t, g.added(g.uuid()))...)
	select {
	case err := <-errc:
		if !errors.Is(err, mailboxstate.ErrFenced) {
			t.Fatalf("Run of the fenced processor: %v, want ErrFenced", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the fenced processor did not stop")
	}
}
