package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
)

// A client closed while the broker is away returns at once: a stopping
// process closes its clients one after the other within compose's 10 s
// grace (franz-go's Close would otherwise wait up to 1 s per client for a
// last KIP-714 metrics push to the broker).
func TestCloseWhileTheBrokerIsAway(t *testing.T) {
	t.Parallel()
	const topic = "close-test"
	emb, err := kafka.StartEmbedded(kafka.WithKfakeOptions(kfake.SeedTopics(1, topic)))
	if err != nil {
		t.Fatal(err)
	}
	defer emb.Close()
	cl, err := kafka.NewProducer(kafka.Config{Brokers: emb.Addrs(), ClientID: "close-test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A produce connects the client: it has a broker to push to.
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	emb.Close()
	start := time.Now()
	cl.Close()
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("Close took %s with the broker away, want under 500ms", took)
	}
}

// CloseWithin waits for a close that finishes, and gives up on one that
// does not (a leave held by the coordinator) after its bound.
func TestCloseWithin(t *testing.T) {
	t.Parallel()
	if !kafka.CloseWithin(time.Second, func() {}) {
		t.Error("a close that returned at once was reported unfinished")
	}
	release := make(chan struct{})
	defer close(release)
	start := time.Now()
	if kafka.CloseWithin(50*time.Millisecond, func() { <-release }) {
		t.Error("a close still blocked was reported finished")
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("gave up after %s, before its bound", d)
	}
}
