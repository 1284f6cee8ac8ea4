package outbox_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/internal/pgtest"
)

// restartable is an embedded broker restarted on the same port with
// what it persisted, as the production-shape test restarts its broker.
type restartable struct {
	t    *testing.T
	dir  string
	port int
	mu   sync.Mutex
	emb  *kafka.Embedded
}

func startRestartable(t *testing.T) *restartable {
	t.Helper()
	b := &restartable{t: t, dir: t.TempDir()}
	b.start()
	_, port, err := net.SplitHostPort(b.emb.Addrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	if b.port, err = strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.stop)
	return b
}

func (b *restartable) start() {
	b.mu.Lock()
	defer b.mu.Unlock()
	emb, err := kafka.StartEmbedded(kafka.WithPort(b.port), kafka.WithDataDir(b.dir), kafka.WithSyncWrites(),
		kafka.WithKfakeOptions(kfake.SeedTopics(2, topic)))
	if err != nil {
		b.t.Error(err)
		return
	}
	b.emb = emb
}

func (b *restartable) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.emb != nil {
		b.emb.Close()
		b.emb = nil
	}
}

func (b *restartable) addrs() []string {
	return []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))}
}

// syncBuffer is a log sink shared by a relay's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// relayStopBound is how long a relay told to stop may take: well within
// the 4 s a stopping process waits for it (internal/roles).
const relayStopBound = 3 * time.Second

// restartCase is one moment of a broker restart relative to a relay's
// work, and of the stop relative to the restart.
type restartCase struct {
	name string
	// downInProduce stops the broker between reading a batch and
	// producing it (else after a random time of publishing).
	downInProduce bool
	outage        time.Duration // the broker is away for up to this long
	after         time.Duration // the stop comes up to this long after the restart
	stopWhileDown bool          // the stop comes while the broker is away
	// staggered stops the relays one after the other, as a process stops
	// its relay after its other roles: the standby of a process still
	// stopping takes over from the publisher of a process that stopped.
	staggered bool
}

// A relay told to stop after a broker restart stops within its bound,
// whatever the moment of the restart: between rounds, while its batch
// is produced, while its transaction ends, while it takes its producer
// id on the broker that came back. Seen in the production-shape test: a
// relay still running 10 s after SIGTERM, after the broker restart.
func TestRelayStopsAfterABrokerRestart(t *testing.T) {
	t.Parallel()
	cases := []restartCase{
		{name: "between rounds", outage: 1200 * time.Millisecond, after: 1500 * time.Millisecond},
		{name: "mid produce", downInProduce: true, outage: 1200 * time.Millisecond, after: 1500 * time.Millisecond},
		{name: "long outage", downInProduce: true, outage: 5 * time.Second, after: 3 * time.Second},
		{name: "stop while down", downInProduce: true, outage: 2 * time.Second, stopWhileDown: true},
		{name: "staggered stop", downInProduce: true, outage: 1200 * time.Millisecond, after: 1500 * time.Millisecond, staggered: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Schema(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := migrations.Apply(ctx, pool); err != nil {
				t.Fatal(err)
			}
			b := startRestartable(t)
			rounds := uint64(6)
			switch {
			case c.outage > 2*time.Second:
				rounds = 2
			case c.staggered:
				rounds = 4
			}
			var next atomic.Int64
			for seed := range rounds {
				restartOnce(t, pool, b, c, seed, &next)
			}
		})
	}
}

func restartOnce(t *testing.T, pool *pgxpool.Pool, b *restartable, c restartCase, seed uint64, next *atomic.Int64) {
	rng := rand.New(rand.NewPCG(seed, 11))
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var armed atomic.Bool
	downed := make(chan struct{})
	hook := outbox.WithBeforeProduce(func() {
		if armed.CompareAndSwap(true, false) {
			b.stop()
			close(downed)
		}
	})
	var (
		rcancel [2]context.CancelFunc
		done    [2]chan struct{}
	)
	for i := range 2 { // a publisher and a standby, as in compose
		rctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		rcancel[i], done[i] = cancel, make(chan struct{})
		go func() {
			defer close(done[i])
			_ = outbox.NewRelay(pool, kafka.Config{Brokers: b.addrs(), ClientID: fmt.Sprintf("relay-%d-%d", seed, i), Registerer: prometheus.NewRegistry()},
				outbox.WithPollInterval(50*time.Millisecond), outbox.WithLogger(log.With("relay", i)), hook).Run(rctx)
		}()
	}
	wctx, wcancel := context.WithCancel(context.Background())
	var writer sync.WaitGroup
	defer writer.Wait()
	defer wcancel()
	writer.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 12)) // the writer's own: rand.Rand is not safe to share
		for wctx.Err() == nil {
			n := next.Add(1)
			if err := addOne(wctx, pool, &kgo.Record{Topic: topic, Key: []byte("k" + strconv.FormatInt(n%7, 10)), Value: []byte(strconv.FormatInt(n, 10))}); err != nil && wctx.Err() == nil {
				t.Errorf("add: %v", err)
				return
			}
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		}
	})
	time.Sleep(time.Duration(200+rng.IntN(300)) * time.Millisecond) // publishing
	if c.downInProduce {
		armed.Store(true)
		select {
		case <-downed:
		case <-time.After(5 * time.Second):
			t.Fatalf("seed %d: no batch produced in 5 s", seed)
		}
	} else {
		b.stop()
	}
	time.Sleep(c.outage/2 + time.Duration(rng.Int64N(int64(c.outage/2)))) // the outage
	if !c.stopWhileDown {
		b.start()
		time.Sleep(time.Duration(rng.Int64N(int64(c.after)))) // after the restart
	}
	wcancel()
	writer.Wait()
	bound := relayStopBound
	if c.stopWhileDown {
		// Nothing to wait for: the Kafka client's Close returns at once
		// (no last metrics push to a broker that is away).
		bound = 500 * time.Millisecond
	}
	if c.staggered {
		for i := range 2 {
			start := time.Now()
			rcancel[i]()
			waitStopped(t, seed, logs, bound, start, done[i])
			// The other relay goes on, and may take over, for a while.
			time.Sleep(time.Duration(rng.IntN(1000)) * time.Millisecond)
		}
	} else {
		start := time.Now()
		rcancel[0]()
		rcancel[1]()
		waitStopped(t, seed, logs, bound, start, done[:]...)
	}
	if c.stopWhileDown {
		b.start()
	}
}

// waitStopped waits for the relays' done channels, dumping every
// goroutine's stack and the relays' logs if one still runs after bound.
func waitStopped(t *testing.T, seed uint64, logs *syncBuffer, bound time.Duration, start time.Time, done ...chan struct{}) {
	t.Helper()
	timer := time.NewTimer(time.Until(start.Add(bound)))
	defer timer.Stop()
	for _, d := range done {
		select {
		case <-d:
		case <-timer.C:
			var stacks bytes.Buffer
			_ = pprof.Lookup("goroutine").WriteTo(&stacks, 2)
			fmt.Fprintf(os.Stderr, "%s seed %d: relay logs:\n%s\ngoroutines:\n%s\n", t.Name(), seed, logs.String(), stacks.String())
			t.Fatalf("seed %d: a relay did not stop %s after its context ended", seed, bound)
		}
	}
	t.Logf("seed %d: stopped in %s", seed, time.Since(start).Round(time.Millisecond))
}

// addOne commits rec to the outbox (add, from a goroutine other than the
// test's).
func addOne(ctx context.Context, pool *pgxpool.Pool, rec *kgo.Record) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, rec) })
}
