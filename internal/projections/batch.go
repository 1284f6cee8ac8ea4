package projections

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/applyonce"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/topics"
)

// accept queues the records of a poll on their partitions; those of a
// partition in flight wait in its incoming list until it is handed back.
// Called by the poll loop between rounds, or by a lane with qmu held.
func (s *session) accept(fs kgo.Fetches) {
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		pt := s.parts[topicPartition{fp.Topic, fp.Partition}]
		if pt == nil {
			// Not ours (any more): BlockRebalanceOnPoll makes this
			// unexpected, and the owner reads the records.
			return
		}
		pt.hwm = max(pt.hwm, fp.HighWatermark)
		if n := len(fp.Records); n > 0 {
			pt.fetched = fp.Records[n-1].Offset + 1
		}
		for _, r := range fp.Records {
			var it *item
			if d, ok := r.Context.(*decoded); ok {
				it = &d.it
			} else {
				// Another hook (WithKgoOptions) replaced the context.
				it = &item{rec: r}
				it.decode(s.p.name)
			}
			it.pt = pt
			if pt.busy {
				pt.incoming = append(pt.incoming, it)
				continue
			}
			pt.enqueue(it)
		}
	})
	s.adaptBatch()
}

// decodeHook decodes every record as the client buffers it, in the
// client's fetch goroutine, and hands the result to the poll loop in the
// record's Context, franz-go's place for enriching consumed records in a
// hook. Decoding (JSON and validation) is most of the projector's own work:
// done there, it overlaps the transaction in flight instead of delaying the
// next one. consumer is the projector's name.
type decodeHook struct{ consumer string }

func (h decodeHook) OnFetchRecordBuffered(r *kgo.Record) {
	parent := r.Context
	if parent == nil {
		parent = context.Background()
	}
	d := &decoded{Context: parent, it: item{rec: r}}
	d.it.decode(h.consumer)
	r.Context = d
}

// decoded is a record's Context once decodeHook has seen it.
type decoded struct {
	context.Context
	it item
}

// decode decodes the record for consumer (Decode).
func (it *item) decode(consumer string) {
	ev, id, other, err := Decode(it.rec, consumer)
	switch {
	case other:
		it.other = true
	case err != nil:
		it.code, it.err = domain.ErrorCode(err), err
	default:
		it.ev, it.id, it.ok = ev, id, true
	}
}

// Decode decodes a record for consumer as its projector does, and as a
// rebuild of its projection does: other says the record was redriven from
// the DLQ for another consumer, so it is passed, never applied nor
// dead-lettered (dlq.ForOtherConsumer); an error marks a poison record
// (DecodeEvent).
func Decode(r *kgo.Record, consumer string) (ev domain.Event, id [16]byte, other bool, err error) {
	if dlq.ForOtherConsumer(r, consumer) {
		return domain.Event{}, [16]byte{}, true, nil
	}
	ev, id, err = DecodeEvent(r)
	return ev, id, false, err
}

// DecodeEvent decodes a record as a projector does: its event, and the id
// the event is remembered by in applied_events (the event id, or one
// derived from source and id, domain.EventKey: always a UUID). An error
// marks a poison record, which a projector dead-letters and passes.
func DecodeEvent(r *kgo.Record) (domain.Event, [16]byte, error) {
	ev, err := topics.Decode(r)
	if err != nil {
		return domain.Event{}, [16]byte{}, err
	}
	id, err := uuid.Parse(ev.Key())
	if err != nil {
		return domain.Event{}, [16]byte{}, domain.Errorf(domain.CodeInternal, "event key %q is not a UUID", ev.Key())
	}
	return ev, id, nil
}

