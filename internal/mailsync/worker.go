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
//     events (domain.EvaluateSyncTiers); a user.active promotes the user's mailboxes at
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
// Runners sit behind the Runner interface; RecordingRunner is the stand-in
// until the IMAP runner exists.
package mailsync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/topics"
)

// Worker is one sync worker. Create it with New and run it with Run.
type Worker struct {
	cfg    Config
	kcfg   kafka.Config
	pool   *pgxpool.Pool
	runner Runner
	log    *slog.Logger
	m      *metrics
	fence  *Fence
	pacer  *hostPacer
	wd     *watchdog

	cl  *kgo.Client // the group consumer of mailbox.state
	out *kgo.Client // the outbox relay's and sync.failed's producer, and admin requests
	adm *kadm.Client

	mu            sync.Mutex
	cond          *sync.Cond // signalled when a runner goroutine exits
	parts         map[int32]*partition
	byUser        map[string]map[string]*mbox
	sessions      map[string]time.Time
	pending       []pendingWrite // for the outbox, in order (recordLoop)
	closing       bool
	running       bool
	usersCaughtUp bool

	kickEval   chan struct{}
	kickRecord chan struct{}
	flushing   chan struct{} // held by the one flushPending running

	pollMu     sync.Mutex
	pollCancel context.CancelFunc
}

type partState int

const (
	partAcquiring partState = iota // assigned; no epoch yet
	partLoading                    // epoch taken; reading to the end
	partLive                       // runners running
	partSuspended                  // runners stopped (watchdog, fenced); waiting for the group's confirmation
)

func (s partState) String() string {
	return [...]string{"acquiring", "loading", "live", "suspended"}[s]
}

// partition is one assigned mailbox.state partition.
type partition struct {
	id         int32
	epoch      int64
	state      partState
	assignedAt time.Time
	counted    bool // in the partitions_owned gauge
	measured   bool // assignment duration observed

	lastAttempt  time.Time // of taking an epoch
	startOffset  int64
	endOffset    int64 // last stable offset when assigned; -1 unknown
	nextOffset   int64
	loadingSince time.Time
	lastProgress time.Time
	tiersLoaded  bool
	inherited    map[string]domain.SyncTierRecord

	boxes    map[string]*mbox
	stopping map[string]chan struct{} // runners stopped but maybe not yet returned
	running  int                      // runner goroutines alive

	suspendedAt   time.Time
	suspendReason string
}

// mbox is one live mailbox of an owned partition.
type mbox struct {
	rec          domain.MailboxStateRecord
	part         *partition
	box          *tierBox
	mailKnown    bool
	newestMail   time.Time
	trackedSince time.Time
	run          *runHandle
	// unrecorded: a tier change of the mailbox was refused by the fence;
	// its tier is recorded again under the partition's next epoch, as a
	// change from unrecordedFrom (the refused change's from).
	unrecorded     bool
	unrecordedFrom domain.SyncTier
}

