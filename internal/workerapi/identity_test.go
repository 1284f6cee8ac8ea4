package workerapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/internal/workerapi"
)

func heartbeatOf(id string) map[string]any {
	return map[string]any{"worker_id": id, "tier": "shared_free", "egress": "cold_smtp", "address": "10.0.0.7:25"}
}

func errCode(t testing.TB, b []byte) domain.Code {
	t.Helper()
	var er api.ErrorResponse
	if err := json.Unmarshal(b, &er); err != nil {
		t.Fatalf("error body: %v: %s", err, b)
	}
	return er.Error.Code
}

// TestWorkerCannotActAsAnother: a worker credential heartbeats and reads
// assignments under its own id only; another worker's id is 403, a file
// caller (even one that may read assignments) never heartbeats, a forged
// or foreign-secret MAC is 401, and nothing reaches the log.
func TestWorkerCannotActAsAnother(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	e := newEnv(t, workerapi.WithAssignmentStore(store))
	forged := strings.TrimSuffix(workerToken, workerToken[len(workerToken)-4:]) + "AAAA"
	foreign := access.WorkerToken([]byte("another-fleet-secret-0123456789abcdef"), workerID)
	swapped := "mpw1." + otherWorkerID + workerToken[len("mpw1.")+len(workerID):] // my MAC, its id
	for _, tc := range []struct {
		name   string
		r      req
		status int
		code   domain.Code
	}{
		{"heartbeat as another worker", req{Method: http.MethodPost, Path: "/v1/workers/heartbeat", Body: mailplanetest.MustJSON(t, heartbeatOf(otherWorkerID))}, 403, domain.CodeForbidden},
		{"heartbeat with the other's token as me", req{Method: http.MethodPost, Path: "/v1/workers/heartbeat", Body: mailplanetest.MustJSON(t, heartbeatOf(workerID)), Token: otherToken}, 403, domain.CodeForbidden},
		{"heartbeat by a workers:read caller", req{Method: http.MethodPost, Path: "/v1/workers/heartbeat", Body: mailplanetest.MustJSON(t, heartbeatOf(workerID)), Token: readerToken}, 403, domain.CodeForbidden},
		{"heartbeat by a producer", req{Method: http.MethodPost, Path: "/v1/workers/heartbeat", Body: mailplanetest.MustJSON(t, heartbeatOf(workerID)), Token: producerToken}, 403, domain.CodeForbidden},
		{"heartbeat with a forged MAC", req{Method: http.MethodPost, Path: "/v1/workers/heartbeat", Body: mailplanetest.MustJSON(t, heartbeatOf(workerID)), Token: forged}, 401, domain.CodeUnauthorized},
		{"heartbeat with another fleet's MAC", req{Method: http.MethodPost, Path: "/v1/workers/heartbeat", Body: mailplanetest.MustJSON(t, heartbeatOf(workerID)), Token: foreign}, 401, domain.CodeUnauthorized},
		{"heartbeat with my MAC on its id", req{Method: http.MethodPost, Path: "/v1/workers/heartbeat", Body: mailplanetest.MustJSON(t, heartbeatOf(otherWorkerID)), Token: swapped}, 401, domain.CodeUnauthorized},
		{"assignments of another worker", req{Method: http.MethodGet, Path: "/v1/workers/" + otherWorkerID + "/assignments"}, 403, domain.CodeForbidden},
		{"assignments by a producer", req{Method: http.MethodGet, Path: "/v1/workers/" + workerID + "/assignments", Token: producerToken}, 403, domain.CodeForbidden},
		{"assignments with a forged MAC", req{Method: http.MethodGet, Path: "/v1/workers/" + workerID + "/assignments", Token: forged}, 401, domain.CodeUnauthorized},
		{"heartbeat through /v1/events by a producer", req{Method: http.MethodPost, Path: "/v1/events", ContentType: api.ContentTypeStructured, Token: producerToken,
			Body: mailplanetest.MustJSON(t, map[string]any{"specversion": "1.0", "id": domain.NewEventID(), "type": domain.TypeWorkerHeartbeat, "source": "/product", "data": heartbeatOf(workerID)})}, 403, domain.CodeForbidden},
		{"heartbeat through /v1/events by a worker", req{Method: http.MethodPost, Path: "/v1/events", ContentType: api.ContentTypeStructured,
			Body: mailplanetest.MustJSON(t, map[string]any{"specversion": "1.0", "id": domain.NewEventID(), "type": domain.TypeWorkerHeartbeat, "source": "/w", "data": heartbeatOf(workerID)})}, 403, domain.CodeForbidden},
	} {
		resp, b := e.Do(tc.r)
		if resp.StatusCode != tc.status || errCode(t, b) != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, resp.StatusCode, b, tc.status, tc.code)
		}
	}
	if n := store.count(); n != 0 {
		t.Errorf("the store was read %d times for refused requests", n)
	}
	e.assertNothingProduced()

	// Positive controls: the worker as itself, a workers:read caller for
	// anyone.
	if resp, b := e.Do(req{Method: http.MethodPost, Path: "/v1/workers/heartbeat", Body: mailplanetest.MustJSON(t, heartbeatOf(workerID))}); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("own heartbeat: %d %s", resp.StatusCode, b)
	}
	for _, r := range []req{
		{Method: http.MethodGet, Path: "/v1/workers/" + workerID + "/assignments"},
		{Method: http.MethodGet, Path: "/v1/workers/" + otherWorkerID + "/assignments", Token: readerToken},
	} {
		if resp, b := e.Do(r); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", r.Path, resp.StatusCode, b)
		}
	}
}