// drain applies queued records until none is left to apply, or ctx (the
// Run) is done, or the group waits, or rctx (the round) is canceled.
// What is left stays queued for the next round.
//
// Up to WithConcurrency lanes apply batches side by side, each transaction
// on its own connection and on partitions no other lane holds: a
// partition's records are applied by one transaction after another, in
// offset order, so each key's are too. Each lane takes its share of what
// is queued, so that the lanes run side by side rather than one after
// another; a lane that finds nothing to take polls what the client has
// buffered meanwhile, for up to maxRound, so that the lanes need not wait
// for each other at the end of every poll. It does so only while the
// round's own poll holds the rebalance gate (see gateHeld).
func (s *session) drain(ctx, rctx context.Context) {
	s.roundEnd = time.Now().Add(maxRound)
	var wg sync.WaitGroup
	for range s.p.cfg.concurrency {
		wg.Go(func() { s.lane(ctx, rctx) })
	}
	wg.Wait()
}

// maxRound bounds how long lanes keep polling for more records within a
// round: the poll loop's housekeeping (pausing partitions, lag gauges,
// committing to Kafka) and rebalances run between rounds.
const maxRound = time.Second

// minLaneBatch is the smallest share worth a transaction of its own: below
// it, one lane takes what is queued (up to a batch).
const minLaneBatch = 256

// lane applies batches until take finds none left.
func (s *session) lane(ctx, rctx context.Context) {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	for {
		b := s.take(ctx, rctx)
		if len(b) == 0 {
			return
		}
		rs := runs(b)
		for _, r := range rs {
			r.pt.busy, r.pt.held = true, len(r.pt.queue)
		}
		s.inflight++
		s.qmu.Unlock()

		s.apply(ctx, rctx, b)

		s.qmu.Lock()
		for _, r := range rs {
			r.pt.release()
		}
		s.inflight--
		s.qcond.Broadcast()
	}
}

// take returns a lane's next batch, or nil when the round is over for it:
// interrupted, or nothing left to take for any lane. It waits while what
// is left belongs to lanes in flight. Called with qmu held.
func (s *session) take(ctx, rctx context.Context) []*item {
	polled := false
	for {
		if s.interrupted(ctx, rctx) {
			return nil
		}
		// A fair share of what the idle lanes may take.
		idle := s.p.cfg.concurrency - s.inflight
		share := (s.queued() + idle - 1) / idle
		if b := s.nextBatch(time.Now(), max(share, minLaneBatch)); len(b) > 0 {
			return b
		}
		if !polled && s.gateHeld && time.Now().Before(s.roundEnd) {
			polled = true
			if s.pollBuffered() > 0 {
				continue
			}
		}
		if s.inflight == 0 {
			// Nothing left that any lane could take.
			s.qcond.Broadcast()
			return nil
		}
		// What is left belongs to partitions in flight (or failing ones,
		// not yet due): wait for a lane to hand its back.
		s.qcond.Wait()
		polled = false
	}
}

// pollBuffered takes what the client has buffered, without waiting, into
// the queues, and returns how many records that was. Called by a lane with
// qmu held.
func (s *session) pollBuffered() int {
	fs := s.cons.PollBuffered(s.pollSize())
	if fs.IsClientClosed() {
		return 0
	}
	s.logFetchErrors(fs)
	s.accept(fs)
	return fs.NumRecords()
}

// queued counts the records a lane could take now: those of the partitions
// neither in flight nor failing.
func (s *session) queued() int {
	n := 0
	for _, pt := range s.order {
		if !pt.busy && !pt.failing() {
			n += len(pt.queue)
		}
	}
	return n
}

func (s *session) interrupted(ctx, rctx context.Context) bool {
	return ctx.Err() != nil || rctx.Err() != nil || s.groupWaits()
}

// nextBatch returns the records of the next transaction, grouped by
// partition in batch order, each partition's in offset order: a failing
// partition due for a retry alone, else the heads of the healthy
// partitions' queues, whole queues until there are at least share records
// (so that a partition's records go to one transaction, not two side by
// side), never more than a batch. Partitions in flight are skipped.
func (s *session) nextBatch(now time.Time, share int) []*item {
	size := s.batch
	for _, pt := range s.order {
		if !pt.busy && pt.due(now) {
			return pt.retryBatch(size)
		}
	}
	var b []*item
	for _, pt := range s.order {
		if pt.busy || pt.failing() || len(pt.queue) == 0 {
			continue
		}
		n := min(len(pt.queue), size-len(b))
		b = append(b, pt.queue[:n]...)
		if len(b) >= min(share, size) {
			break
		}
	}
	return b
}

