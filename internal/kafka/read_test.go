package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
)

// broker starts an embedded broker with topic of parts partitions and
// returns a config reaching it.
func broker(t *testing.T, topic string, parts int32) kafka.Config {
	t.Helper()
	emb, err := kafka.StartEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Close)
	cfg := kafka.Config{Brokers: emb.Addrs(), ClientID: "kit-test"}
	adm, err := kafka.NewAdmin(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := adm.CreateTopic(t.Context(), parts, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// produce writes n records to each of parts partitions, values "<p>-<i>",
// in one transaction committed or aborted.
func produce(t *testing.T, cfg kafka.Config, topic string, parts int32, n int, commit bool) {
	t.Helper()
	cl, err := kafka.NewProducer(cfg.WithClientID(fmt.Sprintf("kit-test-txn-%d", time.Now().UnixNano())),
		kgo.TransactionalID(fmt.Sprintf("kit-test-%d", time.Now().UnixNano())), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := t.Context()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for p := range parts {
		for i := range n {
			r := &kgo.Record{Partition: p, Value: fmt.Appendf(nil, "%d-%d", p, i)}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}

func TestReadToEndReadsCommittedRecordsToTheEndAsOfTheStart(t *testing.T) {
	t.Parallel()
	const topic = "kit.read"
	cfg := broker(t, topic, 3)
	produce(t, cfg, topic, 3, 5, true)
	produce(t, cfg, topic, 3, 4, false) // aborted: never shown
	produce(t, cfg, topic, 3, 2, true)

	got := map[int32][]string{}
	bounds, err := kafka.ReadToEnd(t.Context(), cfg, kafka.ReadSpec{Topics: []string{topic}, ClientID: "read", Timeout: 20 * time.Second},
		func(r *kgo.Record) error {
			got[r.Partition] = append(got[r.Partition], string(r.Value))
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	for p := range int32(3) {
		var want []string
		for i := range 5 {
			want = append(want, fmt.Sprintf("%d-%d", p, i))
		}
		for i := range 2 {
			want = append(want, fmt.Sprintf("%d-%d", p, i))
		}
		if !slices.Equal(got[p], want) {
			t.Errorf("partition %d: got %v, want %v", p, got[p], want)
		}
		// 5 + 4 + 2 records and three transaction markers.
		if b := bounds[kafka.Partition{Topic: topic, Partition: p}]; b.Start != 0 || b.End != 14 {
			t.Errorf("partition %d bounds %+v, want [0, 14)", p, b)
		}
	}
}

func TestReadToEndPicksPartitionsAndStarts(t *testing.T) {
	t.Parallel()
	const topic = "kit.pick"
	cfg := broker(t, topic, 4)
	produce(t, cfg, topic, 4, 6, true) // offsets 0..5, marker at 6

	var got []string
	spec := kafka.ReadSpec{
		Topics:     []string{topic},
		Partitions: func(_ string, n int) []int32 { return []int32{1, int32(n - 1)} },
		From: func(p kafka.Partition, b kafka.Bounds) (int64, error) {
			if p.Partition == 1 {
				return 4, nil
			}
			return b.End, nil // nothing of partition 3
		},
	}
	bounds, err := kafka.ReadToEnd(t.Context(), cfg, spec, func(r *kgo.Record) error {
		got = append(got, string(r.Value))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"1-4", "1-5"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if len(bounds) != 2 {
		t.Fatalf("bounds of %d partitions, want the 2 picked: %v", len(bounds), bounds)
	}

	stop := errors.New("stop here")
	spec.From = func(kafka.Partition, kafka.Bounds) (int64, error) { return 0, stop }
	if _, err := kafka.ReadToEnd(t.Context(), cfg, spec, func(*kgo.Record) error { return nil }); !errors.Is(err, stop) {
		t.Fatalf("From's error: got %v", err)
	}
	spec.From = nil
	if _, err := kafka.ReadToEnd(t.Context(), cfg, spec, func(*kgo.Record) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("fn's error: got %v", err)
	}
	spec.Partitions = func(string, int) []int32 { return []int32{9} }
	if _, err := kafka.ReadToEnd(t.Context(), cfg, spec, func(*kgo.Record) error { return nil }); err == nil {
		t.Fatal("a partition the topic lacks was read")
	}
	if _, err := kafka.ReadToEnd(t.Context(), cfg, kafka.ReadSpec{Topics: []string{"kit.missing"}, Timeout: 10 * time.Second},
		func(*kgo.Record) error { return nil }); err == nil {
		t.Fatal("a missing topic was read")
	}
}

func TestReadToEndStopsAtTheLastStableOffsetOrWaitsForTheHighWatermark(t *testing.T) {
	t.Parallel()
	const topic = "kit.open"
	cfg := broker(t, topic, 1)
	produce(t, cfg, topic, 1, 3, true)
	open, err := kafka.NewProducer(cfg.WithClientID("kit-test-open"), kgo.TransactionalID("kit-test-open"), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if err := open.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := open.ProduceSync(t.Context(), &kgo.Record{Value: []byte("0-open")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	count := func(hwm bool) (int, error) {
		n := 0
		_, err := kafka.ReadToEnd(t.Context(), cfg, kafka.ReadSpec{Topics: []string{topic}, HighWatermark: hwm, Timeout: 10 * time.Second},
			func(*kgo.Record) error { n++; return nil })
		return n, err
	}
	if n, err := count(false); err != nil || n != 3 {
		t.Fatalf("to the last stable offset: %d records, %v; want the 3 committed", n, err)
	}
	// To the high watermark, the read waits for the open transaction.
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := count(true)
		done <- result{n, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("the read to the high watermark ended with the transaction open: %d, %v", r.n, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := open.EndTransaction(t.Context(), kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.n != 4 {
		t.Fatalf("to the high watermark: %d records, %v; want 4", r.n, r.err)
	}
}

func TestReadDecodedKeepsLogOrder(t *testing.T) {
	t.Parallel()
	const topic = "kit.decoded"
	cfg := broker(t, topic, 1)
	const n = 3*1024 + 17
	produce(t, cfg, topic, 1, n, true)
	spec := kafka.ReadSpec{Topics: []string{topic}, FetchMaxBytes: 4 << 10, Timeout: 30 * time.Second}
	decode := func(r *kgo.Record) (int64, error) { return r.Offset, nil }
	var got []int64
	chunks := 0
	if _, err := kafka.ReadDecoded(t.Context(), cfg, spec, decode, func(offs []int64) error {
		got = append(got, offs...)
		chunks++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != n || chunks < 4 {
		t.Fatalf("%d values in %d chunks, want %d in at least 4", len(got), chunks, n)
	}
	for i, o := range got {
		if o != int64(i) {
			t.Fatalf("value %d is offset %d: out of order", i, o)
		}
	}

	bad := errors.New("undecodable")
	_, err := kafka.ReadDecoded(t.Context(), cfg, spec, func(r *kgo.Record) (int64, error) {
		if r.Offset == 2000 {
			return 0, bad
		}
		return r.Offset, nil
	}, func([]int64) error { return nil })
	if !errors.Is(err, bad) {
		t.Fatalf("a decode error: got %v", err)
	}
	full := errors.New("no room")
	if _, err := kafka.ReadDecoded(t.Context(), cfg, spec, decode, func([]int64) error { return full }); !errors.Is(err, full) {
		t.Fatalf("fn's error: got %v", err)
	}
}

func TestClientsCarryMetricsAndReuseThem(t *testing.T) {
	t.Parallel()
	const topic = "kit.metrics"
	cfg := broker(t, topic, 1)
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	produce(t, cfg, topic, 1, 2, true)
	// Two readers of the same id at once: the second goes unmeasured
	// instead of panicking.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := kafka.ReadToEnd(ctx, cfg, kafka.ReadSpec{Topics: []string{topic}, ClientID: "same"}, func(*kgo.Record) error { return nil })
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	cl, err := kafka.NewClient(cfg, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if strings.HasPrefix(mf.GetName(), "mailplane_kafka_") && labels["kind"] == kafka.KindAdmin && labels["client"] == "kit-test" {
				found = true
			}
		}
	}
	if !found {
		t.Fatal("no mailplane_kafka metrics of the admin client")
	}
}

// TestRecordsAreGzipCompressed: every client of the kit compresses its
// batches with gzip unless configured otherwise: stock clients of every
// ecosystem read gzip without a codec plugin (KafkaJS reads no snappy, lz4
// or zstd on its own).
func TestRecordsAreGzipCompressed(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		setting string
		want    uint8 // the record batch attributes' compression type
	}{{"", 1}, {"gzip", 1}, {"snappy", 2}, {"none", 0}} {
		cfg := broker(t, "compression-test", 1)
		cfg.Compression = c.setting
		cl, err := kafka.NewProducer(cfg, kgo.DefaultProduceTopic("compression-test"))
		if err != nil {
			t.Fatal(err)
		}
		// Records worth compressing (franz-go sends a batch that would
		// not shrink as it is).
		for i := range 20 {
			cl.Produce(t.Context(), &kgo.Record{Value: []byte(strings.Repeat(fmt.Sprintf("event %d ", i), 100))}, nil)
		}
		if err := cl.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
		cl.Close()
		var got []uint8
		if _, err := kafka.ReadToEnd(t.Context(), cfg, kafka.ReadSpec{Topics: []string{"compression-test"}, ClientID: "compression-test-read"},
			func(r *kgo.Record) error {
				got = append(got, r.Attrs.CompressionType())
				return nil
			}); err != nil {
			t.Fatal(err)
		}
		if len(got) != 20 || slices.ContainsFunc(got, func(ct uint8) bool { return ct != c.want }) {
			t.Errorf("compression %q: read types %v, want 20 of %d", c.setting, got, c.want)
		}
	}
	if err := kafka.ValidCompression("brotli"); err == nil {
		t.Error("an unknown compression was accepted")
	}
}
