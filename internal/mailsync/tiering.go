package mailsync

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/consume"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

// tiering decides how eagerly each owned mailbox is synced. The rule is
// domain.SyncTierPolicy (EvaluateTiers); tiering applies it to the
// worker's live mailboxes on the injected clock, keeps the users' sessions
// from user.active, and records each decision as the mailbox's sync.tier
// record and sync.audit tier_changed event, queued under the partition's
// epoch (a new owner inherits the tier; a decision made under an epoch
// that moved on is refused by the fence).
//
// Its lock guards the sessions; a mailbox's tier state (its tierBox and
// what its runner reported) is the worker's, which calls in holding its
// own lock.
type tiering struct {
	cfg   Config
	kcfg  kafka.Config
	log   *slog.Logger
	m     *metrics
	queue *outboxQueue
	eval  chan struct{} // asks evalLoop for an evaluation soon
	// activity measures the reader of user events as the realtime
	// consumer (internal/sla): lag per user partition, and user.active to
	// a running mailbox made hot.
	activity *sla.Meter

	mu            sync.Mutex
	sessions      map[string]time.Time // user id: latest activity
	usersCaughtUp bool                 // the user events there at start are read
}

func newTiering(cfg Config, kcfg kafka.Config, log *slog.Logger, m *metrics, queue *outboxQueue) *tiering {
	return &tiering{cfg: cfg, kcfg: kcfg, log: log, m: m, queue: queue, eval: make(chan struct{}, 1),
		activity: sla.NewMeter(cfg.Registerer, sla.SyncActivity, sla.WithClock(cfg.Now)), sessions: map[string]time.Time{}}
}

// activity is a user's user.active at a time.
type activity struct {
	user string
	at   time.Time
}

// followUsers reads user.active events from now minus the session grace,
// as a plain consumer on the runtime (every worker reads every user
// partition), keeping the latest activity per user and handing each batch
// to promote.
func (t *tiering) followUsers(ctx context.Context, promote func([]activity)) {
	since := t.cfg.Now().Add(-t.cfg.TierSessionGrace)
	var ends map[int32]int64
	caughtUp := false
	handle := func(_ context.Context, b *consume.Batch) error {
		var batch []activity
		for _, r := range b.Records {
			if a, ok := t.decodeActivity(r); ok {
				batch = append(batch, a)
			}
		}
		if len(batch) > 0 {
			promote(batch)
		}
		if !caughtUp {
			b.Fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
				if n := len(fp.Records); n > 0 && fp.Records[n-1].Offset+1 >= ends[fp.Partition] {
					delete(ends, fp.Partition)
				}
			})
			if len(ends) == 0 {
				caughtUp = true
				t.setCaughtUp(true)
			}
		}
		return nil
	}
	topic := t.kcfg.Topic(topics.UserEvents)
	c, err := consume.New(t.kcfg.WithClientID(t.kcfg.ClientID+"-users"), string(sla.SyncActivity),
		consume.Topics(kgo.NewOffset().AfterMilli(since.UnixMilli()), topic), handle,
		consume.WithKgoOptions(kgo.FetchMaxWait(500*time.Millisecond)),
		// Redriven from the DLQ for another consumer: its append time is
		// the redrive's, not the user's activity.
		consume.SkipRedriven(string(sla.SyncActivity)),
		consume.Metered(t.activity),
		consume.WithLogger(t.log), consume.WithRegisterer(t.cfg.Registerer), consume.WithClock(t.cfg.Now))
	if err != nil {
		t.log.Error("user events consumer; sessions will not promote", "err", err)
		return
	}
	// Until the events that were already there at start are read, a
	// promotion is catching up, not a latency worth measuring.
	ends = userEnds(ctx, c.Client(), topic)
	caughtUp = len(ends) == 0
	t.log.Debug("following user events", "since", since, "to_catch_up", len(ends))
	t.setCaughtUp(caughtUp)
	_ = c.Run(ctx) // the handler never fails
}

// userEnds lists the end offsets of the user topic's non-empty partitions.
func userEnds(ctx context.Context, cl *kgo.Client, topic string) map[int32]int64 {
	ends := map[int32]int64{}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if listed, err := kadm.NewClient(cl).ListEndOffsets(lctx, topic); err == nil {
		listed.Each(func(o kadm.ListedOffset) {
			if o.Err == nil && o.Offset > 0 {
				ends[o.Partition] = o.Offset
			}
		})
	}
	return ends
}

// decodeActivity reads a user.active record; other records are skipped
// (the runtime dropped those redriven for another consumer already).
func (t *tiering) decodeActivity(r *kgo.Record) (activity, bool) {
	e, err := topics.Decode(r)
	if err != nil {
		t.m.badRecords.Inc()
		return activity{}, false
	}
	ua, ok := e.Data.(*domain.UserActive)
	if !ok {
		return activity{}, false
	}
	// The time mailplane stamped on the record, never later than this
	// worker's clock: a user.active dated ahead cannot keep a session hot
	// past its grace.
	return activity{ua.UserID, domain.TrustedTime(r.Timestamp, t.cfg.Now())}, true
}

func (t *tiering) setCaughtUp(v bool) {
	t.mu.Lock()
	t.usersCaughtUp = v
	t.mu.Unlock()
}

// caughtUp reports whether the user events there at start were read.
func (t *tiering) caughtUp() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.usersCaughtUp
}

// sessionStarted records a user's activity at; it reports whether the
// user is in session at now.
func (t *tiering) sessionStarted(user string, at, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if at.After(t.sessions[user]) {
		t.sessions[user] = at
	}
	return now.Sub(at) <= t.cfg.TierSessionGrace
}

