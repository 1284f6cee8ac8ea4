package mailsync

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/topics"
)

// followUsers reads user.active events from now minus the session grace,
// as a plain consumer (every worker reads every user partition), keeping
// the latest activity per user and promoting the user's owned mailboxes.
func (w *Worker) followUsers(ctx context.Context) {
	since := time.Now().Add(-w.cfg.TierSessionGrace)
	cl, err := kgo.NewClient(append(kafka.ConnOptions(w.kcfg),
		kgo.ClientID(w.kcfg.ClientID+"-users"),
		kgo.ConsumeTopics(topics.UserEvents),
		kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(since.UnixMilli())),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(500*time.Millisecond),
		kgo.MetadataMinAge(250*time.Millisecond),
		kgo.WithLogger(kgoLogger{w.log}),
	)...)
	if err != nil {
		w.log.Error("user events consumer; sessions will not promote", "err", err)
		return
	}
	defer cl.Close()
	// Until the events that were already there at start are read, a
	// promotion is catching up, not a latency worth measuring.
	ends := map[int32]int64{}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if listed, err := kadm.NewClient(cl).ListEndOffsets(lctx, topics.UserEvents); err == nil {
		listed.Each(func(o kadm.ListedOffset) {
			if o.Err == nil && o.Offset > 0 {
				ends[o.Partition] = o.Offset
			}
		})
	}
	cancel()
	caughtUp := len(ends) == 0
	w.log.Debug("following user events", "since", since, "to_catch_up", len(ends))
	w.setUsersCaughtUp(caughtUp)
	type activity struct {
		user string
		at   time.Time
	}
	for ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		if fs.IsClientClosed() {
			return
		}
		var batch []activity
		fs.EachRecord(func(r *kgo.Record) {
			if !caughtUp {
				if end, ok := ends[r.Partition]; ok && r.Offset+1 >= end {
					delete(ends, r.Partition)
				}
			}
			e, err := topics.Decode(r)
			if err != nil {
				w.m.badRecords.Inc()
				return
			}
			if ua, ok := e.Data.(*domain.UserActive); ok {
				// The time mailplane stamped on the record, never later
				// than this worker's clock: a user.active dated ahead
				// cannot keep a session hot past its grace.
				batch = append(batch, activity{ua.UserID, domain.TrustedTime(r.Timestamp, w.cfg.Now())})
			}
		})
		if len(batch) > 0 {
			now := w.cfg.Now()
			wall := time.Now()
			w.mu.Lock()
			for _, a := range batch {
				w.userActiveLocked(a.user, a.at, now, wall)
			}
			w.mu.Unlock()
		}
		if !caughtUp && len(ends) == 0 {
			caughtUp = true
			w.setUsersCaughtUp(true)
		}
	}
}

func (w *Worker) setUsersCaughtUp(v bool) {
	w.mu.Lock()
	w.usersCaughtUp = v
	w.mu.Unlock()
}

// userActiveLocked records a user's activity at and promotes the user's
// mailboxes in live partitions to hot at once.
func (w *Worker) userActiveLocked(user string, at, now, wall time.Time) {
	if at.After(w.sessions[user]) {
		w.sessions[user] = at
	}
	if now.Sub(at) > w.cfg.TierSessionGrace {
		return
	}
	for _, mb := range w.byUser[user] {
		if mb.part.state != partLive {
			continue
		}
		if w.setTierLocked(mb, domain.SyncTierHot, domain.SyncReasonSession) && mb.run != nil && w.usersCaughtUp {
			w.m.promotionSeconds.Observe(max(0, wall.Sub(at).Seconds()))
		}
	}
}

func (w *Worker) inSessionLocked(user string, now time.Time) bool {
	at, ok := w.sessions[user]
	return ok && now.Sub(at) <= w.cfg.TierSessionGrace
}