// knownSet is a KnownWorkers over a fixed set.
type knownSet struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (k *knownSet) KnownWorkers(_ context.Context, ids []string) (map[string]bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string]bool{}
	for _, id := range ids {
		if k.ids[id] {
			out[id] = true
		}
	}
	return out, nil
}

// TestWorkerIDFlood: one credential cannot flood placement with new worker
// ids. A batch of 1,000 random ids through /v1/events is refused whole
// (429, nothing produced); worker credentials of 40 random ids (what a
// fleet-secret holder could mint) get through the burst and no further,
// and the heartbeats on the log are exactly those admitted; known workers
// and an admitted worker's next heartbeat are not limited.
func TestWorkerIDFlood(t *testing.T) {
	t.Parallel()
	const burst = 5
	known := &knownSet{ids: map[string]bool{otherWorkerID: true}}
	lim := workerapi.NewWorkerLimiter(known, 0.0001, burst, nil)
	e := newEnvWith(t, []api.Option{api.WithAdmission(lim.Admit)})
	rnd := rand.New(rand.NewPCG(9, 9))
	newID := func() string {
		var b [16]byte
		for i := range b {
			b[i] = byte(rnd.Uint32())
		}
		return uuid.Must(uuid.FromBytes(b[:])).String()
	}

	batch := make([]map[string]any, 1000)
	for i := range batch {
		batch[i] = map[string]any{"specversion": "1.0", "id": domain.NewEventID(), "type": domain.TypeWorkerHeartbeat,
			"source": "/sending-workers", "data": heartbeatOf(newID())}
	}
	resp, b := e.Do(req{Method: http.MethodPost, Path: "/v1/events", ContentType: api.ContentTypeBatch, Body: mailplanetest.MustJSON(t, batch), Token: fleetToken})
	if resp.StatusCode != http.StatusTooManyRequests || errCode(t, b) != domain.CodeRateLimited || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("1,000 new ids: %d %s", resp.StatusCode, b)
	}
	e.assertNothingProduced()

	admitted := 0
	var first string
	for i := range 40 {
		id := newID()
		resp, b := e.Do(req{Method: http.MethodPost, Path: "/v1/workers/heartbeat", Body: mailplanetest.MustJSON(t, heartbeatOf(id)),
			Token: access.WorkerToken(fleetSecret, id)})
		switch resp.StatusCode {
		case http.StatusAccepted:
			admitted++
			if first == "" {
				first = id
			}
		case http.StatusTooManyRequests:
			if errCode(t, b) != domain.CodeRateLimited || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("heartbeat %d: %s %v", i, b, resp.Header)
			}
		default:
			t.Fatalf("heartbeat %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if admitted != burst {
		t.Fatalf("%d new worker ids admitted, want the burst %d", admitted, burst)
	}
	if moved := e.produced(); moved != burst {
		t.Fatalf("%d heartbeats on the log, want %d", moved, burst)
	}
	// Not limited: an admitted worker again, a worker placement knows.
	for _, id := range []string{first, otherWorkerID} {
		resp, b := e.Do(req{Method: http.MethodPost, Path: "/v1/workers/heartbeat", Body: mailplanetest.MustJSON(t, heartbeatOf(id)),
			Token: access.WorkerToken(fleetSecret, id)})
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("%s: %d %s", id, resp.StatusCode, b)
		}
	}
}

// TestKnownWorkersFromPlacement: the Postgres store tells the ids in
// placement_workers from the others.
func TestKnownWorkersFromPlacement(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, `INSERT INTO placement_workers (worker_id, base_tier, tier, egress, address, pool,
  releasing, health, first_seen_ns, last_seen_ns, live, stopping, load_milli, capacity, mailboxes, decision_offset)
VALUES ($1, 'shared_free', 'shared_free', 'cold_smtp', '10.0.0.7:25', 'clean', false, 'healthy', 1, 1, true, false, 0, 10, 0, 0)`, workerID); err != nil {
		t.Fatal(err)
	}
	got, err := postgres.NewStore(pool).KnownWorkers(ctx, []string{workerID, otherWorkerID})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(map[string]bool{workerID: true}) {
		t.Fatalf("known %v", got)
	}
}
