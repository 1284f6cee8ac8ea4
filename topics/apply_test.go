package topics_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/topics"
)

func newAdmin(t *testing.T) (*kgo.Client, *kadm.Client) {
	t.Helper()
	emb, err := kafka.StartEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Close)
	kc, err := kafka.NewClient(kafka.Config{Brokers: emb.Addrs()}, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	return kc, kadm.NewClient(kc)
}

func TestApplyCreatesThenIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kc, _ := newAdmin(t)
	specs := topics.Catalog(topics.Config{StatePartitions: 8})

	rep, err := topics.Apply(ctx, kc, specs)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Created) != len(specs) || len(rep.Drift) != 0 {
		t.Fatalf("first apply: created %d of %d, drift %v", len(rep.Created), len(specs), rep.Drift)
	}
	rep, err = topics.Apply(ctx, kc, specs)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Created) != 0 || len(rep.OK) != len(specs) || rep.Err() != nil {
		t.Fatalf("second apply: created %v ok %d drift %v", rep.Created, len(rep.OK), rep.Drift)
	}
}

func TestApplyReportsDrift(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kc, adm := newAdmin(t)
	// Someone created the state topic by hand with the wrong shape.
	del := "delete"
	if _, err := adm.CreateTopic(ctx, 3, -1, map[string]*string{"cleanup.policy": &del}, topics.MailboxState); err != nil {
		t.Fatal(err)
	}
	rep, err := topics.Apply(ctx, kc, topics.Catalog(topics.Config{StatePartitions: 8}))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Err() == nil {
		t.Fatal("drift not reported")
	}
	fields := map[string]bool{}
	for _, d := range rep.Drift {
		if d.Topic != topics.MailboxState {
			t.Errorf("unexpected drift %s", d)
		}
		fields[d.Field] = true
	}
	if !fields["partitions"] || !fields["cleanup.policy"] {
		t.Fatalf("drift = %v, want partitions and cleanup.policy", rep.Drift)
	}
	// Apply never alters a drifted topic.
	if rep2, _ := topics.Apply(ctx, kc, topics.Catalog(topics.Config{StatePartitions: 8})); len(rep2.Drift) != len(rep.Drift) {
		t.Fatalf("drift changed between applies: %v", rep2.Drift)
	}
}
