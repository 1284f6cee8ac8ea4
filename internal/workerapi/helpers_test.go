package workerapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/workerapi"
	"github.com/mailplane/mailplane/producer"
)

const (
	workerID      = "0190f3c4-5d6e-7f80-9a1b-2c3d4e5f6a7b"
	otherWorkerID = "0190f3c4-5d6e-7f80-9a1b-2c3d4e5f6a7c"
	// readerToken holds workers:read (an ops dashboard, say).
	readerToken = "reader-tok-0f9e8d7c6b5a49382716"
	// producerToken publishes the public types only.
	producerToken = "producer-tok-7a6b5c4d3e2f1a0b9c8d"
	// fleetToken may publish worker.heartbeat through /v1/events (any id).
	fleetToken = "fleet-tok-1c2d3e4f5a6b7c8d9e0f1a2b"
)

// fleetSecret derives the workers' credentials (fixed: tests are
// deterministic).
var fleetSecret = []byte("fleet-secret-for-tests-0123456789abcdef")

var (
	workerToken = access.WorkerToken(fleetSecret, workerID)
	otherToken  = access.WorkerToken(fleetSecret, otherWorkerID)
)

// testAuth accepts the workers' credentials and the file callers above.
func testAuth(t testing.TB) *access.Authenticator {
	t.Helper()
	a, err := access.FromBytes([]byte(
		access.Line("dashboard", readerToken, []string{domain.ScopeWorkersRead}, "/ops")+"\n"+
			access.Line("product", producerToken, []string{domain.ScopePublishPublic}, "/product")+"\n"+
			access.Line("fleet", fleetToken, []string{domain.PublishScope(domain.TypeWorkerHeartbeat)}, "/sending-workers")+"\n"),
		access.WithFleetSecret(fleetSecret))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// fixedNow is the injected server clock.
var fixedNow = time.Date(2026, 5, 1, 12, 0, 0, 123456789, time.UTC)

// env is an api.Server with the worker routes, on loopback, producing to
// an in-process kfake broker (kafkatest.Brokers) with the catalog applied.
type env struct {
	t     testing.TB
	adm   *kadm.Client
	kc    *kgo.Client
	kcfg  kafka.Config
	brk   []string
	base  string
	http  *http.Client
	start map[int32]int64 // end offsets of the worker topic at start
}

func newEnv(t testing.TB, opts ...workerapi.Option) *env {
	t.Helper()
	return newEnvWith(t, nil, opts...)
}

// newEnvWith is newEnv with extra api.Server options (an admission hook).
func newEnvWith(t testing.TB, apiOpts []api.Option, opts ...workerapi.Option) *env {
	t.Helper()
	kcfg := kafkatest.Config(t, 4)
	kcfg.ClientID = "workerapi-test"
	brokers := kcfg.Brokers
	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	srv, err := api.New(producer.New(kc, producer.WithNamespace(kcfg.Namespace)),
		append([]api.Option{api.WithAuthenticator(testAuth(t)),
			api.WithRegisterer(prometheus.NewRegistry())}, apiOpts...)...,
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := workerapi.Register(srv, append([]workerapi.Option{workerapi.WithClock(func() time.Time { return fixedNow })}, opts...)...); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	e := &env{t: t, kcfg: kcfg, adm: kadm.NewClient(kc), kc: kc, brk: brokers, base: ts.URL, http: ts.Client()}
	e.start = e.endOffsets()
	return e
}

// endOffsets returns the end offset of every partition of the worker topic.
func (e *env) endOffsets() map[int32]int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	los, err := e.adm.ListEndOffsets(ctx, e.kcfg.Topic(workerTopic))
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int32]int64{}
	los.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			e.t.Fatalf("end offset of %s/%d: %v", o.Topic, o.Partition, o.Err)
		}
		out[o.Partition] = o.Offset
	})
	if len(out) == 0 {
		e.t.Fatalf("no partitions for %s", workerTopic)
	}
	return out
}

func (e *env) assertNothingProduced() {
	e.t.Helper()
	now := e.endOffsets()
	for p, off := range e.start {
		if now[p] != off {
			e.t.Errorf("%s/%d: end offset moved from %d to %d; something was produced", workerTopic, p, off, now[p])
		}
	}
}

type req struct {
	method  string
	path    string
	ct      string // default application/json when a body is given
	body    []byte
	token   *string // nil: workerToken; "": no Authorization header
	headers map[string]string
}

func ptr[T any](v T) *T { return &v }

func (e *env) do(r req) (*http.Response, []byte) {
	e.t.Helper()
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	hr, err := http.NewRequest(r.method, e.base+r.path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if r.ct != "" {
		hr.Header.Set("Content-Type", r.ct)
	} else if r.body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	tok := workerToken
	if r.token != nil {
		tok = *r.token
	}
	if tok != "" {
		hr.Header.Set("Authorization", "Bearer "+tok)
	}
	for k, v := range r.headers {
		hr.Header.Set(k, v)
	}
	resp, err := e.http.Do(hr)
	if err != nil {
		e.t.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp, b
}

// fetch reads the record at topic/partition/offset.
func (e *env) fetch(topic string, partition int32, offset int64) *kgo.Record {
	e.t.Helper()
	return kafkatest.Fetch(e.t, e.brk, topic, partition, offset)
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decodeStrict[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %T: %v: %s", v, err, b)
	}
	return v
}

// fakeStore is an AssignmentStore answering from fixed data and counting
// calls.
type fakeStore struct {
	mu     sync.Mutex
	calls  int
	last   workerapi.Token
	answer func(workerID string, since workerapi.Token) (workerapi.Result, error)
}

func (f *fakeStore) Assignments(_ context.Context, workerID string, since workerapi.Token) (workerapi.Result, error) {
	f.mu.Lock()
	f.calls++
	f.last = since
	f.mu.Unlock()
	if f.answer == nil {
		if since.IsZero() {
			return workerapi.Result{Full: true, Token: workerapi.TokenAt(7)}, nil
		}
		return workerapi.Result{Token: workerapi.TokenAt(7)}, nil
	}
	return f.answer(workerID, since)
}

func (f *fakeStore) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// nopProducer is an api.Producer for tests that never produce.
type nopProducer struct{}

func (nopProducer) PrepareChecked([]domain.Checked) ([]*kgo.Record, error) {
	return nil, errors.New("nopProducer: not for producing")
}

func (nopProducer) ProduceRecords(context.Context, []domain.Event, []*kgo.Record) ([]producer.Receipt, error) {
	return nil, errors.New("nopProducer: not for producing")
}

// produced returns how many records the worker topic gained since the
// env started.
func (e *env) produced() int64 {
	e.t.Helper()
	var n int64
	now := e.endOffsets()
	for p, off := range e.start {
		n += now[p] - off
	}
	return n
}