type runHandle struct {
	cancel context.CancelFunc
	done   chan struct{}
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
	m := newMetrics(cfg.Registerer)
	w := &Worker{
		cfg:        cfg,
		kcfg:       kcfg,
		pool:       pool,
		runner:     runner,
		log:        cfg.Logger.With("worker", cfg.WorkerID),
		m:          m,
		fence:      NewFence(pool, m.fencedWrites, cfg.WriteIdleTimeout),
		pacer:      newHostPacer(cfg.ConnectRatePerHost, cfg.ConnectBurstPerHost),
		wd:         &watchdog{},
		parts:      map[int32]*partition{},
		byUser:     map[string]map[string]*mbox{},
		sessions:   map[string]time.Time{},
		kickEval:   make(chan struct{}, 1),
		kickRecord: make(chan struct{}, 1),
		flushing:   make(chan struct{}, 1),
	}
	w.cond = sync.NewCond(&w.mu)
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
	if w.running {
		w.mu.Unlock()
		return errors.New("mailsync: worker already running")
	}
	w.running = true
	w.mu.Unlock()

	out, err := kafka.NewProducer(w.kcfg.WithClientID(w.kcfg.ClientID+"-out"),
		kgo.WithLogger(kgoLogger{w.log}))
	if err != nil {
		return fmt.Errorf("mailsync: producer: %w", err)
	}
	w.out, w.adm = out, kadm.NewClient(out)
	w.checkCoPartitioned(ctx)

	opts := kafka.ConsumerOptions(w.kcfg, kafka.GroupConfig{
		Group: w.cfg.Group, Topics: []string{topics.MailboxState},
		SessionTimeout: w.cfg.SessionTimeout, HeartbeatInterval: w.cfg.HeartbeatInterval,
	},
		// Records reach the poll loop only for partitions it owns, and
		// rebalance callbacks never run while it applies them.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(w.assigned),
		kgo.OnPartitionsRevoked(w.revoked),
		kgo.OnPartitionsLost(w.lost),
		kgo.RebalanceTimeout(w.cfg.RebalanceTimeout),
		// Control records too, so that reading a partition "to its end"
		// (the last stable offset) sees every offset up to it.
		kgo.KeepControlRecords(),
		kgo.WithHooks(w.wd),
		kgo.WithLogger(kgoLogger{w.log}),
	)
	opts = append(opts, w.cfg.KgoOptions...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		out.Close()
		return fmt.Errorf("mailsync: consumer: %w", err)
	}
	w.cl = cl
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	relayDone := make(chan struct{})
	if w.cfg.NoOutboxRelay {
		close(relayDone)
	} else {
		rcfg := w.kcfg.WithClientID(w.kcfg.ClientID + "-outbox")
		relay := outbox.NewRelay(w.pool, rcfg, outbox.WithLogger(w.log.With("component", "outbox-relay")),
			outbox.WithRegisterer(lenientRegisterer{w.cfg.Registerer}))
		go func() { defer close(relayDone); _ = relay.Run(relayCtx) }()
	}
	w.log.Info("sync worker starting", "group", w.cfg.Group, "session_timeout", w.cfg.SessionTimeout,
		"heartbeat_interval", w.cfg.HeartbeatInterval, "watchdog_after", w.cfg.SessionTimeout-w.cfg.WatchdogMargin)

	bg, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { w.followUsers(ctx) })
	wg.Go(func() { w.watchdogLoop(ctx) })
	wg.Go(func() { w.probeLoop(ctx) })
	wg.Go(func() { w.evalLoop(ctx) })
	recDone := make(chan struct{})
	go func() { defer close(recDone); w.recordLoop(bg) }()

	w.pollLoop(ctx)

	// Leaving revokes every partition (stopping its runners) before the
	// LeaveGroup, so the next owners find every write of ours committed.
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	closed := make(chan struct{})
	go func() { cl.CloseAllowingRebalance(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(w.cfg.RebalanceTimeout):
		w.log.Warn("leaving the group did not finish in time; stopping runners anyway")
	}
	w.dropAll()
	wg.Wait()
	stopBg()
	<-recDone
	if !w.cfg.NoOutboxRelay {
		// Give the relay (ours or another process's) a moment to
		// publish our last records; whatever is left stays in the outbox
		// for the next relay.
		dctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		if err := awaitPublished(dctx, w.pool, time.Second, topics.SyncTier, topics.SyncAudit); err != nil {
			w.log.Warn("sync records left in the outbox at shutdown for the next relay", "err", err)
		}
		cancel()
	}
	stopRelay()
	<-relayDone
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := out.Flush(fctx); err != nil {
		w.log.Warn("flushing sync.failed records", "err", err)
	}
	cancel()
	out.Close()
	w.log.Info("sync worker stopped")
	return nil
}

// checkCoPartitioned warns when sync.tier does not have mailbox.state's
// partition count: tiers would then be recorded on partitions no owner
// reads, and every new owner would start its mailboxes warm.
func (w *Worker) checkCoPartitioned(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	td, err := w.adm.ListTopics(ctx, topics.MailboxState, topics.SyncTier)
	if err != nil {
		w.log.Warn("could not check that sync.tier is co-partitioned with mailbox.state", "err", err)
		return
	}
	s, t := td[topics.MailboxState], td[topics.SyncTier]
	if s.Err == nil && t.Err == nil && len(s.Partitions) != len(t.Partitions) {
		w.log.Error("sync.tier is not co-partitioned with mailbox.state: tiers will not be inherited",
			"mailbox_state_partitions", len(s.Partitions), "sync_tier_partitions", len(t.Partitions))
	}
}