// inSession reports whether user is in session at now.
func (t *tiering) inSession(user string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.sessions[user]
	return ok && now.Sub(at) <= t.cfg.TierSessionGrace
}

// evaluate decides the tiers of boxes at now (the hot budget is the
// worker's, over all of them); prune drops sessions that ended.
func (t *tiering) evaluate(now time.Time, boxes []*mbox, prune bool) []domain.SyncTierDecision {
	// A fixed order: ties in the budget go the same way on every run.
	slices.SortFunc(boxes, func(a, b *mbox) int { return strings.Compare(a.rec.MailboxID, b.rec.MailboxID) })
	in := make([]domain.SyncTierInput, len(boxes))
	t.mu.Lock()
	for i, mb := range boxes {
		cur, _ := mb.box.get()
		in[i] = domain.SyncTierInput{Current: cur, SessionAt: t.sessions[mb.rec.UserID], MailKnown: mb.mailKnown,
			NewestMail: mb.newestMail, TrackedSince: mb.trackedSince, AddedAt: mb.rec.AddedAt}
	}
	if prune {
		for u, at := range t.sessions {
			if now.Sub(at) > t.cfg.TierSessionGrace {
				delete(t.sessions, u)
			}
		}
	}
	t.mu.Unlock()
	return domain.EvaluateSyncTiers(now, t.cfg.policy(), in)
}

// set changes mb's tier (its runner is told at once) and queues the change
// for sync.tier and sync.audit under epoch of mb's partition. It reports
// the tier before and whether it changed.
func (t *tiering) set(mb *mbox, epoch int64, to domain.SyncTier, reason string) (from domain.SyncTier, changed bool) {
	from, changed = mb.box.set(to, reason)
	if !changed {
		return from, false
	}
	t.m.tierChanges.WithLabelValues(string(to)).Inc()
	t.record(mb.part.id, epoch, mb.rec.MailboxID, from, to, reason)
	return from, true
}

// record queues a mailbox's tier record and tier_changed event (none when
// from is to: a record written again) under epoch of partition, stamped
// with the injected clock.
func (t *tiering) record(partition int32, epoch int64, mailboxID string, from, to domain.SyncTier, reason string) {
	recs, err := tierRecords(t.cfg.WorkerID, partition, epoch, mailboxID, from, to, reason, t.cfg.Now().UTC())
	if err != nil {
		t.log.Error("encoding a tier change", "mailbox", mailboxID, "err", err)
		return
	}
	t.queue.add(pendingWrite{partition: partition, epoch: epoch, mailboxID: mailboxID, from: from, to: to, recs: recs})
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

// evalLoop calls evaluate(prune) on the cadence (pruning ended sessions),
// and soon after a runner reports mail or the live set changes.
func (t *tiering) evalLoop(ctx context.Context, evaluate func(prune bool)) {
	tick := time.NewTicker(t.cfg.TierEvaluateEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			evaluate(true)
		case <-t.eval:
			// Let a burst of reports land first.
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			evaluate(false)
		}
	}
}

// readTiers reads sync.tier partitions to their last stable offsets: per
// mailbox, the last record, unless an earlier one was written under a
// higher epoch (a stale owner's late record loses).
func (t *tiering) readTiers(ctx context.Context, ids []int32) (map[int32]map[string]domain.SyncTierRecord, error) {
	out := map[int32]map[string]domain.SyncTierRecord{}
	for _, id := range ids {
		out[id] = map[string]domain.SyncTierRecord{}
	}
	_, err := kafka.ReadToEnd(ctx, t.kcfg, kafka.ReadSpec{
		Topics:     []string{t.kcfg.Topic(topics.SyncTier)},
		Partitions: func(string, int) []int32 { return ids },
		ClientID:   "tiers",
	}, func(r *kgo.Record) error {
		t.foldTier(out[r.Partition], r)
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("reading sync.tier: %w", err)
	}
	return out, nil
}

// foldTier applies one sync.tier record to a partition's tiers (nil: a
// partition not asked for), counting records that do not decode.
func (t *tiering) foldTier(tiers map[string]domain.SyncTierRecord, r *kgo.Record) {
	if err := FoldTierRecord(tiers, r); err != nil {
		t.m.badRecords.Inc()
	}
}

// FoldTierRecord applies one sync.tier record to the tiers read so far of
// its partition (nil: decode only): a tombstone drops the mailbox, and a
// record written under a lower epoch than the one held loses (a stale
// owner's late record). It returns the error of a record that does not
// decode, which changes nothing.
func FoldTierRecord(tiers map[string]domain.SyncTierRecord, r *kgo.Record) error {
	rec, live, err := DecodeTierRecord(r)
	if err != nil {
		return err
	}
	if tiers == nil {
		return nil
	}
	if !live {
		delete(tiers, rec.MailboxID)
		return nil
	}
	if prev, ok := tiers[rec.MailboxID]; ok && prev.Epoch > rec.Epoch {
		return nil
	}
	tiers[rec.MailboxID] = rec
	return nil
}

// listOffsets returns the log start and last stable offsets of partitions
// of topic; a partition it cannot list is missing from ends (-1 when read).
func listOffsets(ctx context.Context, adm *kadm.Client, log *slog.Logger, topic string, ids []int32) (starts, ends map[int32]int64) {
	starts, ends = map[int32]int64{}, map[int32]int64{}
	for _, id := range ids {
		ends[id] = -1
	}
	s, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		log.Warn("listing start offsets", "topic", topic, "err", err)
		return starts, ends
	}
	e, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		log.Warn("listing end offsets", "topic", topic, "err", err)
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
