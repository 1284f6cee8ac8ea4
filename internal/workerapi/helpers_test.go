package workerapi_test

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/apitest"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/workerapi"
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
// an in-process kfake broker with the catalog applied. Requests go through
// the embedded client: as workerToken unless a request says otherwise,
// application/json when they have a body.
type env struct {
	*apitest.Client
	t     testing.TB
	brk   *apitest.Broker
	kcfg  kafka.Config
	start apitest.Offsets // end offsets of the worker topic at start
}

func newEnv(t testing.TB, opts ...workerapi.Option) *env {
	t.Helper()
	return newEnvWith(t, nil, opts...)
}

// newEnvWith is newEnv with extra api.Server options (an admission hook).
func newEnvWith(t testing.TB, apiOpts []api.Option, opts ...workerapi.Option) *env {
	t.Helper()
	brk := apitest.NewBroker(t, "workerapi-test")
	srv, err := api.New(brk.Producer(),
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
	e := &env{
		Client: &apitest.Client{T: t, Base: ts.URL, HTTP: ts.Client(), ContentType: "application/json", Token: workerToken},
		t:      t, brk: brk, kcfg: brk.Config,
	}
	e.start = brk.EndOffsets(workerTopic)
	return e
}

func (e *env) assertNothingProduced() {
	e.t.Helper()
	e.brk.AssertNothingProduced(e.start)
}

// produced returns how many records the worker topic gained since the
// env started.
func (e *env) produced() int64 {
	e.t.Helper()
	return e.brk.Grown(e.start)[workerTopic]
}

// req is a request to the server; its empty fields are the env's
// defaults (as workerToken).
type req = apitest.Request

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
