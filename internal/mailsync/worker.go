// Package mailsync runs the IMAP sync of the mailbox fleet on sync workers.
// Kafka consumer-group ownership of mailbox.state partitions, not leases,
// decides which worker runs which mailbox; Postgres fencing epochs make the
// seconds in which two members may both believe they own a partition
// harmless; tiers decide how eagerly each mailbox is synced.
//
// A Worker is one member of the sync group on mailbox.state:
//
//   - On assignment of a partition it takes the partition's next epoch in
//     Postgres, reads the partition to its end (the live set) and the
//     co-partitioned sync.tier partition (the tiers the previous owner
//     decided), then starts a runner per live, enabled mailbox. Later
//     records start, restart and stop runners; a tombstone or a disabled
//     record stops the runner as soon as the record is fetched.
//   - On revoke or loss it stops the partition's runners and waits for
//     them before the callback returns.
//   - Every runner write goes through a fenced Writer (see Fence): a write
//     at an epoch that is no longer the partition's is refused, rolled back,
//     counted and recorded.
//   - A watchdog stops every runner when no group request has been answered
//     for SessionTimeout - WatchdogMargin (a rebalance waiting for a dead
//     member is not silence: the coordinator answers the watchdog's own
//     heartbeats with REBALANCE_IN_PROGRESS while it holds the member). A fenced write stops its
//     partition's runners likewise. Either way the runners come back, under
//     a new epoch, only once two heartbeats sent afterwards were answered
//     while the partition is still assigned.
//   - Tiers (hot, warm, cold) are decided by the owner, on a cadence and on
//     events (EvaluateTiers); a user.active promotes the user's mailboxes at
//     once (their runners are told in memory; the record follows).
//   - Tier changes are recorded like any other write of the partition: the
//     mailbox's sync.tier record (a new owner inherits it) and its
//     sync.audit tier_changed event are queued in the transactional outbox
//     (package outbox) in a transaction fenced on the partition's epoch. A
//     change decided under an epoch that moved on is rolled back, counted
//     and recorded as a fenced write, and never published; the partition's
//     runners stop as for a runner's fenced write. Ownership acquired is
//     queued in the transaction that takes the epoch; ownership lost and
//     suspended go through the outbox too, unfenced (they are the
//     worker's history, true whatever the epoch). An outbox relay publishes
//     committed records in commit order per key: each worker runs one
//     unless Config.NoOutboxRelay says the process runs its own.
//
// A Worker composes parts that each own one concern: ownership (the
// partitions owned and their epochs, with Fence the fenced write path:
// ownership.go, fence.go), the supervisor (one runner per live mailbox,
// restarts, backoff: supervise.go) and its watchdog (watchdog.go), tiering
// (tiering.go) and the outbox queue its records and ownership events go
// through (outboxqueue.go). The worker keeps the live set (liveset.go) and
// moves partitions through their life (partitions.go). Every time it
// records or decides on comes from one clock, Config.Now; only elapsed
// times of waits on the network (the watchdog's silence, load stalls,
// backoffs) are measured on the monotonic clock.
//
// Runners sit behind the Runner interface; RecordingRunner is the stand-in
// until the IMAP runner exists.
package mailsync

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/consume"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

// Worker is one sync worker. Create it with New and run it with Run.
type Worker struct {
	cfg  Config
	kcfg kafka.Config
	pool *pgxpool.Pool
	log  *slog.Logger
	m    *metrics
	// lag measures the worker as a member of the sync consumer
	// (internal/sla): lag per owned mailbox.state partition, at the
	// positions the live set reached (consume.MeteredByEffect).
	lag *sla.Meter

	own   *ownership
	sup   *supervisor
	wd    *watchdog
	tiers *tiering
	queue *outboxQueue

	cons *consume.Consumer // the group consumer of mailbox.state
	cl   *kgo.Client       // its client (commits of positions for lag tools)
	out  *kgo.Client       // sync.failed's producer, the watchdog's probes, admin requests
	adm  *kadm.Client

	// mu guards the live set: the partitions' mailboxes and the index
	// by user. It is taken before the locks of the parts above.
	mu      sync.Mutex
	parts   map[int32]*partition
	byUser  userIndex
	started bool
	// lastCommit is when positions were last committed to the group
	// (poll loop only).
	lastCommit time.Time

	// poll is the group consumer once connected: wake ends its poll.
	poll atomic.Pointer[consume.Consumer]
}

