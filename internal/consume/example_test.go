package consume_test

import (
	"context"
	"log"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/consume"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

// A group consumer with an in-memory effect: the declaration (source,
// policies) and the handler are all it writes.
func ExampleNew() {
	kcfg := kafka.Config{Brokers: []string{"localhost:9092"}}
	reg := prometheus.NewRegistry()
	handle := func(_ context.Context, b *consume.Batch) error {
		for _, r := range b.Records {
			log.Printf("%s/%d@%d (partition end %d)", r.Topic, r.Partition, r.Offset, b.End(r.Topic, r.Partition))
		}
		return nil
	}
	c, err := consume.New(kcfg, string(sla.Registry),
		consume.Group(kafka.GroupConfig{Group: kcfg.Group("example"), Topics: []string{kcfg.Topic(topics.MailboxEvents)}}),
		handle,
		consume.Metered(sla.NewMeter(reg, sla.Registry)),
		consume.SkipRedriven(string(sla.Registry)),
		consume.WithPollWait(time.Second),
		consume.WithRegisterer(reg))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// A Kafka-transactional group consumer: its effect is records produced in
// a transaction carrying the input offsets; an abort makes the session
// poll the records again.
func ExampleBatch_Transact() {
	kcfg := kafka.Config{Brokers: []string{"localhost:9092"}}
	handle := func(ctx context.Context, b *consume.Batch) error {
		if len(b.Records) == 0 {
			return nil // a tick, say
		}
		_, err := b.Transact(ctx, func(ctx context.Context) error {
			out := &kgo.Record{Topic: kcfg.Topic(topics.MailboxState), Value: b.Records[0].Value}
			return b.Consumer().Client().ProduceSync(ctx, out).FirstErr()
		})
		return err // ends Run: the caller starts a new session after a backoff
	}
	c, err := consume.New(kcfg, string(sla.MailboxState),
		consume.TransactGroup(kafka.GroupConfig{Group: kcfg.Group("example-state"), Topics: []string{kcfg.Topic(topics.MailboxEvents)}}),
		handle,
		consume.WithKgoOptions(kgo.TransactionalID(kcfg.TransactionalID("example-state"))),
		consume.OnAssigned(func(ctx context.Context, c *consume.Consumer, _ map[string][]int32) {
			// Fence the previous owner before anything is read.
			if _, _, err := c.Client().ProducerID(ctx); err != nil {
				log.Print(err)
			}
		}))
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(context.Background()); err != nil {
		log.Print(err)
	}
}