// setTierLocked changes mb's tier (telling its runner at once) and queues
// the change for sync.tier and sync.audit. It reports whether the tier
// changed.
func (w *Worker) setTierLocked(mb *mbox, t domain.SyncTier, reason string) bool {
	from, changed := mb.box.set(t, reason)
	if !changed {
		return false
	}
	if mb.run != nil {
		w.m.runners.WithLabelValues(string(from)).Dec()
		w.m.runners.WithLabelValues(string(t)).Inc()
	}
	w.m.tierChanges.WithLabelValues(string(t)).Inc()
	w.queueTierLocked(mb, from, t, reason)
	return true
}

// queueTierLocked queues mb's tier record and tier_changed event (none
// when from is to: a record written again) under its partition's epoch.
func (w *Worker) queueTierLocked(mb *mbox, from, to domain.SyncTier, reason string) {
	p := mb.part
	recs, err := tierRecords(w.cfg.WorkerID, p.id, p.epoch, mb.rec.MailboxID, from, to, reason, time.Now().UTC())
	if err != nil {
		w.log.Error("encoding a tier change", "mailbox", mb.rec.MailboxID, "err", err)
		return
	}
	w.queueLocked(pendingWrite{partition: p.id, epoch: p.epoch, mailboxID: mb.rec.MailboxID, from: from, to: to, recs: recs})
}

// tierRecords renders a tier decision: the mailbox's sync.tier record and,
// when the tier changed, its sync.audit tier_changed event.
func tierRecords(owner string, partition int32, epoch int64, mailboxID string, from, to domain.SyncTier, reason string, at time.Time) ([]*kgo.Record, error) {
	tr, err := encodeRecord(topics.SyncTier, owner, at, &domain.SyncTierRecord{MailboxID: mailboxID, Tier: to, Reason: reason,
		Partition: partition, Epoch: epoch, Owner: owner, ChangedAt: at})
	if err != nil || from == to {
		return []*kgo.Record{tr}, err
	}
	ar, err := encodeRecord(topics.SyncAudit, owner, at, &domain.SyncTierChanged{MailboxID: mailboxID, From: from, To: to,
		Reason: reason, Partition: partition, Epoch: epoch, Owner: owner, At: at})
	return []*kgo.Record{tr, ar}, err
}

// evalLoop evaluates every owned mailbox's tier on the cadence, and soon
// after a runner reports mail or the live set changes.
func (w *Worker) evalLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.TierEvaluateEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.mu.Lock()
			w.evaluateLocked(true)
			w.mu.Unlock()
		case <-w.kickEval:
			// Let a burst of reports land first.
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			w.mu.Lock()
			w.evaluateLocked(false)
			w.mu.Unlock()
		}
	}
}

// evaluateLocked decides the tiers of every mailbox of the live partitions
// (the hot budget is the worker's) and applies the changes. prune drops
// sessions that ended.
func (w *Worker) evaluateLocked(prune bool) {
	now := w.cfg.Now()
	var boxes []*mbox
	for _, p := range w.parts {
		if p.state != partLive {
			continue
		}
		for _, mb := range p.boxes {
			boxes = append(boxes, mb)
		}
	}
	// A fixed order: ties in the budget go the same way on every run.
	slices.SortFunc(boxes, func(a, b *mbox) int { return strings.Compare(a.rec.MailboxID, b.rec.MailboxID) })
	in := make([]domain.SyncTierInput, len(boxes))
	for i, mb := range boxes {
		cur, _ := mb.box.get()
		in[i] = domain.SyncTierInput{Current: cur, SessionAt: w.sessions[mb.rec.UserID], MailKnown: mb.mailKnown,
			NewestMail: mb.newestMail, TrackedSince: mb.trackedSince, AddedAt: mb.rec.AddedAt}
	}
	for i, d := range domain.EvaluateSyncTiers(now, w.cfg.policy(), in) {
		w.setTierLocked(boxes[i], d.Tier, d.Reason)
	}
	if prune {
		for u, at := range w.sessions {
			if now.Sub(at) > w.cfg.TierSessionGrace {
				delete(w.sessions, u)
			}
		}
	}
}