// New returns a worker consuming through kcfg's brokers, writing through
// pool (whose search_path must hold the sync tables) and running mailboxes
// with runner. It connects to nothing until Run.
func New(kcfg kafka.Config, pool *pgxpool.Pool, runner Runner, cfg Config) (*Worker, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if pool == nil || runner == nil {
		return nil, errors.New("mailsync: New needs a pool and a runner")
	}
	if len(kcfg.Brokers) == 0 {
		return nil, errors.New("mailsync: no brokers")
	}
	if kcfg.ClientID == "" {
		kcfg.ClientID = "mailplane-sync-" + cfg.WorkerID
	}
	// From here on the group is the broker's name for it.
	cfg.Group = kcfg.Group(cfg.Group)
	m := newMetrics(cfg.Registerer)
	log := cfg.Logger.With("worker", cfg.WorkerID)
	// Every client of the worker logs through its logger (the Kafka kit
	// keeps a logger the caller set).
	kcfg = kcfg.WithLogger(log)
	fence := NewFence(pool, m.fencedWrites, cfg.WriteIdleTimeout)
	w := &Worker{
		cfg:    cfg,
		kcfg:   kcfg,
		pool:   pool,
		log:    log,
		m:      m,
		lag:    sla.NewMeter(cfg.Registerer, sla.Sync),
		own:    newOwnership(fence, cfg.WorkerID, m),
		sup:    newSupervisor(runner, cfg, log, m),
		wd:     newWatchdog(cfg, log, m),
		queue:  newOutboxQueue(pool, fence, cfg.WorkerID, log),
		parts:  map[int32]*partition{},
		byUser: userIndex{},
	}
	w.tiers = newTiering(cfg, kcfg, log, m, w.queue)
	w.sup.failed, w.sup.fenced = w.failed, w.fenced
	w.queue.fenced = w.tierWritesFenced
	return w, nil
}

// ID returns the worker's id (its owner name).
func (w *Worker) ID() string { return w.cfg.WorkerID }

// Config returns the worker's configuration, defaults applied.
func (w *Worker) Config() Config { return w.cfg }

// Run joins the group and runs the mailboxes of the partitions it is
// assigned until ctx is done; then it stops every runner, leaves the group
// and returns nil. It returns an error only if it cannot start.
func (w *Worker) Run(ctx context.Context) error {
	w.mu.Lock()
	started := w.started
	w.started = true
	w.mu.Unlock()
	if started {
		return errors.New("mailsync: worker already running")
	}
	if err := w.connect(ctx); err != nil {
		return err
	}
	stopRelay := w.startRelay(ctx)
	w.log.Info("sync worker starting", "group", w.cfg.Group, "session_timeout", w.cfg.SessionTimeout,
		"heartbeat_interval", w.cfg.HeartbeatInterval, "watchdog_after", w.cfg.SessionTimeout-w.cfg.WatchdogMargin)

	bg, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { w.tiers.followUsers(ctx, w.usersActive) })
	wg.Go(func() { w.wd.loop(ctx, func() bool { return len(w.own.active()) > 0 }, w.suspendAll, w.wake) })
	wg.Go(func() { w.wd.probe(ctx, w.cl, w.out) })
	wg.Go(func() { w.tiers.evalLoop(ctx, w.evaluate) })
	recDone := make(chan struct{})
	go func() { defer close(recDone); w.queue.loop(bg) }()

	// Polls, applies and housekeeps until ctx is done, then stops the
	// runners and leaves the group (the handler never fails).
	_ = w.cons.Run(ctx)
	// Whatever the leave's revoke did not stop (a leave past its bound).
	w.dropAll()
	wg.Wait()
	stopBg()
	<-recDone
	w.awaitRecordsPublished()
	stopRelay()
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := w.out.Flush(fctx); err != nil {
		w.log.Warn("flushing sync.failed records", "err", err)
	}
	cancel()
	w.out.Close()
	w.log.Info("sync worker stopped")
	return nil
}