// pollLoop applies mailbox.state records and does the housekeeping that
// must not race rebalance callbacks.
func (w *Worker) pollLoop(ctx context.Context) {
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
		w.pollMu.Lock()
		w.pollCancel = cancel
		w.pollMu.Unlock()
		fs := w.cl.PollRecords(pctx, 20000)
		w.pollMu.Lock()
		w.pollCancel = nil
		w.pollMu.Unlock()
		cancel()
		if fs.IsClientClosed() {
			w.cl.AllowRebalance()
			return
		}
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				w.log.Warn("fetch error", "topic", t, "partition", p, "err", err)
			}
		})
		w.apply(fs)
		w.housekeeping()
		w.cl.AllowRebalance()
	}
}

// wake ends the current poll early so housekeeping runs now.
func (w *Worker) wake() {
	w.pollMu.Lock()
	defer w.pollMu.Unlock()
	if w.pollCancel != nil {
		w.pollCancel()
	}
}

// apply folds fetched mailbox.state records into the owned partitions'
// live sets, starting, restarting and stopping runners.
func (w *Worker) apply(fs kgo.Fetches) {
	if fs.NumRecords() == 0 {
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	kick := false
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		part := w.parts[fp.Partition]
		if part == nil || fp.Topic != topics.MailboxState {
			return
		}
		for _, r := range fp.Records {
			part.nextOffset = r.Offset + 1
			part.lastProgress = now
			if r.Attrs.IsControl() {
				continue
			}
			m, live, err := mailboxstate.Decode(r)
			if err != nil {
				w.m.badRecords.Inc()
				w.log.Warn("skipping a mailbox.state record that does not decode", "partition", r.Partition, "offset", r.Offset, "err", err)
				continue
			}
			mb := part.boxes[string(r.Key)]
			switch {
			case !live:
				if mb != nil {
					w.removeLocked(mb)
					kick = true
				}
			case mb == nil:
				mb = w.addLocked(part, m, now)
				w.startLocked(mb)
				kick = true
			case !mb.rec.SameSync(m):
				w.stopLocked(mb)
				if mb.rec.UserID != m.UserID {
					w.unindexLocked(mb)
					mb.rec = m
					w.indexLocked(mb)
				} else {
					mb.rec = m
				}
				w.startLocked(mb)
			default:
				mb.rec = m
			}
		}
	})
	if kick {
		w.kick(w.kickEval)
	}
}

// addLocked tracks a new live mailbox of part, in the tier the previous
// owner left it in (default warm), hot at once if its user is in session.
func (w *Worker) addLocked(part *partition, m domain.MailboxStateRecord, now time.Time) *mbox {
	tier, reason := domain.SyncTierWarm, domain.SyncReasonDefault
	if rec, ok := part.inherited[m.MailboxID]; ok {
		tier, reason = rec.Tier, domain.SyncReasonInherited
	}
	mb := &mbox{rec: m, part: part, box: newTierBox(tier, reason), trackedSince: now}
	part.boxes[m.MailboxID] = mb
	w.indexLocked(mb)
	if part.state == partLive && w.inSessionLocked(m.UserID, w.cfg.Now()) {
		w.setTierLocked(mb, domain.SyncTierHot, domain.SyncReasonSession)
	}
	return mb
}

func (w *Worker) indexLocked(mb *mbox) {
	u := w.byUser[mb.rec.UserID]
	if u == nil {
		u = map[string]*mbox{}
		w.byUser[mb.rec.UserID] = u
	}
	u[mb.rec.MailboxID] = mb
}

func (w *Worker) unindexLocked(mb *mbox) {
	if u := w.byUser[mb.rec.UserID]; u != nil {
		delete(u, mb.rec.MailboxID)
		if len(u) == 0 {
			delete(w.byUser, mb.rec.UserID)
		}
	}
}