// Writes of the record loop.
const (
	// maxWriteRecords bounds the records of one outbox transaction, so a
	// burst of tier changes (a partition's first evaluation) does not hold
	// its epoch row for long.
	maxWriteRecords = 1000
	// writeTimeout bounds one outbox transaction.
	writeTimeout = 10 * time.Second
	// dropFlushTimeout bounds the flush a revoke or loss makes before
	// its callback returns.
	dropFlushTimeout = 5 * time.Second
)

// pendingWrite is one entry of the record loop's queue: a tier record (or
// tombstone) with its tier_changed event, decided under an epoch and written
// only if that epoch is still the partition's; or, with epoch 0, an
// ownership event (lost, suspended), history that is true whatever the
// epoch and written unfenced.
type pendingWrite struct {
	partition int32
	epoch     int64           // 0: not fenced
	mailboxID string          // a tier write's mailbox
	from, to  domain.SyncTier // a tier write's change; to is empty for a tombstone
	recs      []*kgo.Record
}

func (w *Worker) queueLocked(pw pendingWrite) {
	w.pending = append(w.pending, pw)
	w.kick(w.kickRecord)
}

// queueAuditLocked queues an ownership event of partition for sync.audit.
func (w *Worker) queueAuditLocked(partition int32, d domain.Data) {
	r, err := encodeRecord(topics.SyncAudit, w.cfg.WorkerID, time.Now(), d)
	if err != nil {
		w.log.Error("encoding an audit event", "type", d.EventType(), "err", err)
		return
	}
	w.queueLocked(pendingWrite{partition: partition, recs: []*kgo.Record{r}})
}

// recordLoop writes queued tier changes and ownership events to the outbox
// (see flushPending), retrying with a backoff while the database fails. At
// the end it flushes once more.
func (w *Worker) recordLoop(ctx context.Context) {
	backoff := time.Second
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
			if err := w.flushPending(fctx); err != nil {
				w.log.Warn("tier records and ownership events not written at shutdown", "err", err)
			}
			cancel()
			return
		case <-w.kickRecord:
		}
		err := w.flushPending(ctx)
		if err == nil || ctx.Err() != nil {
			backoff = time.Second
			continue
		}
		w.log.Warn("writing tier records to the outbox failed; retrying", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
		w.kick(w.kickRecord)
	}
}

