package mailsync

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

// followUsers reads user.active events from now minus the session grace,
// as a plain consumer (every worker reads every user partition), keeping
// the latest activity per user and promoting the user's owned mailboxes.
func (w *Worker) followUsers(ctx context.Context) {
	since := time.Now().Add(-w.cfg.TierSessionGrace)
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(w.kcfg.Brokers...),
		kgo.ClientID(w.kcfg.ClientID+"-users"),
		kgo.ConsumeTopics(topics.UserEvents),
		kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(since.UnixMilli())),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(500*time.Millisecond),
		kgo.MetadataMinAge(250*time.Millisecond),
		kgo.WithLogger(kgoLogger{w.log}),
	)
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
				batch = append(batch, activity{ua.UserID, e.Time})
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
		if w.setTierLocked(mb, TierHot, ReasonSession) && mb.run != nil && w.usersCaughtUp {
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
func (w *Worker) setTierLocked(mb *mbox, t Tier, reason string) bool {
	from, changed := mb.box.set(t, reason)
	if !changed {
		return false
	}
	if mb.run != nil {
		w.m.runners.WithLabelValues(string(from)).Dec()
		w.m.runners.WithLabelValues(string(t)).Inc()
	}
	w.m.tierChanges.WithLabelValues(string(t)).Inc()
	p := mb.part
	now := time.Now().UTC()
	rec := &TierRecord{MailboxID: mb.rec.MailboxID, Tier: t, Reason: reason, Partition: p.id, Epoch: p.epoch,
		Owner: w.cfg.WorkerID, ChangedAt: now}
	tr, err1 := encodeRecord(topics.SyncTier, w.cfg.WorkerID, now, rec)
	ar, err2 := encodeRecord(topics.SyncAudit, w.cfg.WorkerID, now, &TierChanged{MailboxID: mb.rec.MailboxID, From: from, To: t,
		Reason: reason, Partition: p.id, Epoch: p.epoch, Owner: w.cfg.WorkerID, At: now})
	if err1 != nil || err2 != nil {
		w.log.Error("encoding a tier change", "err", err1, "err2", err2)
		return true
	}
	w.queueLocked(tierChange{partition: p.id, epoch: p.epoch, mailboxID: mb.rec.MailboxID, tier: tr, audit: ar})
	return true
}

func (w *Worker) queueLocked(c tierChange) {
	w.pending = append(w.pending, c)
	w.kick(w.kickRecord)
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
	in := make([]TierInput, len(boxes))
	for i, mb := range boxes {
		cur, _ := mb.box.get()
		in[i] = TierInput{Current: cur, SessionAt: w.sessions[mb.rec.UserID], MailKnown: mb.mailKnown,
			NewestMail: mb.newestMail, TrackedSince: mb.trackedSince, AddedAt: mb.rec.AddedAt}
	}
	for i, d := range EvaluateTiers(now, w.cfg.policy(), in) {
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

// recordLoop produces queued tier changes. Each batch's partitions have
// their epochs read first: a change decided under an epoch that is no
// longer current is not produced (it is counted and recorded as a fenced
// write), so a stale owner cannot overwrite the tier a newer owner decided.
// The check and the produce are not atomic; the window is the time between
// them, on top of the watchdog.
func (w *Worker) recordLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			w.flushTiers(context.Background())
			return
		case <-w.kickRecord:
		}
		w.flushTiers(ctx)
	}
}

func (w *Worker) flushTiers(ctx context.Context) {
	w.mu.Lock()
	batch := w.pending
	w.pending = nil
	w.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	var parts []int32
	for _, c := range batch {
		if !slices.Contains(parts, c.partition) {
			parts = append(parts, c.partition)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cur, err := w.fence.Current(cctx, parts)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		w.log.Warn("reading epochs for tier records; retrying", "err", err)
		w.mu.Lock()
		w.pending = append(batch, w.pending...)
		w.mu.Unlock()
		time.Sleep(time.Second)
		w.kick(w.kickRecord)
		return
	}
	for _, c := range batch {
		if cur[c.partition] != c.epoch {
			w.fence.refused(ctx, &FencedError{Partition: c.partition, Epoch: c.epoch, Current: cur[c.partition]}, w.cfg.WorkerID, c.mailboxID, "tier")
			continue
		}
		for _, r := range []*kgo.Record{c.tier, c.audit} {
			if r == nil {
				continue
			}
			w.out.Produce(context.Background(), r, func(r *kgo.Record, err error) {
				if err != nil {
					w.log.Warn("producing a tier record failed", "topic", r.Topic, "err", err)
				}
			})
		}
	}
}