// removeLocked stops and forgets a removed mailbox and clears its tier
// record.
func (w *Worker) removeLocked(mb *mbox) {
	w.stopLocked(mb)
	delete(mb.part.boxes, mb.rec.MailboxID)
	w.unindexLocked(mb)
	if mb.part.state == partLive {
		w.queueLocked(pendingWrite{partition: mb.part.id, epoch: mb.part.epoch, mailboxID: mb.rec.MailboxID,
			recs: []*kgo.Record{tierTombstone(mb.rec.MailboxID)}})
	}
}

// startLocked starts mb's runner if its partition is live and it is
// enabled. A runner of the same mailbox still stopping is waited for first.
func (w *Worker) startLocked(mb *mbox) {
	part := mb.part
	if mb.run != nil || part.state != partLive || !mb.rec.Enabled || w.closing {
		return
	}
	id := mb.rec.MailboxID
	ctx, cancel := context.WithCancel(context.Background())
	h := &runHandle{cancel: cancel, done: make(chan struct{})}
	mb.run = h
	part.running++
	tier, _ := mb.box.get()
	w.m.runners.WithLabelValues(string(tier)).Inc()
	job := &Job{
		Mailbox: mb.rec, Partition: part.id, Epoch: part.epoch, Owner: w.cfg.WorkerID,
		Writer:   w.fence.Writer(part.id, part.epoch, w.cfg.WorkerID, id),
		PollWarm: w.cfg.PollWarm, PollCold: w.cfg.PollCold,
		box: mb.box, pacer: w.pacer,
		report: func(t time.Time, known bool) { w.reportMail(mb, t, known) },
	}
	prev := part.stopping[id]
	go w.runLoop(ctx, h, part, job, prev)
}

// stopLocked cancels mb's runner without waiting for it; its partition's
// running count says when it is gone.
func (w *Worker) stopLocked(mb *mbox) {
	h := mb.run
	if h == nil {
		return
	}
	h.cancel()
	mb.run = nil
	mb.part.stopping[mb.rec.MailboxID] = h.done
	tier, _ := mb.box.get()
	w.m.runners.WithLabelValues(string(tier)).Dec()
}

// runLoop runs one mailbox until ctx is done, restarting a failed runner
// after a backoff.
func (w *Worker) runLoop(ctx context.Context, h *runHandle, part *partition, job *Job, prev <-chan struct{}) {
	id := job.Mailbox.MailboxID
	defer func() {
		w.mu.Lock()
		part.running--
		if part.stopping[id] == h.done {
			delete(part.stopping, id)
		}
		w.cond.Broadcast()
		w.mu.Unlock()
		close(h.done)
	}()
	if prev != nil {
		select {
		case <-prev:
		case <-ctx.Done():
			return
		}
	}
	backoff := w.cfg.RestartBackoff
	for attempt := 1; ; attempt++ {
		err := w.safeRun(ctx, job)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrFenced) {
			w.log.Warn("a runner's write was fenced; stopping the partition's runners", "partition", part.id, "epoch", job.Epoch, "err", err)
			w.fenced(part, job.Epoch)
			return
		}
		if err == nil {
			err = errors.New("runner returned before it was stopped")
		}
		w.m.runnerFailures.Inc()
		w.log.Warn("runner failed; restarting after a backoff", "mailbox", id, "attempt", attempt, "err", err)
		w.audit(&domain.SyncFailed{MailboxID: id, Partition: part.id, Epoch: job.Epoch, Owner: w.cfg.WorkerID,
			Error: truncate(err.Error(), maxAuditErrorLen), Attempt: attempt, At: time.Now().UTC()})
		d := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		backoff = min(backoff*2, w.cfg.RestartMaxBackoff)
	}
}

// safeRun calls the runner, turning a panic into an error: one mailbox's
// bug must not take every other mailbox of the worker down.
func (w *Worker) safeRun(ctx context.Context, job *Job) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("runner panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return w.runner.Run(ctx, job)
}

// fenced suspends part after one of its runners' writes was refused.
func (w *Worker) fenced(part *partition, epoch int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.parts[part.id] != part || part.epoch != epoch || part.state != partLive {
		return
	}
	w.suspendLocked(part, domain.SyncSuspendedFenced)
}