// flushPending writes the queue to the outbox, in order: per partition and
// epoch, up to maxWriteRecords records a transaction (the unfenced
// ownership events of all partitions together), each tier write in a
// transaction fenced on its epoch (Fence.writeRecords), so a change decided
// under an epoch that is no longer current never reaches sync.tier or
// sync.audit: it is rolled back, counted and recorded as a fenced write of
// kind "tier", and the partition is suspended as for a runner's fenced
// write. The outbox relay publishes what was committed.
//
// Per-key order: a key's writes are queued in order, one flush runs at a
// time, groups are written in the order of their first entry, and a
// mailbox's entries of a later epoch are queued after those of an earlier
// one. On an error other than a refusal, what was not written goes back to
// the front of the queue and the error is returned.
func (w *Worker) flushPending(ctx context.Context) error {
	select {
	case w.flushing <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-w.flushing }()
	w.mu.Lock()
	batch := w.pending
	w.pending = nil
	w.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	type group struct {
		partition int32
		epoch     int64
		items     []int // indexes into batch
		records   int
	}
	var groups []*group
	open := map[[2]int64]*group{}
	groupOf := make([]int, len(batch))
	for i, pw := range batch {
		k := [2]int64{int64(pw.partition), pw.epoch}
		if pw.epoch == 0 {
			k = [2]int64{-1, 0} // unfenced: all in one transaction
		}
		g := open[k]
		if g == nil || g.records+len(pw.recs) > maxWriteRecords {
			g = &group{partition: pw.partition, epoch: pw.epoch}
			open[k] = g
			groups = append(groups, g)
		}
		g.items = append(g.items, i)
		g.records += len(pw.recs)
		groupOf[i] = len(groups) - 1
	}
	for gi, g := range groups {
		recs := make([]*kgo.Record, 0, g.records)
		mailboxID := batch[g.items[0]].mailboxID
		for _, i := range g.items {
			recs = append(recs, batch[i].recs...)
			if batch[i].mailboxID != mailboxID {
				mailboxID = ""
			}
		}
		wctx, cancel := context.WithTimeout(ctx, writeTimeout)
		var err error
		if g.epoch == 0 {
			err = pgx.BeginFunc(wctx, w.pool, func(tx pgx.Tx) error { return outbox.Add(wctx, tx, recs...) })
		} else {
			err = w.fence.writeRecords(wctx, g.partition, g.epoch, w.cfg.WorkerID, mailboxID, recs)
		}
		cancel()
		switch {
		case err == nil:
		case errors.Is(err, ErrFenced):
			items := make([]pendingWrite, len(g.items))
			for k, i := range g.items {
				items[k] = batch[i]
			}
			w.tierWritesFenced(g.partition, g.epoch, items, err)
		default:
			var rest []pendingWrite
			for i, pw := range batch {
				if groupOf[i] >= gi {
					rest = append(rest, pw)
				}
			}
			w.mu.Lock()
			w.pending = append(rest, w.pending...)
			w.mu.Unlock()
			return err
		}
	}
	return nil
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
	switch {
	case p.epoch == epoch && p.state == partLive:
		w.log.Warn("a tier write was fenced; stopping the partition's runners", "partition", partition, "epoch", epoch, "err", err)
		w.suspendLocked(p, domain.SyncSuspendedFenced)
	case p.epoch != epoch && p.state == partLive:
		// Already running under a newer epoch of ours.
		w.recordAgainLocked(p)
	}
}

// recordAgainLocked queues, under p's current epoch, the tier of each of
// p's mailboxes whose last change was refused by the fence.
func (w *Worker) recordAgainLocked(p *partition) {
	for _, mb := range p.boxes {
		if !mb.unrecorded {
			continue
		}
		mb.unrecorded = false
		tier, reason := mb.box.current()
		w.queueTierLocked(mb, mb.unrecordedFrom, tier, reason)
	}
}

// Waits for the outbox relay.
const (
	// tierOutboxWait bounds how long a partition being loaded waits for
	// the outbox to publish the sync.tier records committed before its
	// epoch; tierOutboxStall gives up sooner when no relay is publishing.
	tierOutboxWait  = 2 * time.Second
	tierOutboxStall = 500 * time.Millisecond
)

// errRelayStalled: records are waiting in the outbox and no relay is
// publishing (none runs, or the one holding the publishing lock is stuck).
var errRelayStalled = errors.New("no outbox relay is publishing")

// awaitPublished waits until every outbox record of topics committed before
// the call has been published (deleted by a relay, whichever process runs
// it). It gives up when ctx is done, or with errRelayStalled when the
// relay's front (the oldest record of any topic) has not moved for stall.
func awaitPublished(ctx context.Context, pool *pgxpool.Pool, stall time.Duration, topics ...string) error {
	var last int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM event_outbox WHERE topic = ANY($1)`, topics).Scan(&last); err != nil {
		return err
	}
	if last == 0 {
		return nil
	}
	front, moved := int64(-1), time.Now()
	for {
		var (
			left bool
			head int64
		)
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM event_outbox WHERE seq <= $1 AND topic = ANY($2)),
    coalesce((SELECT min(seq) FROM event_outbox), 0)`, last, topics).Scan(&left, &head); err != nil {
			return err
		}
		if !left {
			return nil
		}
		if head != front {
			front, moved = head, time.Now()
		} else if time.Since(moved) >= stall {
			return errRelayStalled
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