// apply commits b, taking the records at fault out of it. Every failure
// sets partitions aside (they stay queued) and the rest goes on:
//
//   - the projection refuses the batch: applyonce.Isolate, the one poison
//     path (the rebuild's too), halves it until the event at fault stands
//     alone; that event's partition is retried alone after a backoff, up
//     to Attempts times, and the event then goes to the DLQ, before the
//     transaction that moves past it;
//   - a transient failure (database down, a deadlock, a timeout): each
//     partition of the batch is retried alone after a backoff, so one that
//     keeps failing holds up no other;
//   - a fence (another member or an operator moved an offset row): those
//     partitions re-read their position and come back in the next batch.
func (s *session) apply(ctx, rctx context.Context, b []*item) {
	b = s.deadLetterPoison(rctx, b)
	a := &applying{s: s, ctx: ctx, rctx: rctx}
	// Its error is rctx's, or none: the session is stopping, or every
	// record is committed, dead or set aside.
	_ = applyonce.Isolate(rctx, b, a, s.p.cfg.retry.Attempts)
}

// applying is one apply's side of applyonce.Isolate: the projector's
// effect for a poison record (the DLQ) and for the other failures.
type applying struct {
	s         *session
	ctx, rctx context.Context
	aside     map[*partition]bool
}

func (a *applying) Interrupted() bool                        { return a.s.interrupted(a.ctx, a.rctx) }
func (a *applying) Live(it *item) bool                       { return it.live() }
func (a *applying) Aside(it *item) bool                      { return a.aside[it.pt] }
func (a *applying) Tries(it *item) (*applyonce.Tries, int64) { return &it.pt.tries, it.rec.Offset }

// setAside leaves pt out of this apply's later commits.
func (a *applying) setAside(pt *partition) {
	if a.aside == nil {
		a.aside = map[*partition]bool{}
	}
	a.aside[pt] = true
}

// retryLater sets pt aside, to be retried alone after a backoff.
func (a *applying) retryLater(pt *partition) time.Duration {
	a.setAside(pt)
	return pt.retryLater(a.s.p.cfg.retry.MaxBackoff)
}

// Commit commits b, counting a refusal.
func (a *applying) Commit(ctx context.Context, b []*item) error {
	err := a.s.commit(ctx, b)
	var re *applyonce.RefusedError
	if errors.As(err, &re) && ctx.Err() == nil {
		p := a.s.p
		p.m.retries.WithLabelValues(p.name, "permanent").Inc()
		live := 0
		for _, it := range b {
			if it.live() {
				live++
			}
		}
		if live > 1 {
			p.log.Warn("projection rejected a batch; halving it", "records", len(b), "code", re.Code, "err", re.Err)
		}
	}
	return err
}

// Refused retries an event refused alone after a backoff, or, when it is
// poison, sends it to the DLQ (marking it dead, so the next commit moves
// past it); its partition is set aside if the DLQ did not take it.
func (a *applying) Refused(ctx context.Context, it *item, r applyonce.Refusal) {
	p, pt := a.s.p, it.pt
	if !r.Poison {
		wait := a.retryLater(pt)
		p.log.Warn("projection rejected an event; retrying it alone", "topic", pt.topic, "partition", pt.id,
			"offset", it.rec.Offset, "attempt", r.Attempts, "backoff", wait, "code", r.Code, "err", r.Err)
		return
	}
	if failed := a.s.deadLetter(ctx, []deadLetter{{it, r.Code, r.Err, r.Attempts}}); failed[pt] {
		a.retryLater(pt)
	}
}

