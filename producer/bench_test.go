package producer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
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
