package consume_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/consume"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/sla"
)

// TestTransactAbortRedelivers: a TransactGroup consumer's batch is handled
// in a Kafka transaction with its input offsets. The first transaction
// aborts (the handler's effect fails after producing): its output never
// shows to read_committed readers, its input offsets are not committed,
// and the session polls the same records again; the second commits, with
// the offsets.
func TestTransactAbortRedelivers(t *testing.T) {
	t.Parallel()
	kcfg := cluster(t, 1)
	produce(t, kcfg, 0, "a", "b")
	var mu sync.Mutex
	var handled [][]string
	var committed []bool
	var fenced bool // the producer id was taken on assignment, before any record
	fail := errors.New("effect failed")
	h := func(ctx context.Context, b *consume.Batch) error {
		if len(b.Records) == 0 {
			return nil
		}
		mu.Lock()
		if !fenced {
			t.Error("records handled before the assignment's fence")
		}
		attempt := len(handled)
		var vs []string
		for _, r := range b.Records {
			vs = append(vs, string(r.Value))
		}
		handled = append(handled, vs)
		mu.Unlock()
		ok, err := b.Transact(ctx, func(ctx context.Context) error {
			for _, r := range b.Records {
				out := &kgo.Record{Topic: topic + "-out", Partition: 0, Value: append([]byte(nil), r.Value...)}
				if err := b.Consumer().Client().ProduceSync(ctx, out).FirstErr(); err != nil {
					return err
				}
			}
			if attempt == 0 {
				return fail
			}
			return nil
		})
		if attempt == 0 {
			if !errors.Is(err, fail) || ok {
				t.Errorf("the aborted transaction: committed %v, err %v", ok, err)
			}
			// The effect's failure is the consumer's to judge: here it
			// goes on, and the session polls the batch again.
			err = nil
		}
		mu.Lock()
		committed = append(committed, ok)
		mu.Unlock()
		return err
	}
	// The meter is read before each poll: after the abort, the batch's
	// partition must still be held at its first record.
	reg := prometheus.NewRegistry()
	var afterAbort []float64
	wait := func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		if len(committed) == 1 && len(afterAbort) == 0 {
			v, _ := lag(t, reg, 0)
			afterAbort = append(afterAbort, v)
		}
		return 100 * time.Millisecond
	}
	g := group("txn")
	c, err := consume.New(kcfg, "transactor", consume.TransactGroup(g), h,
		consume.Metered(sla.NewMeter(reg, sla.MailboxState)), consume.WithRegisterer(reg), consume.WithWait(wait),
		consume.WithKgoOptions(
			kgo.TransactionalID("consume-test-txn"), kgo.TransactionTimeout(10*time.Second),
			kgo.RecordPartitioner(kgo.ManualPartitioner())),
		// Fence the previous owner as the placement engine does: its
		// producer id, on assignment, before offsets are fetched.
		consume.OnAssigned(func(ctx context.Context, c *consume.Consumer, m map[string][]int32) {
			if len(m) == 0 {
				return
			}
			if _, _, err := c.Session().Client().ProducerID(ctx); err != nil {
				t.Errorf("producer id on assignment: %v", err)
				return
			}
			mu.Lock()
			fenced = true
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Session() == nil {
		t.Fatal("a TransactGroup consumer without a session")
	}
	stop := run(t, c)
	eventually(t, "a committed transaction", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(committed) > 0 && committed[len(committed)-1]
	})
	eventually(t, "the meter caught up after the commit", func() bool { v, ok := lag(t, reg, 0); return ok && v == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(afterAbort) != 1 || afterAbort[0] != 2 {
		t.Fatalf("lag after the aborted transaction: %v, want the batch's 2 records held", afterAbort)
	}
	if len(handled) < 2 || !slices.Equal(handled[0], []string{"a", "b"}) || !slices.Equal(handled[len(handled)-1], []string{"a", "b"}) {
		t.Fatalf("batches handled: %v; want the aborted batch polled again", handled)
	}
	mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []string
	if _, err := kafka.ReadToEnd(ctx, kcfg, kafka.ReadSpec{Topics: []string{topic + "-out"}}, func(r *kgo.Record) error {
		out = append(out, string(r.Value))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out, []string{"a", "b"}) {
		t.Fatalf("committed output %v; want the committed transaction's only", out)
	}
	adm, err := kafka.NewAdmin(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	offs, err := adm.FetchOffsets(ctx, g.Group)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offs.Lookup(topic, 0); !ok || o.At != 2 {
		t.Fatalf("committed input offset %+v (%v), want 2", o, ok)
	}
}

// TestTransactNeedsASession: Transact on a consumer without a session is
// an error, not a transaction of nothing.
func TestTransactNeedsASession(t *testing.T) {
	t.Parallel()
	kcfg := cluster(t, 1)
	produce(t, kcfg, 0, "a")
	var terr error
	c, err := consume.New(kcfg, "plain", consume.Topics(kgo.NewOffset().AtStart(), topic), func(ctx context.Context, b *consume.Batch) error {
		if len(b.Records) == 0 {
			return nil
		}
		_, terr = b.Transact(ctx, func(context.Context) error { return nil })
		return errors.New("done")
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Run(context.Background())
	if terr == nil {
		t.Fatal("Transact without a session succeeded")
	}
}

// TestTransactTryAbortIsNotAnError: a handler that asks TransactTry to
// abort (its produce failed) gets committed false and no error, the batch
// is polled again, and only the committed transaction's output and
// offsets show.
func TestTransactTryAbortIsNotAnError(t *testing.T) {
	t.Parallel()
	kcfg := cluster(t, 1)
	produce(t, kcfg, 0, "a")
	type result struct {
		committed bool
		err       error
	}
	var mu sync.Mutex
	var results []result
	h := func(ctx context.Context, b *consume.Batch) error {
		if len(b.Records) == 0 {
			return nil
		}
		mu.Lock()
		attempt := len(results)
		mu.Unlock()
		ok, err := b.TransactTry(ctx, func(ctx context.Context) kgo.TransactionEndTry {
			for _, r := range b.Records {
				out := &kgo.Record{Topic: topic + "-out", Partition: 0, Value: append([]byte(nil), r.Value...)}
				if err := b.Consumer().Client().ProduceSync(ctx, out).FirstErr(); err != nil {
					return kgo.TryAbort
				}
			}
			return kgo.TransactionEndTry(attempt > 0)
		})
		mu.Lock()
		results = append(results, result{ok, err})
		mu.Unlock()
		return err
	}
	g := group("txn-try")
	c, err := consume.New(kcfg, "transactor-try", consume.TransactGroup(g), h,
		consume.WithPollWait(100*time.Millisecond),
		consume.WithKgoOptions(
			kgo.TransactionalID("consume-test-txn-try"), kgo.TransactionTimeout(10*time.Second),
			kgo.RecordPartitioner(kgo.ManualPartitioner())))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	eventually(t, "a committed transaction", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(results) > 0 && results[len(results)-1].committed
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(results) != 2 || results[0] != (result{false, nil}) || results[1] != (result{true, nil}) {
		t.Fatalf("transactions %+v; want an abort without an error, then a commit", results)
	}
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []string
	if _, err := kafka.ReadToEnd(ctx, kcfg, kafka.ReadSpec{Topics: []string{topic + "-out"}}, func(r *kgo.Record) error {
		out = append(out, string(r.Value))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out, []string{"a"}) {
		t.Fatalf("committed output %v; want the committed transaction's only", out)
	}
	adm, err := kafka.NewAdmin(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	offs, err := adm.FetchOffsets(ctx, g.Group)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offs.Lookup(topic, 0); !ok || o.At != 1 {
		t.Fatalf("committed input offset %+v (%v), want 1", o, ok)
	}
}