// Failed sets aside the partitions of a failed transaction: to re-read
// their positions after a fence (the rest is committed again), else to be
// retried alone after a backoff.
func (a *applying) Failed(_ context.Context, cur []*item, err error) (again bool, stop error) {
	p := a.s.p
	var fe *fenceError
	if errors.As(err, &fe) {
		p.m.retries.WithLabelValues(p.name, "fenced").Inc()
		for pt, current := range fe.current {
			a.s.refence(pt, current)
			a.setAside(pt)
		}
		return true, nil
	}
	var wait time.Duration
	for _, r := range runs(cur) {
		wait = a.retryLater(r.pt)
	}
	if errors.As(err, new(*applyonce.RefusedError)) {
		// commit never reports a refusal without events.
		p.log.Error("apply failed with no events", "err", err)
		return false, nil
	}
	p.m.retries.WithLabelValues(p.name, "transient").Inc()
	p.log.Warn("transaction failed; retrying its partitions alone", "records", len(cur),
		"first", cur[0].pt.topic, "partition", cur[0].pt.id, "offset", cur[0].rec.Offset, "backoff", wait, "err", err)
	return false, nil
}

// refence adopts the offset another member or an operator left in a
// partition's row.
func (s *session) refence(pt *partition, current int64) {
	if pt.next >= 0 && current > pt.next {
		// Another member applied up to current (this one had lost the
		// partition without knowing, or the other had it before): skip
		// what it covered.
		s.p.log.Info("the Postgres offset is ahead of this member's position; skipping forward",
			"topic", pt.topic, "partition", pt.id, "offset", current, "position", pt.next)
		pt.advance(current)
		return
	}
	// Unknown position, or the row went backwards (an operator rewound the
	// projector): read again from what Postgres says. Safe here: the round
	// holds the client until AllowRebalance, and qmu keeps the other lanes
	// from polling meanwhile, so no record read from before the seek is
	// queued after it.
	s.p.log.Warn("the Postgres offset is behind this member's position (rewound?); reading again from it",
		"topic", pt.topic, "partition", pt.id, "offset", current, "position", pt.next)
	s.qmu.Lock()
	defer s.qmu.Unlock()
	s.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{pt.topic: {pt.id: {Epoch: -1, Offset: current}}})
	pt.restart(current, s.p.cfg.retry.Backoff)
}

// run is one partition's records in a batch.
type run struct {
	pt    *partition
	items []*item
}

// runs splits b, grouped by partition, into its partitions' runs.
func runs(b []*item) []run {
	var out []run
	for i := 0; i < len(b); {
		j := i + 1
		for j < len(b) && b[j].pt == b[i].pt {
			j++
		}
		out = append(out, run{b[i].pt, b[i:j]})
		i = j
	}
	return out
}

func without(b []*item, aside map[*partition]bool) []*item {
	out := make([]*item, 0, len(b))
	for _, it := range b {
		if !aside[it.pt] {
			out = append(out, it)
		}
	}
	return out
}

// fenceError says offset rows did not hold what the batch expected: current
// is what they hold, by partition (0 for no row).
type fenceError struct{ current map[*partition]int64 }

func (e *fenceError) Error() string { return "projector offsets moved under this member" }

