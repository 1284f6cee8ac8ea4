package devfleet_test

import (
	"context"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/devfleet"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/workerapi"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// TestSimulatedWorkersUseTheirCredentials: with WithWorkerAPI, each
// simulated worker heartbeats through the worker API under the credential
// derived for its own id (a server that only takes worker credentials bound
// to the id accepts them all); under another fleet's secret every
// heartbeat is refused and nothing reaches the log.
func TestSimulatedWorkersUseTheirCredentials(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 4)
	kc, err := kafka.NewProducer(kcfg.WithClientID("devfleet-api"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	secret := []byte("devfleet-test-fleet-secret-0123456789")
	auth, err := access.FromBytes(nil, access.WithFleetSecret(secret))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(producer.New(kc, producer.WithNamespace(kcfg.Namespace)), api.WithAuthenticator(auth), api.WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	if err := workerapi.Register(srv); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	imapSrv := startServer(t)
	ctx := context.Background()

	forged := newSim(t, kcfg, imapSrv, devfleet.WithWorkerAPI(ts.URL, []byte("another-fleet-secret-0123456789abcdef")))
	if err := forged.Heartbeat(ctx); err == nil {
		t.Fatal("heartbeats under another fleet's secret were accepted")
	}
	if evs := readAll(t, kcfg, topics.WorkerEvents); len(evs) != 0 {
		t.Fatalf("%d events on the log after refused heartbeats", len(evs))
	}

	sim := newSim(t, kcfg, imapSrv, devfleet.WithWorkerAPI(ts.URL, secret))
	if err := sim.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, e := range readAll(t, kcfg, topics.WorkerEvents) {
		if e.Type != domain.TypeWorkerHeartbeat {
			t.Fatalf("event %s", e.Type)
		}
		got = append(got, e.Data.(*domain.WorkerHeartbeat).WorkerID)
	}
	for _, w := range devfleet.Workers() {
		want = append(want, w.ID)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("heartbeats of %v, want %v", got, want)
	}
}