// suspendLocked stops part's runners on the worker's own suspicion that it
// may have lost the partition. It does not wait for them.
func (w *Worker) suspendLocked(part *partition, reason string) int {
	n := 0
	for _, mb := range part.boxes {
		if mb.run != nil {
			w.stopLocked(mb)
			n++
		}
	}
	part.state = partSuspended
	part.suspendedAt = time.Now()
	part.suspendReason = reason
	w.uncountLocked(part)
	w.log.Warn("partition suspended: runners stopped", "partition", part.id, "epoch", part.epoch, "reason", reason, "runners", n)
	w.queueAuditLocked(part.id, &domain.SyncOwnershipSuspended{Partition: part.id, Epoch: part.epoch, Owner: w.cfg.WorkerID, Reason: reason, Runners: n, At: time.Now().UTC()})
	return n
}

func (w *Worker) countLocked(part *partition) {
	if !part.counted {
		part.counted = true
		w.m.partitionsOwned.Inc()
	}
}

func (w *Worker) uncountLocked(part *partition) {
	if part.counted {
		part.counted = false
		w.m.partitionsOwned.Dec()
	}
}

// waitStoppedLocked waits until no runner goroutine of parts is alive.
func (w *Worker) waitStoppedLocked(parts []*partition) {
	start := time.Now()
	warned := false
	for {
		busy := 0
		for _, p := range parts {
			busy += p.running
		}
		if busy == 0 {
			return
		}
		if !warned && time.Since(start) > 5*time.Second {
			warned = true
			w.log.Warn("runners are slow to stop", "running", busy)
		}
		w.cond.Wait()
	}
}

// suspendAll is the watchdog's action: stop every runner and wait.
func (w *Worker) suspendAll(reason string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	var parts []*partition
	n := 0
	for _, p := range w.parts {
		if p.state == partLive || p.state == partLoading {
			n += w.suspendLocked(p, reason)
			parts = append(parts, p)
		}
	}
	w.waitStoppedLocked(parts)
	return n
}

// activeLocked reports whether any partition is live or loading.
func (w *Worker) activeLocked() bool {
	for _, p := range w.parts {
		if p.state == partLive || p.state == partLoading {
			return true
		}
	}
	return false
}

// assigned takes epochs for newly assigned partitions and starts reading
// them. It runs while the poll loop is parked (BlockRebalanceOnPoll).
func (w *Worker) assigned(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	ids := slices.Sorted(slices.Values(m[topics.MailboxState]))
	if len(ids) == 0 {
		return
	}
	now := time.Now()
	w.mu.Lock()
	var fresh []int32
	for _, id := range ids {
		if w.parts[id] != nil {
			continue
		}
		w.parts[id] = &partition{id: id, state: partAcquiring, assignedAt: now, endOffset: -1,
			boxes: map[string]*mbox{}, stopping: map[string]chan struct{}{}}
		fresh = append(fresh, id)
	}
	w.mu.Unlock()
	if len(fresh) == 0 {
		return
	}
	w.m.rebalances.WithLabelValues("assigned").Inc()
	w.log.Info("partitions assigned", "partitions", fresh)
	w.acquire(fresh)
}

// acquire takes the next epoch of each partition (all still assigned and
// acquiring) and moves them to loading.
func (w *Worker) acquire(ids []int32) {
	ctx, cancel := context.WithTimeout(context.Background(), w.acquireTimeout())
	defer cancel()
	w.mu.Lock()
	for _, id := range ids {
		if p := w.parts[id]; p != nil {
			p.lastAttempt = time.Now()
		}
	}
	w.mu.Unlock()
	epochs, err := w.fence.Acquire(ctx, w.cfg.WorkerID, ids)
	if err != nil {
		w.log.Error("taking epochs failed; retrying", "partitions", ids, "err", err)
		return
	}
	starts, ends := w.listOffsets(ctx, topics.MailboxState, ids)
	now := time.Now()
	w.mu.Lock()
	var loading []*partition
	for _, id := range ids {
		p := w.parts[id]
		if p == nil || p.state != partAcquiring {
			continue
		}
		p.epoch = epochs[id]
		p.state = partLoading
		p.loadingSince, p.lastProgress = now, now
		p.startOffset, p.endOffset = starts[id], ends[id]
		w.countLocked(p)
		loading = append(loading, p)
	}
	w.mu.Unlock()
	if len(loading) > 0 {
		go w.loadTiers(loading)
	}
}