// commit applies b in one transaction through applyonce.Run (the
// transaction every rebuild runs too): move every partition's offset past
// its records (fenced), record the event ids (which finds the duplicates),
// apply the new events, commit.
func (s *session) commit(ctx context.Context, b []*item) (err error) {
	p := s.p
	rs := runs(b)
	all := offsetMoves(rs)
	live, ids, recs := firstCopies(b)

	// The registry's Go work (fold, rows) happens here, before the
	// transaction, so that the transaction holds its locks and its
	// connection for its writes alone, and, with WithSerialWrites, while
	// another lane's transaction runs. The wait for the writer slot
	// (another lane's transaction, itself bounded) is not the
	// transaction's, so not on its clock. Only the registry itself, not a
	// projection that embeds it (its Apply is its own), prepares.
	reg, prepares := p.proj.(*Registry)
	var write func(context.Context, pgx.Tx) error
	keys := ids // ids as Run inserts them; ids[i] stays recs[i]'s
	release := func() {}
	if prepares && len(recs) > 0 {
		if write, err = reg.prepare(recs); err != nil {
			return applyonce.Refuse(err)
		}
		keys = slices.Clone(ids)
		applyonce.SortIDs(keys)
	}
	if prepares && len(recs) > 0 && p.cfg.serialWrites {
		select {
		case p.writers <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("wait for a writer slot: %w", ctx.Err())
		}
		held := true
		release = func() {
			if held {
				held = false
				<-p.writers
			}
		}
		defer release()
	}

	// Bounded: a connection that hangs without failing must not hold the
	// loop for ever; a timeout is a transient failure, retried.
	ctx, cancel := context.WithTimeout(ctx, p.cfg.txTimeout)
	defer cancel()
	start := time.Now()
	batch := applyonce.Batch{Projector: p.name, Moves: all, IDs: keys, Async: !p.cfg.syncCommit, Now: p.cfg.now()}
	applied := recs
	err = applyonce.Run(ctx, p.pool, batch, func(ctx context.Context, tx pgx.Tx, fresh map[[16]byte]struct{}) error {
		w := write
		applied = recs
		if fresh != nil {
			if applied = keepFresh(recs, ids, fresh); len(applied) != len(recs) {
				// Rare (a duplicate): prepared for records no longer all
				// there, so applied the plain way.
				w = nil
			}
		}
		if len(applied) == 0 {
			return nil // every event was applied before
		}
		if w == nil {
			w = func(ctx context.Context, tx pgx.Tx) error { return p.proj.Apply(ctx, tx, applied) }
		}
		return w(ctx, tx)
	})
	if errors.Is(err, applyonce.ErrFenced) {
		return s.fenced(ctx, rs, all)
	}
	if err != nil {
		return err
	}
	release()
	p.committedTx(rs, all, live, applied, start)
	return nil
}

// keepFresh returns the records whose ids (ids[i] is recs[i]'s) are in
// fresh: those never applied before.
func keepFresh(recs []Record, ids [][16]byte, fresh map[[16]byte]struct{}) []Record {
	kept := make([]Record, 0, len(recs))
	for i, r := range recs {
		if _, ok := fresh[ids[i]]; ok {
			kept = append(kept, r)
		}
	}
	return kept
}

// committedTx moves the partitions past a committed transaction and
// reports it: metrics, and the WithCommitted callback.
func (p *Projector) committedTx(rs []run, all applyonce.Moves, live int, recs []Record, start time.Time) {
	for i, r := range rs {
		r.pt.advance(all.Next[i])
		r.pt.healthy(p.cfg.retry.Backoff)
	}
	p.m.batchSeconds.WithLabelValues(p.name).Observe(time.Since(start).Seconds())
	p.m.applied.WithLabelValues(p.name).Add(float64(len(recs)))
	now := p.cfg.now()
	for _, r := range recs {
		p.meter.Applied(now, r.Appended)
	}
	if dups := live - len(recs); dups > 0 {
		p.m.duplicates.WithLabelValues(p.name).Add(float64(dups))
	}
	if p.cfg.committed != nil && len(recs) > 0 {
		p.committedMu.Lock()
		p.cfg.committed(Events(recs))
		p.committedMu.Unlock()
	}
}

// offsetMoves returns the moves of every run, in order: from the
// partition's position past its last record.
func offsetMoves(rs []run) (all applyonce.Moves) {
	for _, r := range rs {
		all.Add(r.pt.topic, r.pt.id, r.pt.next, r.items[len(r.items)-1].rec.Offset+1)
	}
	return all
}