// connect builds the worker's producer and its group member.
func (w *Worker) connect(ctx context.Context) error {
	out, err := newOutClient(w.kcfg)
	if err != nil {
		return err
	}
	w.out, w.adm = out, kadm.NewClient(out)
	w.checkCoPartitioned(ctx)
	cons, err := newGroupConsumer(w.kcfg, w.cfg, w.log, groupCallbacks{
		assigned: w.assigned,
		revoked: func(_ context.Context, _ *consume.Consumer, m map[string][]int32) {
			w.drop(m[w.kcfg.Topic(topics.MailboxState)], domain.SyncLostRevoked)
		},
		lost: func(_ context.Context, _ *consume.Consumer, m map[string][]int32) {
			w.drop(m[w.kcfg.Topic(topics.MailboxState)], domain.SyncLostLost)
		},
		hook:        w.wd,
		beforeLeave: w.sup.close,
	}, w.lag, w.handle)
	if err != nil {
		out.Close()
		return err
	}
	w.cons, w.cl = cons, cons.Client()
	w.poll.Store(cons)
	return nil
}

// startRelay runs the worker's outbox relay, unless Config.NoOutboxRelay;
// the returned func stops it and waits for it.
func (w *Worker) startRelay(ctx context.Context) (stop func()) {
	if w.cfg.NoOutboxRelay {
		return func() {}
	}
	relay := newRelay(w.pool, w.kcfg, w.log, w.cfg.Registerer)
	relayCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); _ = relay.Run(relayCtx) }()
	return func() { cancel(); <-done }
}

// awaitRecordsPublished gives the relay (ours or another process's) a
// moment to publish our last records; whatever is left stays in the outbox
// for the next relay.
func (w *Worker) awaitRecordsPublished() {
	if w.cfg.NoOutboxRelay {
		return
	}
	dctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := awaitPublished(dctx, w.pool, time.Second, topics.SyncTier, topics.SyncAudit); err != nil {
		w.log.Warn("sync records left in the outbox at shutdown for the next relay", "err", err)
	}
}

// checkCoPartitioned warns when sync.tier does not have mailbox.state's
// partition count: tiers would then be recorded on partitions no owner
// reads, and every new owner would start its mailboxes warm.
func (w *Worker) checkCoPartitioned(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	state, tier := w.kcfg.Topic(topics.MailboxState), w.kcfg.Topic(topics.SyncTier)
	td, err := w.adm.ListTopics(ctx, state, tier)
	if err != nil {
		w.log.Warn("could not check that sync.tier is co-partitioned with mailbox.state", "err", err)
		return
	}
	s, t := td[state], td[tier]
	if s.Err == nil {
		w.m.statePartitions.Set(float64(len(s.Partitions)))
	}
	if s.Err == nil && t.Err == nil && len(s.Partitions) != len(t.Partitions) {
		w.log.Error("sync.tier is not co-partitioned with mailbox.state: tiers will not be inherited",
			"mailbox_state_partitions", len(s.Partitions), "sync_tier_partitions", len(t.Partitions))
	}
}

// handle applies a poll's mailbox.state records and does the housekeeping
// that must not race rebalance callbacks (the runtime blocks them until
// it returns).
func (w *Worker) handle(_ context.Context, b *consume.Batch) error {
	w.apply(b.Consumer(), b.Fetches)
	w.housekeeping(b.Consumer())
	return nil
}

// wake ends the group consumer's current poll early, so housekeeping runs
// now.
func (w *Worker) wake() {
	if c := w.poll.Load(); c != nil {
		c.Wake()
	}
}

// failed produces a runner's sync.failed event to sync.audit directly,
// asynchronously and without ever blocking; a failure, a full buffer
// included, is logged: it is history, not state anything depends on, and
// not a write made under an epoch. (Tier records, tier changes and
// ownership events go through the outbox: see outboxQueue.)
func (w *Worker) failed(job *Job, attempt int, err error) {
	w.audit(&domain.SyncFailed{MailboxID: job.Mailbox.MailboxID, Partition: job.Partition, Epoch: job.Epoch, Owner: w.cfg.WorkerID,
		Error: truncate(err.Error(), maxAuditErrorLen), Attempt: attempt, At: w.cfg.Now().UTC()})
}

func (w *Worker) audit(d domain.Data) {
	if w.out == nil {
		return
	}
	r, err := encodeRecord(w.kcfg.Topic(topics.SyncAudit), w.cfg.WorkerID, w.cfg.Now(), d)
	if err != nil {
		w.log.Error("encoding an audit event", "type", d.EventType(), "err", err)
		return
	}
	w.out.TryProduce(context.Background(), r, func(_ *kgo.Record, err error) {
		if err != nil {
			w.log.Warn("producing an audit event failed", "type", d.EventType(), "err", err)
		}
	})
}