// acquireTimeout bounds taking epochs: long enough to wait out a stalled
// writer of the previous epoch (WriteIdleTimeout), short enough that the
// poll loop, which also takes epochs, does not hold up rebalances for long
// when the database is down.
func (w *Worker) acquireTimeout() time.Duration { return w.cfg.WriteIdleTimeout + 5*time.Second }

// listOffsets returns the log start and last stable offsets of partitions
// of topic; a partition it cannot list is missing from ends (-1 when read).
func (w *Worker) listOffsets(ctx context.Context, topic string, ids []int32) (starts, ends map[int32]int64) {
	starts, ends = map[int32]int64{}, map[int32]int64{}
	for _, id := range ids {
		ends[id] = -1
	}
	s, err := w.adm.ListStartOffsets(ctx, topic)
	if err != nil {
		w.log.Warn("listing start offsets", "topic", topic, "err", err)
		return starts, ends
	}
	e, err := w.adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		w.log.Warn("listing end offsets", "topic", topic, "err", err)
		return starts, ends
	}
	for _, id := range ids {
		so, ok1 := s.Lookup(topic, id)
		eo, ok2 := e.Lookup(topic, id)
		if ok1 && ok2 && so.Err == nil && eo.Err == nil {
			starts[id], ends[id] = so.Offset, eo.Offset
		}
	}
	return starts, ends
}

// loadTiers reads the sync.tier partitions of parts to their end and hands
// the tiers to the partitions. A failure leaves the tiers at their default.
func (w *Worker) loadTiers(parts []*partition) {
	ids := make([]int32, len(parts))
	for i, p := range parts {
		ids[i] = p.id
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The epochs are taken, so every tier record of the previous owners is
	// committed to the outbox; wait (briefly, and only while a relay is
	// publishing) until they are published, so that the latest are read.
	actx, acancel := context.WithTimeout(ctx, tierOutboxWait)
	if err := awaitPublished(actx, w.pool, tierOutboxStall, topics.SyncTier); err != nil {
		w.log.Warn("sync.tier records still in the outbox; reading what is published (tiers may be older)",
			"partitions", ids, "err", err)
	}
	acancel()
	recs, err := w.readTiers(ctx, ids)
	if err != nil {
		w.log.Warn("reading sync.tier failed; starting with default tiers", "partitions", ids, "err", err)
	}
	w.mu.Lock()
	for _, p := range parts {
		if w.parts[p.id] != p {
			continue
		}
		p.inherited = recs[p.id]
		p.tiersLoaded = true
		for id, mb := range p.boxes {
			if rec, ok := p.inherited[id]; ok && mb.run == nil {
				mb.box.set(rec.Tier, domain.SyncReasonInherited)
			}
		}
	}
	w.mu.Unlock()
	w.wake()
}

// readTiers reads sync.tier partitions to their last stable offsets: per
// mailbox, the last record, unless an earlier one was written under a
// higher epoch (a stale owner's late record loses).
func (w *Worker) readTiers(ctx context.Context, ids []int32) (map[int32]map[string]domain.SyncTierRecord, error) {
	out := map[int32]map[string]domain.SyncTierRecord{}
	starts, ends := w.listOffsets(ctx, topics.SyncTier, ids)
	want := map[int32]int64{}
	offsets := map[int32]kgo.Offset{}
	for _, id := range ids {
		out[id] = map[string]domain.SyncTierRecord{}
		if ends[id] < 0 {
			return out, fmt.Errorf("no end offset for sync.tier partition %d", id)
		}
		if ends[id] > starts[id] {
			want[id] = ends[id]
			offsets[id] = kgo.NewOffset().At(starts[id])
		}
	}
	if len(want) == 0 {
		return out, nil
	}
	cl, err := kgo.NewClient(append(kafka.ConnOptions(w.kcfg),
		kgo.ClientID(w.kcfg.ClientID+"-tiers"),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topics.SyncTier: offsets}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100*time.Millisecond), kgo.WithLogger(kgoLogger{w.log}))...)
	if err != nil {
		return out, err
	}
	defer cl.Close()
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return out, fmt.Errorf("reading sync.tier: %w (partitions left %v)", err, want)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := want[r.Partition]; ok && r.Offset+1 >= end {
				delete(want, r.Partition)
			}
			if r.Attrs.IsControl() {
				return
			}
			rec, live, err := DecodeTierRecord(r)
			if err != nil {
				w.m.badRecords.Inc()
				return
			}
			m := out[r.Partition]
			if m == nil {
				return
			}
			if !live {
				delete(m, rec.MailboxID)
				return
			}
			if prev, ok := m[rec.MailboxID]; ok && prev.Epoch > rec.Epoch {
				return
			}
			m[rec.MailboxID] = rec
		})
	}
	return out, nil
}

