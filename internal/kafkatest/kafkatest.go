// Package kafkatest gives tests a Kafka broker: an in-process kfake cluster
// per test by default, or the real broker named by MAILPLANE_TEST_BROKERS.
//
// Config gives each test a namespace of its own (docs/namespaces.md): every
// topic, group and transactional id the test's components use is prefixed
// with it, so tests share a real broker and run in parallel, across
// packages too (`make test-broker`). On kfake the namespace is there as
// well, so every test run exercises the namespaced names. A test writing
// or reading records itself names the topic through its configuration
// (kcfg.Topic(topics.X)).
//
// Group sessions shorter than a real broker's minimum (6 s by default, in
// Kafka, Redpanda and kfake) are refused: tests take theirs from
// SessionTimeout. Tests that need kfake's fault hooks (black-holing a
// member, compaction on demand) use Fake whatever the environment.
package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/topics"
)

// EnvBrokers names the variable holding a real broker list.
const EnvBrokers = "MAILPLANE_TEST_BROKERS"

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

// Config returns a client configuration for t: the brokers (a kfake of
// t's own, or the real broker of MAILPLANE_TEST_BROKERS) with the topic
// catalog applied (statePartitions partitions for the state topics) in a
// fresh namespace. On a real broker the namespace's topics are deleted when
// t ends.
func Config(t testing.TB, statePartitions int32) kafka.Config {
	t.Helper()
	ns := Namespace(t)
	var brokers []string
	if env := os.Getenv(EnvBrokers); env != "" {
		brokers = kafka.ParseBrokers(env)
		// Registered first, so it runs last: after the test's clients
		// (registered later) are closed.
		t.Cleanup(func() { deleteTopics(t, brokers, ns) })
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
	if _, err := topics.Apply(ctx, kc, topics.Catalog(topics.Config{StatePartitions: statePartitions, Namespace: ns})); err != nil {
		t.Fatalf("%s: apply topics in namespace %s: %v", strings.Join(brokers, ","), ns, err)
	}
	return kafka.Config{Brokers: brokers, Namespace: ns}
}

// Namespace returns a namespace no other test uses: "t" and 10 random hex
// digits (a broker may be shared by test processes started at once, so a
// counter would not do).
func Namespace(t testing.TB) topics.Namespace {
	t.Helper()
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return topics.Namespace("t" + hex.EncodeToString(b[:]))
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

// deleteTopics deletes the topics of namespace ns on a real broker.
func deleteTopics(t testing.TB, brokers []string, ns topics.Namespace) {
	adm, err := kafka.NewAdmin(kafka.Config{Brokers: brokers, ClientID: "mailplane-test-cleanup"})
	if err != nil {
		t.Errorf("deleting namespace %s: %v", ns, err)
		return
	}
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var names []string
	for _, s := range topics.Catalog(topics.Config{Namespace: ns}) {
		names = append(names, s.Name)
	}
	if _, err := adm.DeleteTopics(ctx, names...); err != nil {
		t.Errorf("deleting namespace %s: %v", ns, err)
	}
}

// InNamespace moves records a test built with the catalog's topic names
// (topics.Encode, mailboxstate.Record(topics.MailboxState, ...)) into
// kcfg's namespace, and returns them. Other names are left alone.
func InNamespace(kcfg kafka.Config, recs ...*kgo.Record) []*kgo.Record {
	for _, r := range recs {
		if topics.IsCatalogName(r.Topic) {
			r.Topic = kcfg.Topic(r.Topic)
		}
	}
	return recs
}

// Fetch reads the record at topic/partition/offset (topic as the broker
// names it: a receipt's, or kcfg.Topic(topics.X)).
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
