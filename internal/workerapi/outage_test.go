package workerapi_test

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/internal/workerapi"
)

// flakyKnown is a KnownWorkers over a fixed set that fails while down,
// as the Postgres store does while Postgres is unreachable.
type flakyKnown struct {
	knownSet
	mu   sync.Mutex
	down bool
	asks int
}

func (k *flakyKnown) KnownWorkers(ctx context.Context, ids []string) (map[string]bool, error) {
	k.mu.Lock()
	k.asks++
	down := k.down
	k.mu.Unlock()
	if down {
		return nil, errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	}
	return k.knownSet.KnownWorkers(ctx, ids)
}

func (k *flakyKnown) setDown(down bool) {
	k.mu.Lock()
	k.down = down
	k.mu.Unlock()
}

// heartbeatAs posts id's heartbeat with id's own credential.
func (e *env) heartbeatAs(id string) (*http.Response, []byte) {
	e.t.Helper()
	return e.Do(req{Method: http.MethodPost, Path: "/v1/workers/heartbeat", Body: mailplanetest.MustJSON(e.t, heartbeatOf(id)),
		Token: access.WorkerToken(fleetSecret, id)})
}

// newIDs returns n worker ids from a fixed seed.
func newIDs(seed uint64, n int) []string {
	rnd := rand.New(rand.NewPCG(seed, seed))
	out := make([]string, n)
	for i := range out {
		var b [16]byte
		for j := range b {
			b[j] = byte(rnd.Uint32())
		}
		out[i] = uuid.Must(uuid.FromBytes(b[:])).String()
	}
	return out
}

// TestHeartbeatsWhilePostgresIsDown: while the store of known workers
// fails (Postgres down), a worker placement knew and a worker admitted
// before the outage heartbeat as usual (202, the store not asked), and an
// id the limiter never saw is charged to the new-worker bucket instead of
// refused 503: admitted while it has tokens, 429 rate_limited after.
// Before, every heartbeat not admitted in the last ten minutes got 503
// and the whole fleet was declared dead.
func TestHeartbeatsWhilePostgresIsDown(t *testing.T) {
	t.Parallel()
	known := &flakyKnown{knownSet: knownSet{ids: map[string]bool{otherWorkerID: true}}}
	reg := prometheus.NewRegistry()
	lim := workerapi.NewWorkerLimiter(known, 0.0001, 2, reg)
	e := newEnvWith(t, []api.Option{api.WithAdmission(lim.Admit)})
	ids := newIDs(23, 3) // ids[0] is admitted before the outage, the others are new during it

	for _, id := range []string{otherWorkerID, ids[0]} {
		if resp, b := e.heartbeatAs(id); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("%s before the outage: %d %s", id, resp.StatusCode, b)
		}
	}
	known.setDown(true)
	known.mu.Lock()
	asked := known.asks
	known.mu.Unlock()
	for range 5 {
		for _, id := range []string{otherWorkerID, ids[0]} {
			if resp, b := e.heartbeatAs(id); resp.StatusCode != http.StatusAccepted {
				t.Fatalf("%s during the outage: %d %s", id, resp.StatusCode, b)
			}
		}
	}
	known.mu.Lock()
	if known.asks != asked {
		t.Errorf("the store was asked %d times about remembered workers", known.asks-asked)
	}
	known.mu.Unlock()
	// The bucket had 2 tokens; ids[0] took one.
	if resp, b := e.heartbeatAs(ids[1]); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("a new id during the outage, with a token left: %d %s", resp.StatusCode, b)
	}
	resp, b := e.heartbeatAs(ids[2])
	if resp.StatusCode != http.StatusTooManyRequests || errCode(t, b) != domain.CodeRateLimited || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a new id during the outage, the bucket empty: %d %s", resp.StatusCode, b)
	}
	if resp, b := e.heartbeatAs(ids[1]); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("the id admitted during the outage, again: %d %s", resp.StatusCode, b)
	}
	for outcome, want := range map[string]float64{"known": 1, "admitted": 1, "unchecked": 1, "limited": 1} {
		if got := mailplanetest.Metric(t, reg, "mailplane_workerapi_new_workers_total", "outcome", outcome); got != want {
			t.Errorf("outcome %s: %v, want %v", outcome, got, want)
		}
	}
}

// proxy forwards loopback connections to target until cut.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(s, c); s.Close() })
		p.wg.Go(func() { _, _ = io.Copy(c, s); c.Close() })
	}
}

// cut closes the listener and every connection: the server is gone.
func (p *proxy) cut() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestHeartbeatsThroughARealPostgresOutage: the Postgres store behind a
// connection that is cut (the pool's server gone): a worker placement
// knew keeps heartbeating, and a new id is charged to the bucket.
func TestHeartbeatsThroughARealPostgresOutage(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := db.Exec(ctx, `INSERT INTO placement_workers (worker_id, base_tier, tier, egress, address, pool,
  releasing, health, first_seen_ns, last_seen_ns, live, stopping, load_milli, capacity, mailboxes, decision_offset)
VALUES ($1, 'shared_free', 'shared_free', 'cold_smtp', '10.0.0.7:25', 'clean', false, 'healthy', 1, 1, true, false, 0, 10, 0, 0)`, workerID); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(pgtest.URLWithSchema(t, pgtest.SchemaName(db)))
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, u.Host)
	u.Host = px.ln.Addr().String()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	lim := workerapi.NewWorkerLimiter(postgres.NewStore(pool), 0.0001, 1, nil)
	e := newEnvWith(t, []api.Option{api.WithAdmission(lim.Admit)})

	if resp, b := e.heartbeatAs(workerID); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("before the outage: %d %s", resp.StatusCode, b)
	}
	px.cut()
	if err := pool.Ping(ctx); err == nil {
		t.Fatal("the pool still reaches Postgres")
	}
	for i := range 5 {
		if resp, b := e.heartbeatAs(workerID); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("heartbeat %d during the outage: %d %s", i, resp.StatusCode, b)
		}
	}
	ids := newIDs(29, 2)
	if resp, b := e.heartbeatAs(ids[0]); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("a new id during the outage, with the token: %d %s", resp.StatusCode, b)
	}
	if resp, b := e.heartbeatAs(ids[1]); resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(b), string(domain.CodeRateLimited)) {
		t.Fatalf("a second new id during the outage: %d %s", resp.StatusCode, b)
	}
}