// housekeeping runs in the poll loop, where no rebalance callback runs:
// it retries taking epochs, turns read partitions live, and brings
// suspended partitions back once the group confirms this member.
func (w *Worker) housekeeping() {
	now := time.Now()
	tripped := w.wd.isTripped()
	var acquire, resume []int32
	w.mu.Lock()
	for id, p := range w.parts {
		switch p.state {
		case partAcquiring:
			// Not while the coordinator is silent: the partition may
			// be someone else's by now, and an epoch taken here would
			// fence its rightful owner.
			if !tripped && now.Sub(p.lastAttempt) >= time.Second {
				acquire = append(acquire, id)
			}
		case partLoading:
			if !p.tiersLoaded || !w.caughtUp(p, now) {
				continue
			}
			if tripped {
				w.suspendLocked(p, domain.SyncSuspendedWatchdog)
				continue
			}
			w.goLiveLocked(p, now)
		case partSuspended:
			if !tripped && p.running == 0 && w.wd.confirmedSince(p.suspendedAt) {
				resume = append(resume, id)
			}
		}
	}
	w.mu.Unlock()
	if len(acquire) > 0 {
		w.acquire(acquire)
	}
	if len(resume) > 0 {
		w.resume(resume)
	}
}

// caughtUp reports whether a loading partition has been read to the end
// offset it had when assigned (or made no progress for LoadStallTimeout).
func (w *Worker) caughtUp(p *partition, now time.Time) bool {
	if p.endOffset >= 0 && (p.endOffset <= p.startOffset || p.nextOffset >= p.endOffset) {
		return true
	}
	if now.Sub(p.lastProgress) >= w.cfg.LoadStallTimeout {
		w.log.Warn("partition made no read progress; treating it as read", "partition", p.id, "next_offset", p.nextOffset, "end_offset", p.endOffset)
		return true
	}
	return false
}

// goLiveLocked starts the runners of a partition read to its end, after
// deciding its mailboxes' tiers.
func (w *Worker) goLiveLocked(p *partition, now time.Time) {
	p.state = partLive
	w.countLocked(p)
	w.recordAgainLocked(p)
	w.evaluateLocked(false)
	for _, mb := range p.boxes {
		w.startLocked(mb)
	}
	if !p.measured {
		p.measured = true
		w.m.rebalanceSeconds.WithLabelValues("assigned").Observe(now.Sub(p.assignedAt).Seconds())
	}
	w.log.Info("partition live", "partition", p.id, "epoch", p.epoch, "mailboxes", len(p.boxes), "since_assigned", now.Sub(p.assignedAt))
}

// resume takes new epochs for suspended partitions the group confirmed
// this member still owns, and restarts their runners.
func (w *Worker) resume(ids []int32) {
	ctx, cancel := context.WithTimeout(context.Background(), w.acquireTimeout())
	defer cancel()
	epochs, err := w.fence.Acquire(ctx, w.cfg.WorkerID, ids)
	if err != nil {
		w.log.Error("taking epochs to resume failed; retrying", "partitions", ids, "err", err)
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		p := w.parts[id]
		if p == nil || p.state != partSuspended {
			continue
		}
		p.epoch = epochs[id]
		w.log.Info("partition resumed under a new epoch", "partition", id, "epoch", p.epoch, "suspended_for", now.Sub(p.suspendedAt))
		// A partition suspended while it was still being read goes back
		// to reading; housekeeping turns it live when it is read.
		p.state = partLoading
		w.countLocked(p)
		if p.tiersLoaded && w.caughtUp(p, now) {
			w.goLiveLocked(p, now)
		}
	}
}

