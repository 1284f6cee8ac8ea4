// Package kafkatest gives tests a Kafka broker: an in-process kfake cluster
// per test by default, or the real broker named by MAILPLANE_TEST_BROKERS.
//
// Topic names are fixed by the catalog, so tests cannot share a real broker
// concurrently: with MAILPLANE_TEST_BROKERS set, tests holding a broker run
// one at a time within a test binary (a process-wide lock), every mailplane
// topic is deleted before each test, and `go test` must run with -p 1 and a
// -parallel well above the number of parallel tests of a package (make
// test-broker passes 64): tests waiting for the lock occupy parallel slots,
// and a holder's own parallel subtests need free ones. A test asking for a
// second broker while it or its parent holds one fails at once. Group
// sessions shorter than a real broker's minimum (6 s by default, in Kafka,
// Redpanda and kfake) are refused: tests take theirs from SessionTimeout.
// Tests that need kfake's fault hooks (black-holing a member, compaction on
// demand) use Fake whatever the environment.
package kafkatest

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/topics"
)

// EnvBrokers names the variable holding a real broker list.
const EnvBrokers = "MAILPLANE_TEST_BROKERS"

var (
	realMu   sync.Mutex
	holderMu sync.Mutex
	holder   string // name of the test holding realMu
)

// Real reports whether tests run against the broker in MAILPLANE_TEST_BROKERS.
func Real() bool { return os.Getenv(EnvBrokers) != "" }

// MinRealSession is the shortest group session a real broker accepts by
// default (group.min.session.timeout.ms).
const MinRealSession = 6 * time.Second

// SessionTimeout returns d for kfake (whose minimum Fake lowers to 100 ms)
// and at least MinRealSession against a real broker.
func SessionTimeout(d time.Duration) time.Duration {
	if Real() {
		return max(d, MinRealSession)
	}
	return d
}

// Brokers returns bootstrap brokers for t with the topic catalog applied
// (statePartitions partitions for the state topics).
func Brokers(t testing.TB, statePartitions int32) []string {
	t.Helper()
	var brokers []string
	if env := os.Getenv(EnvBrokers); env != "" {
		// A test (or its subtests) asking for a second broker while it
		// holds the shared one would wait for itself forever.
		holderMu.Lock()
		nested := holder != "" && (holder == t.Name() || strings.HasPrefix(t.Name(), holder+"/"))
		holderMu.Unlock()
		if nested {
			t.Fatalf("%s: %s asks for a second broker while its test holds the shared one; "+
				"against one real broker the fixed topic names cannot be shared within a test yet", EnvBrokers, t.Name())
		}
		realMu.Lock()
		holderMu.Lock()
		holder = t.Name()
		holderMu.Unlock()
		t.Cleanup(func() {
			holderMu.Lock()
			holder = ""
			holderMu.Unlock()
			realMu.Unlock()
		})
		brokers = kafka.ParseBrokers(env)
		resetTopics(t, brokers)
	} else {
		brokers = Fake(t).ListenAddrs()
	}
	kc, err := kafka.NewClient(kafka.Config{Brokers: brokers, ClientID: "mailplane-test-topics"}, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := topics.Apply(ctx, kc, topics.Catalog(topics.Config{StatePartitions: statePartitions})); err != nil {
		t.Fatalf("apply topics: %v", err)
	}
	return brokers
}

// Fake starts an in-process kfake cluster for t, closed at cleanup. Group
// sessions may be as short as 100 ms (kfake's default minimum is 6 s), so
// tests of rebalances and failover run fast; opts can override it.
func Fake(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	opts = append([]kfake.Opt{kfake.GroupMinSessionTimeout(100 * time.Millisecond)}, opts...)
	emb, err := kafka.StartEmbedded(kafka.WithKfakeOptions(opts...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Close)
	return emb.Cluster
}

// resetTopics deletes every mailplane topic on a real broker.
func resetTopics(t testing.TB, brokers []string) {
	t.Helper()
	adm, err := kafka.NewAdmin(kafka.Config{Brokers: brokers, ClientID: "mailplane-test-reset"})
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	listed, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatalf("%s=%s: %v", EnvBrokers, strings.Join(brokers, ","), err)
	}
	var del []string
	for _, n := range listed.Names() {
		if strings.HasPrefix(n, "mailplane.") {
			del = append(del, n)
		}
	}
	if len(del) > 0 {
		if _, err := adm.DeleteTopics(ctx, del...); err != nil {
			t.Fatalf("delete topics: %v", err)
		}
	}
}

// Fetch reads the record at topic/partition/offset, failing t after 10 s.
func Fetch(t testing.TB, brokers []string, topic string, partition int32, offset int64) *kgo.Record {
	t.Helper()
	cl, err := kafka.NewClient(kafka.Config{Brokers: brokers, ClientID: "mailplane-test-fetch"}, kafka.KindReader,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().At(offset)}}),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("fetch %s/%d@%d: %v", topic, partition, offset, err)
		}
		var got *kgo.Record
		fs.EachRecord(func(r *kgo.Record) {
			if got == nil && r.Offset == offset {
				got = r
			}
		})
		if got != nil {
			return got
		}
	}
}
