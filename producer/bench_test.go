package producer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/internal/mailplanetest"
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
// beside user.active, without and with the schema validator
// (producer.WithSchema, a second opinion beside the Go validation); then
// the broker limit in the same run: the same mailbox.added records, sealed
// and encoded once, produced with kgo.
//
//	go test ./producer/ -run '^$' -bench PublishType -benchtime 50x
func BenchmarkPublishType(b *testing.B) { benchPublishType(b, 1) }

// BenchmarkPublishTypeConcurrent is BenchmarkPublishType with four
// goroutines publishing at once on one client (and four producing, for the
// limit), so both cores have work while a batch waits for its acks.
//
//	go test ./producer/ -run '^$' -bench PublishTypeConcurrent -benchtime 60x
func BenchmarkPublishTypeConcurrent(b *testing.B) { benchPublishType(b, 4) }

func benchPublishType(b *testing.B, clients int) {
	kc, kcfg := newBroker(b)
	k := testKeyring(b)
	plain := producer.New(kc, producer.WithSealer(k), producer.WithNamespace(kcfg.Namespace))
	schema := producer.New(kc, producer.WithSealer(k), producer.WithSchema(eventschema.Default()), producer.WithNamespace(kcfg.Namespace))
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
		c    *producer.Client
		data func(int) domain.Data
	}{
		{"mailbox.added", plain, added}, {"user.active", plain, active},
		{"mailbox.added+schema", schema, added}, {"user.active+schema", schema, active},
	} {
		b.Run(tc.name, func(b *testing.B) {
			mailplanetest.RunClients(b, clients, benchBatch, func() error {
				// Fresh data each round: Publish seals in place.
				evs := make([]domain.Event, benchBatch)
				for i := range evs {
					evs[i] = tc.c.NewEvent(tc.data(i))
				}
				_, err := tc.c.Publish(ctx, evs...)
				return err
			})
		})
	}
	b.Run("limit/raw-produce", func(b *testing.B) {
		evs := make([]domain.Event, benchBatch)
		for i := range evs {
			evs[i] = plain.NewEvent(added(i))
		}
		recs, err := plain.Prepare(evs)
		if err != nil {
			b.Fatal(err)
		}
		mailplanetest.RunClients(b, clients, benchBatch, func() error {
			batch := make([]*kgo.Record, len(recs))
			for i, r := range recs {
				cp := *r
				batch[i] = &cp
			}
			return kc.ProduceSync(ctx, batch...).FirstErr()
		})
	})
}