func (w *Worker) revoked(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	w.drop(m[topics.MailboxState], domain.SyncLostRevoked)
}

func (w *Worker) lost(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	w.drop(m[topics.MailboxState], domain.SyncLostLost)
}

// drop stops the runners of partitions the group took away and waits for
// them, so that the next owner's epoch finds every write of ours done.
func (w *Worker) drop(ids []int32, reason string) {
	if len(ids) == 0 {
		return
	}
	start := time.Now()
	w.mu.Lock()
	var gone []*partition
	counts := map[int32]int{}
	for _, id := range ids {
		p := w.parts[id]
		if p == nil {
			continue
		}
		delete(w.parts, id)
		for _, mb := range p.boxes {
			if mb.run != nil {
				counts[id]++
			}
			w.stopLocked(mb)
			w.unindexLocked(mb)
		}
		w.uncountLocked(p)
		gone = append(gone, p)
	}
	w.waitStoppedLocked(gone)
	w.mu.Unlock()
	if len(gone) == 0 {
		return
	}
	d := time.Since(start)
	w.m.rebalances.WithLabelValues(reason).Inc()
	w.m.rebalanceSeconds.WithLabelValues(reason).Observe(d.Seconds())
	at := time.Now().UTC()
	w.mu.Lock()
	for _, p := range gone {
		w.queueAuditLocked(p.id, &domain.SyncOwnershipLost{Partition: p.id, Epoch: p.epoch, Owner: w.cfg.WorkerID, Reason: reason, Runners: counts[p.id], At: at})
	}
	w.mu.Unlock()
	// The partitions' last tier records (and these events) are committed
	// before the callback returns, like their runners' writes: the next
	// owner's epoch finds them, and it waits for them to be published
	// before it reads sync.tier. Ours if a refused write or a failure
	// interrupts: what is left stays queued for the record loop.
	fctx, cancel := context.WithTimeout(context.Background(), dropFlushTimeout)
	if err := w.flushPending(fctx); err != nil {
		w.log.Warn("writing the last tier records of partitions "+reason, "partitions", ids, "err", err)
	}
	cancel()
	w.log.Info("partitions "+reason+"; runners stopped", "partitions", ids, "took", d)
}

// dropAll stops whatever is left at shutdown.
func (w *Worker) dropAll() {
	w.mu.Lock()
	ids := make([]int32, 0, len(w.parts))
	for id := range w.parts {
		ids = append(ids, id)
	}
	w.mu.Unlock()
	w.drop(ids, domain.SyncLostRevoked)
}

// reportMail records a runner's newest mail and asks for an evaluation.
func (w *Worker) reportMail(mb *mbox, t time.Time, known bool) {
	w.mu.Lock()
	mb.mailKnown = mb.mailKnown || known
	if t.After(mb.newestMail) {
		mb.newestMail = t
	}
	w.mu.Unlock()
	w.kick(w.kickEval)
}

func (w *Worker) kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// audit produces a runner's sync.failed event to sync.audit directly,
// asynchronously and without ever blocking; a failure, a full buffer
// included, is logged: it is history, not state anything depends on, and
// not a write made under an epoch. (Tier records, tier changes and
// ownership events go through the outbox: see flushPending.)
func (w *Worker) audit(d domain.Data) {
	if w.out == nil {
		return
	}
	r, err := encodeRecord(topics.SyncAudit, w.cfg.WorkerID, time.Now(), d)
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

// lenientRegisterer registers what it can: several workers of one process
// sharing a registerer each run a relay, and only the first relay's metrics
// can be registered (only one relay per database publishes anyway).
type lenientRegisterer struct{ prometheus.Registerer }

// MustRegister registers cs, ignoring collectors already registered.
func (r lenientRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

// kgoLogger passes franz-go's warnings and errors to slog.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	sl := slog.LevelWarn
	if level == kgo.LogLevelError {
		sl = slog.LevelError
	}
	k.l.Log(context.Background(), sl, "kafka: "+msg, keyvals...)
}
