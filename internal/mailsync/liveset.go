package mailsync

import (
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/consume"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/topics"
)

// partition is the live set of one assigned mailbox.state partition: its
// mailboxes and how far it has been read. Its ownership (state, epoch) is
// the ownership's claim of the same id.
type partition struct {
	id           int32
	startOffset  int64
	endOffset    int64 // last stable offset when the epoch was taken; -1 unknown
	nextOffset   int64
	fetchedEnd   int64     // the partition's end as last fetched; -1 unknown
	lastProgress time.Time // of reading (monotonic)
	tiersLoaded  bool
	inherited    map[string]domain.SyncTierRecord

	boxes map[string]*mbox
}

func newPartition(id int32) *partition {
	return &partition{id: id, endOffset: -1, fetchedEnd: -1, boxes: map[string]*mbox{}}
}

// caughtUp reports whether a loading partition has been read to the end
// offset it had when its epoch was taken, or made no progress for stall
// (logged: it is then treated as read).
func (p *partition) caughtUp(now time.Time, stall time.Duration, log *slog.Logger) bool {
	if p.endOffset >= 0 && (p.endOffset <= p.startOffset || p.nextOffset >= p.endOffset) {
		return true
	}
	if now.Sub(p.lastProgress) >= stall {
		log.Warn("partition made no read progress; treating it as read", "partition", p.id, "next_offset", p.nextOffset, "end_offset", p.endOffset)
		return true
	}
	return false
}

// mbox is one live mailbox of an owned partition.
type mbox struct {
	rec          domain.MailboxStateRecord
	part         *partition
	box          *tierBox
	mailKnown    bool
	newestMail   time.Time
	trackedSince time.Time
	// unrecorded: a tier change of the mailbox was refused by the fence;
	// its tier is recorded again under the partition's next epoch, as a
	// change from unrecordedFrom (the refused change's from).
	unrecorded     bool
	unrecordedFrom domain.SyncTier
}

// apply folds fetched mailbox.state records into the owned partitions'
// live sets, starting, restarting and stopping runners.
func (w *Worker) apply(c *consume.Consumer, fs kgo.Fetches) {
	if fs.NumRecords() == 0 {
		return
	}
	read := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	kicked := false
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		part := w.parts[fp.Partition]
		if part == nil || fp.Topic != w.kcfg.Topic(topics.MailboxState) {
			return
		}
		_, live := w.own.live(part.id)
		for _, r := range fp.Records {
			part.nextOffset = r.Offset + 1
			part.lastProgress = read
			if r.Attrs.IsControl() {
				continue
			}
			if w.applyLocked(part, r) {
				kicked = true
			}
			if live {
				// Loading replays history; only a live partition's
				// records measure the latency to their runner.
				w.lag.Applied(read, r.Timestamp)
			}
		}
		part.fetchedEnd = max(part.fetchedEnd, kafka.FetchEnd(fp))
		w.measureLocked(c, part)
	})
	if kicked {
		kick(w.tiers.eval)
	}
}

// applyLocked applies one mailbox.state record of part; it reports
// whether the live set changed (a mailbox added or removed).
func (w *Worker) applyLocked(part *partition, r *kgo.Record) bool {
	m, live, err := mailboxstate.Decode(r)
	if err != nil {
		w.m.badRecords.Inc()
		w.log.Warn("skipping a mailbox.state record that does not decode", "partition", r.Partition, "offset", r.Offset, "err", err)
		return false
	}
	mb := part.boxes[string(r.Key)]
	switch {
	case !live:
		if mb == nil {
			return false
		}
		w.removeLocked(mb)
		return true
	case mb == nil:
		mb = w.addLocked(part, m)
		w.startLocked(mb)
		return true
	case !mb.rec.SameSync(m):
		w.sup.stop(mb.rec.MailboxID)
		if mb.rec.UserID != m.UserID {
			w.byUser.remove(mb)
			mb.rec = m
			w.byUser.add(mb)
		} else {
			mb.rec = m
		}
		w.startLocked(mb)
	default:
		mb.rec = m
	}
	return false
}

// addLocked tracks a new live mailbox of part, in the tier the previous
// owner left it in (default warm), hot at once if its user is in session.
func (w *Worker) addLocked(part *partition, m domain.MailboxStateRecord) *mbox {
	tier, reason := domain.SyncTierWarm, domain.SyncReasonDefault
	if rec, ok := part.inherited[m.MailboxID]; ok {
		tier, reason = rec.Tier, domain.SyncReasonInherited
	}
	now := w.cfg.Now()
	mb := &mbox{rec: m, part: part, box: newTierBox(tier, reason), trackedSince: now}
	part.boxes[m.MailboxID] = mb
	w.byUser.add(mb)
	if _, live := w.own.live(part.id); live && w.tiers.inSession(m.UserID, now) {
		w.setTierLocked(mb, domain.SyncTierHot, domain.SyncReasonSession)
	}
	return mb
}

