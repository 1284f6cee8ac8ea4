package consume_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/consume"
	"github.com/mailplane/mailplane/internal/sla"
)

// TestMeteredByEffect: a consumer whose effect keeps its own position is
// metered where its effect stands, as its handler reports, not where the
// fetch got to; reports on partitions it does not own, and after Run
// ended, are ignored; Run's end forgets every partition.
func TestMeteredByEffect(t *testing.T) {
	t.Parallel()
	kcfg := cluster(t, 2)
	produce(t, kcfg, 0, "a", "b", "c")
	reg := prometheus.NewRegistry()
	meter := sla.NewMeter(reg, sla.Registry)
	handled := make(chan struct{}, 1)
	c, err := consume.New(kcfg, string(sla.Registry), consume.Group(group("effect")), func(_ context.Context, b *consume.Batch) error {
		if len(b.Records) == 0 {
			return nil
		}
		// The effect made all but the last record durable.
		last := b.Records[len(b.Records)-1]
		b.Consumer().Position(topic, last.Partition, sla.Position{Next: last.Offset, End: b.End(topic, last.Partition)})
		// Partition 5 is not ours: nothing to report.
		b.Consumer().Position(topic, 5, sla.Position{Next: 0, End: 9})
		select {
		case handled <- struct{}{}:
		default:
		}
		return nil
	}, consume.MeteredByEffect(meter), consume.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	eventually(t, "the effect's position reported", func() bool { v, ok := lag(t, reg, 0); return ok && v == 1 })
	<-handled
	if _, ok := lag(t, reg, 1); ok {
		t.Fatal("a partition the effect did not report is metered (from the fetch?)")
	}
	if v, ok := lag(t, reg, 5); ok {
		t.Fatalf("a partition the consumer does not own is metered: %v", v)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if v, ok := lag(t, reg, 0); ok {
		t.Fatalf("a partition still reported after Run ended: %v", v)
	}
	c.Position(topic, 0, sla.Position{Next: 0, End: 3})
	if v, ok := lag(t, reg, 0); ok {
		t.Fatalf("a report after Run ended is metered: %v", v)
	}
}

// TestMeteredByEffectPartitions: a consumer of assigned partitions (no
// group) is metered at what it reports, from its first handler call on,
// and forgets it when Run ends.
func TestMeteredByEffectPartitions(t *testing.T) {
	t.Parallel()
	kcfg := cluster(t, 1)
	produce(t, kcfg, 0, "a", "b")
	reg := prometheus.NewRegistry()
	meter := sla.NewMeter(reg, sla.Registry)
	c, err := consume.New(kcfg, string(sla.Registry), consume.Partitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}),
		func(_ context.Context, b *consume.Batch) error {
			if end := b.End(topic, 0); end >= 0 {
				// Nothing made durable yet.
				b.Consumer().Position(topic, 0, sla.Position{Next: 0, End: end})
			}
			return nil
		}, consume.MeteredByEffect(meter), consume.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	eventually(t, "the effect's position reported", func() bool { v, ok := lag(t, reg, 0); return ok && v == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if v, ok := lag(t, reg, 0); ok {
		t.Fatalf("a partition still reported after Run ended: %v", v)
	}
}