// firstCopies returns how many of b's records are live, and the ids and
// records of the first copy of each event among them: that is the one
// applied.
func firstCopies(b []*item) (live int, ids [][16]byte, recs []Record) {
	ids = make([][16]byte, 0, len(b))
	recs = make([]Record, 0, len(b))
	seen := make(map[[16]byte]struct{}, len(b))
	for _, it := range b {
		if !it.live() {
			continue
		}
		live++
		if _, dup := seen[it.id]; !dup {
			seen[it.id] = struct{}{}
			ids = append(ids, it.id)
			recs = append(recs, Record{Event: it.ev, Topic: it.rec.Topic, Partition: it.rec.Partition, Offset: it.rec.Offset, Appended: it.rec.Timestamp})
		}
	}
	return live, ids, recs
}

// fenced reads the offset rows that did not hold what rs expected.
func (s *session) fenced(ctx context.Context, rs []run, all applyonce.Moves) error {
	pg, err := applyonce.Current(ctx, s.p.pool, s.p.name, all)
	if err != nil {
		return err
	}
	fe := &fenceError{current: map[*partition]int64{}}
	for _, r := range rs {
		if current := pg[kafka.Partition{Topic: r.pt.topic, Partition: r.pt.id}]; current != r.pt.next {
			fe.current[r.pt] = current
		}
	}
	if len(fe.current) == 0 {
		// Rows moved and moved back under us, or a row inserted under us
		// vanished again: try again.
		return errors.New("projector offsets moved under this member and back")
	}
	return fe
}

// deadLetter is a record bound for the DLQ, and why.
type deadLetter struct {
	it       *item
	code     domain.Code
	cause    error
	attempts int
}

// deadLetterPoison sends b's undecodable records to the DLQ before any
// transaction moves an offset past them, so nothing is lost even if the
// process dies right after. The partitions of those the DLQ did not take
// are set aside, to be retried.
func (s *session) deadLetterPoison(ctx context.Context, b []*item) []*item {
	var dls []deadLetter
	for _, it := range b {
		if !it.ok && !it.dead && !it.other {
			dls = append(dls, deadLetter{it, it.code, it.err, 1})
		}
	}
	if len(dls) == 0 {
		return b
	}
	failed := s.deadLetter(ctx, dls)
	if len(failed) == 0 {
		return b
	}
	for pt := range failed {
		pt.retryLater(s.p.cfg.retry.MaxBackoff)
	}
	return without(b, failed)
}

// deadLetter sends dls to the DLQ (acks from all in-sync replicas) and
// marks the records dead. It returns the partitions of the records the DLQ
// did not take: their offsets must not move past them.
func (s *session) deadLetter(ctx context.Context, dls []deadLetter) (failed map[*partition]bool) {
	p := s.p
	recs := make([]*kgo.Record, len(dls))
	byRec := make(map[*kgo.Record]*deadLetter, len(dls))
	for i := range dls {
		d := &dls[i]
		if d.code == "" {
			d.code = domain.CodeInternal
		}
		f := dlq.Failure{Consumer: p.name, Code: d.code, Err: d.cause.Error(), Attempts: d.attempts}
		recs[i] = dlq.NewRecord(p.kcfg.Namespace, d.it.rec, f)
		byRec[recs[i]] = d
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, res := range s.dlq.ProduceSync(ctx, recs...) {
		d := byRec[res.Record]
		rec := d.it.rec
		if res.Err != nil {
			if failed == nil {
				failed = map[*partition]bool{}
			}
			failed[d.it.pt] = true
			p.log.Error("producing to the DLQ failed; retrying later", "topic", rec.Topic, "partition", rec.Partition,
				"offset", rec.Offset, "err", res.Err)
			continue
		}
		d.it.dead = true
		p.m.dlq.WithLabelValues(p.name, string(d.code)).Inc()
		// The error text never holds a record's value (decode errors name
		// fields and codes), so it is safe to log.
		p.log.Warn("record sent to the DLQ", "topic", rec.Topic, "partition", rec.Partition,
			"offset", rec.Offset, "code", d.code, "attempts", d.attempts, "err", d.cause)
	}
	return failed
}
