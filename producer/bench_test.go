package producer_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// benchEvents returns n user.active events over distinct users, the
// smallest real event, so the figure measures the client, not JSON size.
func benchEvents(c *producer.Client, n int) []domain.Event {
	evs := make([]domain.Event, n)
	for i := range evs {
		evs[i] = c.NewEvent(&domain.UserActive{UserID: fmt.Sprintf("0190a5b2-0000-7000-8000-%012x", i), Source: domain.ActivityWSPing})
	}
	return evs
}

const benchBatch = 1000

// BenchmarkPublish measures the typed client (validate, encode, produce with
// acks=all, wait) in batches of 1000. Compare with BenchmarkRawProduce.
func BenchmarkPublish(b *testing.B) {
	kc, kcfg := newBroker(b)
	c := producer.New(kc, producer.WithNamespace(kcfg.Namespace))
	evs := benchEvents(c, benchBatch)
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := c.Publish(ctx, evs...); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*benchBatch)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkRawProduce produces the same records, pre-encoded, straight
// through kgo: the broker limit the typed client is compared against.
func BenchmarkRawProduce(b *testing.B) {
	kc, kcfg := newBroker(b)
	c := producer.New(kc, producer.WithNamespace(kcfg.Namespace))
	evs := benchEvents(c, benchBatch)
	recs := make([]*kgo.Record, len(evs))
	for i, e := range evs {
		r, err := topics.Encode(e)
		if err != nil {
			b.Fatal(err)
		}
		recs[i] = r
	}
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		for _, r := range recs {
			r.Partition, r.Offset = 0, 0
		}
		if err := kc.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*benchBatch)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkPublishType measures the typed client per event type in batches
// of 1,000: mailbox.added with plain credentials (sealed by the client)
// beside user.active, both with the schema validator as the CLI's
// publish wires it; then the broker limit in the same run: the same
// mailbox.added records, sealed and encoded once, produced with kgo.
//
//	go test ./producer/ -run '^$' -bench PublishType -benchtime 50x
func BenchmarkPublishType(b *testing.B) {
	kc, kcfg := newBroker(b)
	k := testKeyring(b)
	c := producer.New(kc, producer.WithSealer(k), producer.WithSchema(eventschema.Default()), producer.WithNamespace(kcfg.Namespace))
	added := func(i int) domain.Data {
		m := mailboxAdded()
		m.MailboxID = fmt.Sprintf("0190a5b2-0000-7000-8000-%012x", i)
		return &m
	}
	active := func(i int) domain.Data {
		return &domain.UserActive{UserID: fmt.Sprintf("0190a5b2-0000-7000-8000-%012x", i), Source: domain.ActivityWSPing}
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		data func(int) domain.Data
	}{{"mailbox.added", added}, {"user.active", active}} {
		b.Run(tc.name, func(b *testing.B) {
			cpu := cpuClock()
			for b.Loop() {
				// Fresh data each round: Publish seals in place.
				evs := make([]domain.Event, benchBatch)
				for i := range evs {
					evs[i] = c.NewEvent(tc.data(i))
				}
				if _, err := c.Publish(ctx, evs...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(float64((cpuClock()-cpu).Microseconds())/float64(b.N*benchBatch), "cpu-us/event")
		})
	}
	b.Run("limit/raw-produce", func(b *testing.B) {
		evs := make([]domain.Event, benchBatch)
		for i := range evs {
			evs[i] = c.NewEvent(added(i))
		}
		recs, err := c.Prepare(evs)
		if err != nil {
			b.Fatal(err)
		}
		cpu := cpuClock()
		for b.Loop() {
			batch := make([]*kgo.Record, len(recs))
			for i, r := range recs {
				cp := *r
				batch[i] = &cp
			}
			if err := kc.ProduceSync(ctx, batch...).FirstErr(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "events/s")
		b.ReportMetric(float64((cpuClock()-cpu).Microseconds())/float64(b.N*benchBatch), "cpu-us/event")
	})
}

// cpuClock reads the process's CPU time (user and system): on a shared
// machine, CPU per event is the figure contention disturbs least (the
// client, the server and the in-process broker all count).
func cpuClock() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