// userIndex finds the live mailboxes of a user (user id, then mailbox id).
type userIndex map[string]map[string]*mbox

func (x userIndex) add(mb *mbox) {
	u := x[mb.rec.UserID]
	if u == nil {
		u = map[string]*mbox{}
		x[mb.rec.UserID] = u
	}
	u[mb.rec.MailboxID] = mb
}

func (x userIndex) remove(mb *mbox) {
	if u := x[mb.rec.UserID]; u != nil {
		delete(u, mb.rec.MailboxID)
		if len(u) == 0 {
			delete(x, mb.rec.UserID)
		}
	}
}

// removeLocked stops and forgets a removed mailbox and clears its tier
// record.
func (w *Worker) removeLocked(mb *mbox) {
	w.sup.stop(mb.rec.MailboxID)
	delete(mb.part.boxes, mb.rec.MailboxID)
	w.byUser.remove(mb)
	if epoch, live := w.own.live(mb.part.id); live {
		w.queue.add(pendingWrite{partition: mb.part.id, epoch: epoch, mailboxID: mb.rec.MailboxID,
			recs: []*kgo.Record{tierTombstone(mb.rec.MailboxID)}})
	}
}

// startLocked starts mb's runner if its partition is live and it is
// enabled, at the partition's epoch. A runner of the same mailbox still
// stopping is waited for first (supervisor).
func (w *Worker) startLocked(mb *mbox) {
	part := mb.part
	epoch, live := w.own.live(part.id)
	if !live || !mb.rec.Enabled {
		return
	}
	id := mb.rec.MailboxID
	w.sup.start(&Job{
		Mailbox: mb.rec, Partition: part.id, Epoch: epoch, Owner: w.cfg.WorkerID,
		Writer:   w.own.writer(part.id, epoch, id),
		PollWarm: w.cfg.PollWarm, PollCold: w.cfg.PollCold,
		box:    mb.box,
		report: func(t time.Time, known bool) { w.reportMail(mb, t, known) },
	})
}

// reportMail records a runner's newest mail and asks for an evaluation.
func (w *Worker) reportMail(mb *mbox, t time.Time, known bool) {
	w.mu.Lock()
	mb.mailKnown = mb.mailKnown || known
	if t.After(mb.newestMail) {
		mb.newestMail = t
	}
	w.mu.Unlock()
	kick(w.tiers.eval)
}

// setTierLocked changes mb's tier (telling its runner at once) and queues
// the change under its partition's epoch. It reports whether the tier
// changed.
func (w *Worker) setTierLocked(mb *mbox, t domain.SyncTier, reason string) bool {
	c, _ := w.own.get(mb.part.id)
	from, changed := w.tiers.set(mb, c.epoch, t, reason)
	if changed {
		w.sup.retiered(mb.rec.MailboxID, from, t)
	}
	return changed
}

// evaluate decides the tiers of every mailbox of the live partitions and
// applies the changes; prune drops sessions that ended.
func (w *Worker) evaluate(prune bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.evaluateLocked(prune)
}

func (w *Worker) evaluateLocked(prune bool) {
	var boxes []*mbox
	for id, p := range w.parts {
		if _, live := w.own.live(id); !live {
			continue
		}
		for _, mb := range p.boxes {
			boxes = append(boxes, mb)
		}
	}
	for i, d := range w.tiers.evaluate(w.cfg.Now(), boxes, prune) {
		w.setTierLocked(boxes[i], d.Tier, d.Reason)
	}
}

// usersActive records users' activity and promotes their mailboxes in
// live partitions to hot at once.
func (w *Worker) usersActive(batch []activity) {
	now := w.cfg.Now()
	caughtUp := w.tiers.caughtUp()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range batch {
		if !w.tiers.sessionStarted(a.user, a.at, now) {
			continue
		}
		for _, mb := range w.byUser[a.user] {
			if _, live := w.own.live(mb.part.id); !live {
				continue
			}
			if w.setTierLocked(mb, domain.SyncTierHot, domain.SyncReasonSession) && w.sup.running(mb.rec.MailboxID) && caughtUp {
				// The realtime objective: user.active to a hot runner.
				w.tiers.activity.Applied(now, a.at)
			}
		}
	}
}

// recordAgainLocked queues, under p's current epoch, the tier of each of
// p's mailboxes whose last change was refused by the fence.
func (w *Worker) recordAgainLocked(p *partition) {
	c, _ := w.own.get(p.id)
	for _, mb := range p.boxes {
		if !mb.unrecorded {
			continue
		}
		mb.unrecorded = false
		tier, reason := mb.box.current()
		w.tiers.record(p.id, c.epoch, mb.rec.MailboxID, mb.unrecordedFrom, tier, reason)
	}
}
