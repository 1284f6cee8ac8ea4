// Package apitest is the harness of the tests of mailplane's HTTP API and
// the routes mounted on it (billing's webhook, the worker API, the
// console): a broker with the topic catalog for a server to publish to,
// the end offsets that show a refused request produced nothing, a client
// that sends a request and reads the whole answer, strict decoding of
// answers, and a producer for servers that never produce.
//
// It imports no server package, so the api package's own tests use it
// too.
package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// Broker is a test's broker with the topic catalog (4 partitions for the
// state topics) in a namespace of the test's own, and a producer client
// of it, closed when the test ends.
type Broker struct {
	Config kafka.Config // the brokers and the test's namespace
	Client *kgo.Client  // built with kafka.NewProducer
	Admin  *kadm.Client // on Client
	t      testing.TB
}

// NewBroker gives t a broker: an in-process kfake cluster, or the real
// broker named by MAILPLANE_TEST_BROKERS (kafkatest.Config).
func NewBroker(t testing.TB, clientID string) *Broker {
	t.Helper()
	return newBroker(t, kafkatest.Config(t, 4), clientID)
}

// NewBrokerOn is NewBroker on the given kfake cluster, for tests that
// need its fault hooks.
func NewBrokerOn(t testing.TB, fake *kfake.Cluster, clientID string) *Broker {
	t.Helper()
	kcfg := kafka.Config{Brokers: fake.ListenAddrs(), Namespace: kafkatest.Namespace(t)}
	// A client of its own: a client's cached metadata can still say
	// "unknown topic" for a while after it created the topic.
	ac, err := kafka.NewClient(kafka.Config{Brokers: kcfg.Brokers}, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = topics.Apply(ctx, ac, topics.Catalog(topics.Config{StatePartitions: 4, Namespace: kcfg.Namespace}))
	ac.Close()
	if err != nil {
		t.Fatal(err)
	}
	return newBroker(t, kcfg, clientID)
}

func newBroker(t testing.TB, kcfg kafka.Config, clientID string) *Broker {
	t.Helper()
	kcfg.ClientID = clientID
	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	return &Broker{Config: kcfg, Client: kc, Admin: kadm.NewClient(kc), t: t}
}

// Producer returns a producer.Client publishing into the test's namespace.
func (b *Broker) Producer(opts ...producer.Option) *producer.Client {
	return producer.New(b.Client, append([]producer.Option{producer.WithNamespace(b.Config.Namespace)}, opts...)...)
}

// Fetch reads the record at topic/partition/offset (topic as the broker
// names it: a receipt's).
func (b *Broker) Fetch(topic string, partition int32, offset int64) *kgo.Record {
	b.t.Helper()
	return kafkatest.Fetch(b.t, b.Config.Brokers, topic, partition, offset)
}

// Offsets are end offsets by catalog topic name and partition.
type Offsets map[string]map[int32]int64

// EndOffsets returns the end offset of every partition of the named
// catalog topics, in the test's namespace.
func (b *Broker) EndOffsets(names ...string) Offsets {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	los, err := b.Admin.ListEndOffsets(ctx, b.Config.Namespace.Topics(names...)...)
	if err != nil {
		b.t.Fatal(err)
	}
	out := Offsets{}
	los.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			b.t.Fatalf("end offset of %s/%d: %v", o.Topic, o.Partition, o.Err)
		}
		base, _ := b.Config.Namespace.Base(o.Topic)
		if out[base] == nil {
			out[base] = map[int32]int64{}
		}
		out[base][o.Partition] = o.Offset
	})
	if len(out) != len(names) {
		b.t.Fatalf("end offsets of %d topics, want %d", len(out), len(names))
	}
	return out
}

// Grown returns how many records each topic of since gained since, by
// catalog name; topics that gained none are left out.
func (b *Broker) Grown(since Offsets) map[string]int64 {
	b.t.Helper()
	names := make([]string, 0, len(since))
	for name := range since {
		names = append(names, name)
	}
	out := map[string]int64{}
	for name, ps := range b.EndOffsets(names...) {
		for p, off := range ps {
			if d := off - since[name][p]; d != 0 {
				out[name] += d
			}
		}
	}
	return out
}

// AssertNothingProduced fails the test if any topic of since grew.
func (b *Broker) AssertNothingProduced(since Offsets) {
	b.t.Helper()
	if got := b.Grown(since); len(got) > 0 {
		b.t.Errorf("records were produced: %v", got)
	}
}

// Client sends requests to one server and reads whole answers.
type Client struct {
	T    testing.TB
	Base string // "http://host:port"
	HTTP *http.Client
	// Defaults for a Request that leaves them out.
	Method      string
	Path        string
	ContentType string // only when the request has a body
	Token       string // bearer token
	// Secrets must never appear in an answer: a test that sends one
	// fails if the server echoes it.
	Secrets []string
}

// Request is one request; its empty fields take the Client's defaults.
type Request struct {
	Method      string
	Path        string
	ContentType string
	Body        []byte
	Chunked     bool   // send the body without a Content-Length
	Token       string // the bearer token
	NoAuth      bool   // send no Authorization header at all
	Headers     map[string]string
}

// Do sends r and returns the answer and its whole body.
func (c *Client) Do(r Request) (*http.Response, []byte) {
	c.T.Helper()
	method, path, ct, tok := or(r.Method, c.Method), or(r.Path, c.Path), r.ContentType, or(r.Token, c.Token)
	var body io.Reader
	if r.Body != nil {
		body = bytes.NewReader(r.Body)
		if r.Chunked {
			body = io.MultiReader(body) // hides the length
		}
		ct = or(ct, c.ContentType)
	}
	hr, err := http.NewRequest(method, c.Base+path, body)
	if err != nil {
		c.T.Fatal(err)
	}
	if ct != "" {
		hr.Header.Set("Content-Type", ct)
	}
	if tok != "" && !r.NoAuth {
		hr.Header.Set("Authorization", "Bearer "+tok)
	}
	for k, v := range r.Headers {
		hr.Header.Set(k, v)
	}
	return c.Send(hr)
}

// Send sends hr as it is and returns the answer and its whole body.
func (c *Client) Send(hr *http.Request) (*http.Response, []byte) {
	c.T.Helper()
	resp, err := c.HTTP.Do(hr)
	if err != nil {
		c.T.Fatalf("%s %s: %v", hr.Method, hr.URL.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.T.Fatal(err)
	}
	for _, s := range c.Secrets {
		if strings.Contains(string(b), s) {
			c.T.Errorf("%s %s: the answer echoes a secret: %s", hr.Method, hr.URL.Path, b)
		}
	}
	return resp, b
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// DecodeStrict decodes b as a T, refusing fields T does not have: an
// answer carrying more than the documented shape fails the test.
func DecodeStrict[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %T: %v: %s", v, err, b)
	}
	return v
}

// NopProducer is a producer for servers under test that never produce
// (api.Producer): it refuses every call.
type NopProducer struct{}

// PrepareChecked refuses.
func (NopProducer) PrepareChecked([]domain.Checked) ([]*kgo.Record, error) {
	return nil, errors.New("apitest.NopProducer: not for producing")
}

// ProduceRecords refuses.
func (NopProducer) ProduceRecords(context.Context, []domain.Event, []*kgo.Record) ([]producer.Receipt, error) {
	return nil, errors.New("apitest.NopProducer: not for producing")
}
