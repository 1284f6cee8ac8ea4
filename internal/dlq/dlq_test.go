package dlq_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/topics"
)

func source(value string) *kgo.Record {
	return &kgo.Record{
		Topic: topics.MailboxEvents, Partition: 3, Offset: 42,
		Key:   []byte("0190a5e4-0000-7000-8000-000000000001"),
		Value: []byte(value),
		Headers: []kgo.RecordHeader{
			{Key: topics.HeaderID, Value: []byte("0190a5e4-0000-7000-8000-0000000000ff")},
			{Key: topics.HeaderType, Value: []byte(domain.TypeMailboxAdded)},
			// A stale dead-letter header from an earlier redrive.
			{Key: dlq.HeaderAttempts, Value: []byte("99")},
		},
	}
}

func TestNewRecordRoundTrip(t *testing.T) {
	t.Parallel()
	src := source(`{"mailbox_id":"x"}`)
	r := dlq.NewRecord("", src, dlq.Failure{Consumer: "registry", Code: domain.CodeMalformedJSON, Err: "bad", Attempts: 1})
	if r.Topic != topics.DLQ {
		t.Fatalf("topic %s", r.Topic)
	}
	// A dead letter goes to the DLQ of its consumer's namespace.
	if got := dlq.NewRecord("staging", src, dlq.Failure{Consumer: "registry", Code: domain.CodeInvalid, Err: "x", Attempts: 1}).Topic; got != "staging."+topics.DLQ {
		t.Errorf("in namespace staging: topic %s", got)
	}
	e := dlq.Parse(r)
	if e.SourceTopic != src.Topic || e.SourcePartition != 3 || e.SourceOffset != 42 ||
		e.Consumer != "registry" || e.ErrorCode != domain.CodeMalformedJSON || e.Error != "bad" ||
		e.Attempts != 1 || e.ValueWithheld != "" {
		t.Fatalf("entry %+v", e)
	}
	if !bytes.Equal(e.Key, src.Key) || !bytes.Equal(e.Value, src.Value) {
		t.Fatalf("key/value not kept: %q %q", e.Key, e.Value)
	}
	if id, _ := e.Header(topics.HeaderID); id != "0190a5e4-0000-7000-8000-0000000000ff" {
		t.Fatalf("original header lost: %v", e.Headers)
	}
	n := 0
	for _, h := range r.Headers {
		if h.Key == dlq.HeaderAttempts {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d attempts headers, want 1", n)
	}
}

func TestNewRecordWithholdsSecrets(t *testing.T) {
	t.Parallel()
	plain := `{"mailbox_id":"x","credentials":{"password":"hunter2"}}`
	for _, tc := range []struct {
		name, value string
		code        domain.Code
		want        string
	}{
		{"plaintext code", plain, domain.CodePlaintextSecret, dlq.WithheldPlaintextSecret},
		// Another failure, say a type error, on a value that also holds a
		// plain secret: still withheld.
		{"secret under another code", plain, domain.CodeInvalidType, dlq.WithheldPossibleSecret},
		{"case-folded key", `{"CREDENTIALS":{"x":1}}`, domain.CodeInvalid, dlq.WithheldPossibleSecret},
		{"nested", `{"a":[{"password":"p"}]}`, domain.CodeInvalid, dlq.WithheldPossibleSecret},
		{"not JSON", `{"password": "hunter2"`, domain.CodeMalformedJSON, dlq.WithheldPossibleSecret},
		{"sealed only", `{"sealed_credentials":{"key_id":"k","ciphertext":"AAAA"}}`, domain.CodeInvalid, ""},
		{"null credentials", `{"credentials":null}`, domain.CodeInvalid, ""},
	} {
		r := dlq.NewRecord("", source(tc.value), dlq.Failure{Consumer: "c", Code: tc.code, Err: "e", Attempts: 1})
		e := dlq.Parse(r)
		if e.ValueWithheld != tc.want {
			t.Errorf("%s: withheld %q, want %q", tc.name, e.ValueWithheld, tc.want)
		}
		if tc.want != "" && len(r.Value) != 0 {
			t.Errorf("%s: value kept: %q", tc.name, r.Value)
		}
		if tc.want == "" && string(r.Value) != tc.value {
			t.Errorf("%s: value changed: %q", tc.name, r.Value)
		}
		for _, h := range r.Headers {
			if strings.Contains(string(h.Value), "hunter2") {
				t.Errorf("%s: secret in header %s", tc.name, h.Key)
			}
		}
	}
}

func TestErrorHeaderBounded(t *testing.T) {
	t.Parallel()
	r := dlq.NewRecord("", source(`{}`), dlq.Failure{Consumer: "c", Code: domain.CodeInvalid, Err: strings.Repeat("é", 2000), Attempts: 3})
	e := dlq.Parse(r)
	if len(e.Error) > dlq.MaxErrorLen+len("…") {
		t.Fatalf("error header is %d bytes", len(e.Error))
	}
}

func startBroker(t *testing.T) kafka.Config {
	t.Helper()
	emb, err := kafka.StartEmbedded(kafka.WithPort(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Close)
	cfg := kafka.Config{Brokers: emb.Addrs(), ClientID: "dlq-test"}
	cl, err := kafka.NewProducer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	spec, _ := topics.Lookup(topics.Config{}, topics.DLQ)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := topics.Apply(ctx, cl, []topics.Spec{spec}); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestListAndFormat(t *testing.T) {
	t.Parallel()
	cfg := startBroker(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	// An empty DLQ lists nothing, promptly.
	got, err := dlq.List(ctx, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("empty DLQ listed %d", len(got))
	}

	cl, err := kafka.NewProducer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for i := range 5 {
		src := source(`{"n":1}`)
		src.Offset = int64(i)
		recs = append(recs, dlq.NewRecord("", src, dlq.Failure{Consumer: "registry", Code: domain.CodeUnknownType, Err: "unknown event type", Attempts: 1}))
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	all, err := dlq.List(ctx, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 5 {
		t.Fatalf("listed %d, want 5", len(all))
	}
	for i, e := range all {
		if e.SourceOffset != int64(i) || e.ErrorCode != domain.CodeUnknownType || e.Consumer != "registry" {
			t.Fatalf("entry %d: %+v", i, e)
		}
	}
	last2, err := dlq.List(ctx, cfg, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(last2) != 2 || last2[0].SourceOffset != 3 || last2[1].SourceOffset != 4 {
		t.Fatalf("limit 2: %+v", last2)
	}

	var buf bytes.Buffer
	if err := dlq.Format(&buf, last2, nil); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("want header + 2 lines:\n%s", out)
	}
	for _, want := range []string{"SOURCE", "CODE", topics.MailboxEvents + "[3]@4", "unknown_type", "registry"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestListNoBroker(t *testing.T) {
	t.Parallel()
	// Nothing listens here: List must fail within its deadline, not hang.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := dlq.List(ctx, kafka.Config{Brokers: []string{"127.0.0.1:1"}}, 10); err == nil {
		t.Fatal("List against no broker succeeded")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("List took %s", d)
	}
}

// Dead letters written in transactions: an aborted one is not listed, and a
// transaction marker at the end of the log does not stall the listing.
func TestListTransactional(t *testing.T) {
	t.Parallel()
	cfg := kafkatest.Config(t, 4)
	cfg.ClientID = "dlq-txn-test"
	cl, err := kafka.NewProducer(cfg, kgo.TransactionalID(cfg.TransactionalID("dlq-test")))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	write := func(commit bool, consumer string) {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		r := dlq.NewRecord(cfg.Namespace, source(`{}`), dlq.Failure{Consumer: consumer, Code: domain.CodeMalformedJSON, Err: "bad", Attempts: 1})
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	write(true, "kept")
	write(false, "aborted")
	entries, err := dlq.List(ctx, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Consumer != "kept" {
		t.Fatalf("entries %+v, want only the committed dead letter", entries)
	}
}
