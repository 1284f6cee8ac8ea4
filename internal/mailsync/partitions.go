package mailsync

import (
	"context"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/consume"
	"github.com/mailplane/mailplane/topics"
)

// The life of an assigned partition, as the worker moves it through
// ownership (ownership.go) while keeping its live set and its runners in
// step: assigned, acquire, loadTiers and housekeeping bring it live; drop
// releases it; suspendLocked and resume stop and restart it.

// assigned claims newly assigned partitions, takes their epochs and starts
// reading them. It runs while the poll loop is parked
// (BlockRebalanceOnPoll).
func (w *Worker) assigned(_ context.Context, c *consume.Consumer, m map[string][]int32) {
	ids := m[w.kcfg.Topic(topics.MailboxState)]
	if len(ids) == 0 {
		return
	}
	w.mu.Lock()
	fresh := w.own.assign(ids, time.Now())
	for _, id := range fresh {
		w.parts[id] = newPartition(id)
	}
	w.mu.Unlock()
	if len(fresh) == 0 {
		return
	}
	w.m.rebalances.WithLabelValues("assigned").Inc()
	w.log.Info("partitions assigned", "partitions", fresh)
	w.acquire(c, fresh)
}

// acquire takes the next epoch of each partition (all still assigned and
// acquiring) and moves them to loading.
func (w *Worker) acquire(c *consume.Consumer, ids []int32) {
	ctx, cancel := context.WithTimeout(context.Background(), w.acquireTimeout())
	defer cancel()
	start := time.Now()
	epochs, err := w.own.takeEpochs(ctx, ids, start)
	if err != nil {
		w.log.Error("taking epochs failed; retrying", "partitions", ids, "err", err)
		return
	}
	took := time.Since(start)
	starts, ends := listOffsets(ctx, w.adm, w.log, w.kcfg.Topic(topics.MailboxState), ids)
	w.log.Info("epochs taken", "partitions", len(ids), "took", took, "offsets_listed_in", time.Since(start)-took)
	now := time.Now()
	w.mu.Lock()
	var loading []*partition
	for _, id := range ids {
		p := w.parts[id]
		if p == nil || !w.own.loaded(id, epochs[id]) {
			continue
		}
		p.lastProgress = now
		p.startOffset, p.endOffset = starts[id], ends[id]
		w.measureLocked(c, p)
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
	start := time.Now()
	actx, acancel := context.WithTimeout(ctx, tierOutboxWait)
	if err := awaitPublished(actx, w.pool, tierOutboxStall, topics.SyncTier); err != nil {
		w.log.Warn("sync.tier records still in the outbox; reading what is published (tiers may be older)",
			"partitions", ids, "err", err)
	}
	acancel()
	published := time.Now()
	recs, err := w.tiers.readTiers(ctx, ids)
	if err != nil {
		w.log.Warn("reading sync.tier failed; starting with default tiers", "partitions", ids, "err", err)
	}
	w.log.Info("sync.tier read", "partitions", len(ids), "outbox_wait", published.Sub(start), "read", time.Since(published))
	w.mu.Lock()
	for _, p := range parts {
		if w.parts[p.id] != p {
			continue
		}
		p.inherited = recs[p.id]
		p.tiersLoaded = true
		for id, mb := range p.boxes {
			if rec, ok := p.inherited[id]; ok && !w.sup.running(id) {
				mb.box.set(rec.Tier, domain.SyncReasonInherited)
			}
		}
	}
	w.mu.Unlock()
	w.wake()
}

// housekeeping runs in the poll loop, where no rebalance callback runs:
// it retries taking epochs, turns read partitions live, and brings
// suspended partitions back once the group confirms this member.
func (w *Worker) housekeeping(c *consume.Consumer) {
	now := time.Now()
	tripped := w.wd.isTripped()
	var acquire, resume []int32
	var ready []*partition
	w.mu.Lock()
	for id, p := range w.parts {
		c, _ := w.own.get(id)
		switch c.state {
		case partAcquiring:
			// Not while the coordinator is silent: the partition may
			// be someone else's by now, and an epoch taken here would
			// fence its rightful owner.
			if !tripped && now.Sub(c.lastAttempt) >= time.Second {
				acquire = append(acquire, id)
			}
		case partLoading:
			if !p.tiersLoaded || !p.caughtUp(now, w.cfg.LoadStallTimeout, w.log) {
				continue
			}
			if tripped {
				w.suspendLocked(p, 0, domain.SyncSuspendedWatchdog, w.wd.lastWritesBy())
				continue
			}
			ready = append(ready, p)
		case partSuspended:
			if !tripped && w.sup.aliveIn(id) == 0 && w.wd.confirmedSince(c.suspendedAt) {
				resume = append(resume, id)
			}
		}
	}
	w.goLiveLocked(ready, now)
	positions := w.positionsLocked(now)
	w.mu.Unlock()
	w.commitPositions(positions)
	if len(acquire) > 0 {
		w.acquire(c, acquire)
	}
	if len(resume) > 0 {
		w.resume(resume)
	}
}

// goLiveLocked starts the runners of partitions read to their end, after
// deciding their mailboxes' tiers. The tiers of all of them are decided in
// one evaluation (the hot budget is the worker's, over every live mailbox):
// one per partition made a cold start of 64 partitions of 25,000
// mailboxes quadratic, about 20 s with the worker's lock held
// (BENCHMARKS.md, "Fleet rehearsal").
func (w *Worker) goLiveLocked(parts []*partition, now time.Time) {
	var live []*partition
	for _, p := range parts {
		took, first, ok := w.own.goLive(p.id, now)
		if !ok {
			continue
		}
		w.recordAgainLocked(p)
		if first {
			w.m.rebalanceSeconds.WithLabelValues("assigned").Observe(took.Seconds())
		}
		live = append(live, p)
	}
	if len(live) == 0 {
		return
	}
	w.evaluateLocked(false)
	for _, p := range live {
		for _, mb := range p.boxes {
			w.startLocked(mb)
		}
		c, _ := w.own.get(p.id)
		w.log.Info("partition live", "partition", p.id, "epoch", c.epoch, "mailboxes", len(p.boxes), "since_assigned", now.Sub(c.assignedAt))
	}
}

// resume takes new epochs for suspended partitions the group confirmed
// this member still owns, and restarts their runners.
func (w *Worker) resume(ids []int32) {
	ctx, cancel := context.WithTimeout(context.Background(), w.acquireTimeout())
	defer cancel()
	epochs, err := w.own.takeEpochs(ctx, ids, time.Now())
	if err != nil {
		w.log.Error("taking epochs to resume failed; retrying", "partitions", ids, "err", err)
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	var ready []*partition
	for _, id := range ids {
		p := w.parts[id]
		c, _ := w.own.get(id)
		if p == nil || !w.own.resumed(id, epochs[id]) {
			continue
		}
		w.log.Info("partition resumed under a new epoch", "partition", id, "epoch", epochs[id], "suspended_for", now.Sub(c.suspendedAt))
		// A partition suspended while it was still being read goes back
		// to reading; housekeeping turns it live when it is read.
		if p.tiersLoaded && p.caughtUp(now, w.cfg.LoadStallTimeout, w.log) {
			ready = append(ready, p)
		}
	}
	w.goLiveLocked(ready, now)
}

// drop releases partitions the group took away, stops their runners and
// waits for them, so that the next owner's epoch finds every write of ours
// done.
func (w *Worker) drop(ids []int32, reason string) {
	if len(ids) == 0 {
		return
	}
	start := time.Now()
	w.mu.Lock()
	counts := map[int32]int{}
	for _, id := range ids {
		p := w.parts[id]
		if p == nil {
			continue
		}
		delete(w.parts, id)
		for _, mb := range p.boxes {
			if w.sup.stop(mb.rec.MailboxID) {
				counts[id]++
			}
			w.byUser.remove(mb)
		}
	}
	epochs := w.own.release(ids)
	w.mu.Unlock()
	gone := make([]int32, 0, len(epochs))
	for _, id := range ids {
		if _, ok := epochs[id]; ok {
			gone = append(gone, id)
		}
	}
	w.sup.wait(gone)
	if len(gone) == 0 {
		return
	}
	d := time.Since(start)
	w.m.rebalances.WithLabelValues(reason).Inc()
	w.m.rebalanceSeconds.WithLabelValues(reason).Observe(d.Seconds())
	at := w.cfg.Now().UTC()
	for _, id := range gone {
		w.queue.addEvent(id, &domain.SyncOwnershipLost{Partition: id, Epoch: epochs[id], Owner: w.cfg.WorkerID, Reason: reason, Runners: counts[id], At: at}, at)
	}
	// The partitions' last tier records (and these events) are committed
	// before the callback returns, like their runners' writes: the next
	// owner's epoch finds them, and it waits for them to be published
	// before it reads sync.tier. Ours if a refused write or a failure
	// interrupts: what is left stays queued for the outbox queue's loop.
	fctx, cancel := context.WithTimeout(context.Background(), dropFlushTimeout)
	if err := w.queue.flush(fctx); err != nil {
		w.log.Warn("writing the last tier records of partitions "+reason, "partitions", ids, "err", err)
	}
	cancel()
	w.log.Info("partitions "+reason+"; runners stopped", "partitions", ids, "took", d)
}

// dropAll stops whatever is left at shutdown.
func (w *Worker) dropAll() {
	w.drop(w.own.claimed(), domain.SyncLostRevoked)
}

// suspendAll is the watchdog's action: stop every runner, their last
// writes bounded by by, and wait.
func (w *Worker) suspendAll(reason string, by time.Time) int {
	w.mu.Lock()
	ids := w.own.active()
	n := 0
	for _, id := range ids {
		if p := w.parts[id]; p != nil {
			n += w.suspendLocked(p, 0, reason, by)
		}
	}
	w.mu.Unlock()
	w.sup.wait(ids)
	return n
}

// fenced suspends a partition after one of its runners' writes was
// refused at epoch.
func (w *Worker) fenced(partition int32, epoch int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p := w.parts[partition]; p != nil {
		w.suspendLocked(p, epoch, domain.SyncSuspendedFenced, time.Now())
	}
}

// suspendLocked stops p's runners on the worker's own suspicion that it
// may have lost the partition (see ownership.suspend for atEpoch), their
// last writes bounded by by. It does not wait for them.
func (w *Worker) suspendLocked(p *partition, atEpoch int64, reason string, by time.Time) int {
	epoch, ok := w.own.suspend(p.id, atEpoch, time.Now())
	if !ok {
		return 0
	}
	n := 0
	for id := range p.boxes {
		if w.sup.stopBy(id, by) {
			n++
		}
	}
	w.log.Warn("partition suspended: runners stopped", "partition", p.id, "epoch", epoch, "reason", reason, "runners", n)
	at := w.cfg.Now().UTC()
	w.queue.addEvent(p.id, &domain.SyncOwnershipSuspended{Partition: p.id, Epoch: epoch, Owner: w.cfg.WorkerID, Reason: reason, Runners: n, At: at}, at)
	return n
}

// tierWritesFenced handles tier writes of partition the fence refused at
// epoch. Their mailboxes keep their tiers (the runners were told at once)
// and are marked unrecorded, so that the tier is recorded again under the
// partition's next epoch of this worker. If the worker still runs the
// partition at that epoch, someone else took a newer one: the partition is
// suspended, as for a runner's fenced write.
func (w *Worker) tierWritesFenced(partition int32, epoch int64, items []pendingWrite, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.parts[partition]
	if p == nil {
		return
	}
	for _, pw := range items {
		mb := p.boxes[pw.mailboxID]
		if mb == nil || pw.to == "" || pw.epoch == 0 {
			continue
		}
		if !mb.unrecorded {
			mb.unrecorded, mb.unrecordedFrom = true, pw.from
		}
	}
	current, live := w.own.live(partition)
	switch {
	case live && current == epoch:
		w.log.Warn("a tier write was fenced; stopping the partition's runners", "partition", partition, "epoch", epoch, "err", err)
		w.suspendLocked(p, epoch, domain.SyncSuspendedFenced, time.Now())
	case live:
		// Already running under a newer epoch of ours.
		w.recordAgainLocked(p)
	}
}
