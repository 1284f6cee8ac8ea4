package projections

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/dlq"
	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

// partition applies one assigned partition. The poll loop appends fetched
// records to its queue; its goroutine takes up to a batch at a time and
// applies it in one transaction.
type partition struct {
	s     *session
	topic string
	id    int32

	// ctx is canceled only when a stop outlasts the revoke grace, so an
	// in-flight transaction normally finishes.
	ctx    context.Context
	cancel context.CancelFunc
	stop   chan struct{} // closed: finish the current transaction and exit
	done   chan struct{}
	notify chan struct{}

	mu           sync.Mutex
	queue        []*kgo.Record
	hwm          int64
	start        int64 // a position to adopt at the next take ...
	hasStart     bool  // ... when set (assignment or reseek)
	awaitSeek    bool  // a reseek is pending: drop what arrives until done
	reseekTo     int64
	reseekWanted bool // for the poll loop
	paused       bool

	// Owned by the goroutine.
	next    int64          // Postgres's next offset as last seen; -1 unknown
	dlqSent map[int64]bool // offsets already dead-lettered this session

	// position is Postgres's next offset as the goroutine last saw it (-1:
	// unknown), read by the poll loop for lag and Kafka commits.
	position atomic.Int64
	lag      atomic.Int64
}

func newPartition(s *session, topic string, id int32) *partition {
	// Not canceled with the session: on shutdown too, an in-flight
	// transaction gets the grace to commit (see stopAll).
	ctx, cancel := context.WithCancel(context.WithoutCancel(s.ctx))
	pt := &partition{
		s: s, topic: topic, id: id,
		ctx: ctx, cancel: cancel,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		notify:  make(chan struct{}, 1),
		hwm:     -1,
		next:    -1,
		dlqSent: map[int64]bool{},
	}
	pt.position.Store(-1)
	return pt
}

// setStart gives the partition the offset Postgres says is next; the fetch
// starts there.
func (pt *partition) setStart(next int64) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	pt.start, pt.hasStart = next, true
	pt.queue = nil
	pt.position.Store(next)
}

// enqueue appends fetched records and reports whether fetching should pause
// because the queue is past limit.
func (pt *partition) enqueue(recs []*kgo.Record, hwm int64, limit int) (pause bool) {
	pt.mu.Lock()
	if pt.awaitSeek {
		pt.mu.Unlock()
		return false
	}
	pt.queue = append(pt.queue, recs...)
	if hwm > pt.hwm {
		pt.hwm = hwm
	}
	// Lag grows here even while the applier is stuck (database down).
	if pos := pt.position.Load(); pos >= 0 {
		pt.lag.Store(max(pt.hwm-pos, 0))
	}
	if len(pt.queue) >= limit && !pt.paused {
		pt.paused, pause = true, true
	}
	pt.mu.Unlock()
	select {
	case pt.notify <- struct{}{}:
	default:
	}
	return pause
}

// shouldResume reports (once) that a paused partition has drained below low.
func (pt *partition) shouldResume(low int) bool {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if pt.paused && len(pt.queue) < low {
		pt.paused = false
		return true
	}
	return false
}

// take removes up to n records from the queue, and returns a new start
// position if one was set since the last take.
func (pt *partition) take(n int) (recs []*kgo.Record, hwm, start int64, hasStart, paused bool) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	start, hasStart = pt.start, pt.hasStart
	pt.hasStart = false
	n = min(n, len(pt.queue))
	recs = pt.queue[:n:n]
	pt.queue = pt.queue[n:]
	if len(pt.queue) == 0 {
		pt.queue = nil
	}
	return recs, pt.hwm, start, hasStart, pt.paused
}

// requestReseek drops the queue and asks the poll loop to seek to offset.
func (pt *partition) requestReseek(offset int64) {
	pt.mu.Lock()
	pt.queue = nil
	pt.awaitSeek, pt.reseekWanted, pt.reseekTo = true, true, offset
	pt.mu.Unlock()
	pt.s.wake()
}

// pendingReseek is called by the poll loop.
func (pt *partition) pendingReseek() (int64, bool) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if !pt.reseekWanted {
		return 0, false
	}
	pt.reseekWanted = false
	return pt.reseekTo, true
}

// reseeked is called by the poll loop after SetOffsets: from here on, polls
// return records from offset.
func (pt *partition) reseeked(offset int64) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	pt.queue = nil
	pt.awaitSeek = false
	pt.start, pt.hasStart = offset, true
}

func (pt *partition) stopping() bool {
	select {
	case <-pt.stop:
		return true
	default:
		return pt.ctx.Err() != nil
	}
}

// sleep waits d, or less if the partition is stopped.
func (pt *partition) sleep(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-pt.stop:
		return errStopping
	case <-pt.ctx.Done():
		return errStopping
	}
}

func (pt *partition) run() {
	defer close(pt.done)
	log := pt.s.p.log.With("topic", pt.topic, "partition", pt.id)
	for {
		select {
		case <-pt.stop:
			return
		case <-pt.ctx.Done():
			return
		case <-pt.notify:
		}
		for !pt.stopping() {
			recs, hwm, start, hasStart, paused := pt.take(pt.s.p.cfg.batchSize)
			if hasStart {
				pt.next = start
			}
			if len(recs) == 0 {
				if paused {
					// The poll loop resumes fetching once it sees the
					// queue drained.
					pt.s.wake()
				}
				break
			}
			err := pt.process(recs, hwm)
			var rs *reseekError
			switch {
			case err == nil:
			case errors.As(err, &rs):
				log.Warn("the Postgres offset is behind this member's position (rewound?); reading again from it",
					"offset", rs.offset, "position", pt.next)
				pt.requestReseek(rs.offset)
			case errors.Is(err, errStopping), pt.stopping():
				return
			default:
				// process retries until it succeeds or stops; anything
				// else is a bug worth seeing, and the batch is read again.
				log.Error("batch failed; reading again from the Postgres offset", "err", err)
				pt.requestReseek(max(pt.next, 0))
			}
		}
	}
}

// item is one record of a batch, decoded or not.
type item struct {
	rec  *kgo.Record
	ev   domain.Event
	ok   bool        // decoded
	code domain.Code // when not ok
	err  error       // when not ok
	dead bool        // sent to the DLQ after failing to apply
}

func (it *item) live() bool { return it.ok && !it.dead }

// process applies records (in offset order) and moves the partition's
// offset past them.
func (pt *partition) process(recs []*kgo.Record, hwm int64) error {
	// Records Postgres already covers (after a fence moved us forward) are
	// not ours to apply.
	i := 0
	for i < len(recs) && pt.next >= 0 && recs[i].Offset < pt.next {
		i++
	}
	recs = recs[i:]
	if len(recs) == 0 {
		return nil
	}
	items := make([]item, len(recs))
	for i, r := range recs {
		items[i].rec = r
		ev, err := topics.Decode(r)
		if err != nil {
			items[i].code, items[i].err = domain.ErrorCode(err), err
			continue
		}
		items[i].ev, items[i].ok = ev, true
	}
	// A poison record goes to the DLQ before any transaction moves the
	// offset past it: nothing is lost, even if we crash right after.
	for i := range items {
		it := &items[i]
		if it.ok || pt.dlqSent[it.rec.Offset] {
			continue
		}
		if err := pt.deadLetter(it.rec, it.code, it.err, 1); err != nil {
			return err
		}
	}
	if err := pt.apply(items); err != nil {
		return err
	}
	for off := range pt.dlqSent {
		if off < pt.next {
			delete(pt.dlqSent, off)
		}
	}
	lag := max(hwm-pt.next, 0)
	pt.lag.Store(lag)
	pt.s.updateLag(pt.topic)
	return nil
}

// applyFailure is a permanent failure of Apply on a batch.
type applyFailure struct {
	code domain.Code
	err  error
}

func (e *applyFailure) Error() string { return e.err.Error() }
func (e *applyFailure) Unwrap() error { return e.err }

// apply commits items (a contiguous run of offsets) and moves the offset
// past them. When the projection rejects the batch, the batch is halved and
// each half applied in order, until the event at fault stands alone; it is
// tried Attempts times, then sent to the DLQ, and the rest flows on.
func (pt *partition) apply(items []item) error {
	err := pt.attempt(items)
	var af *applyFailure
	if !errors.As(err, &af) {
		return err
	}
	var live []int
	for i := range items {
		if items[i].live() {
			live = append(live, i)
		}
	}
	if len(live) > 1 {
		mid := live[len(live)/2]
		if err := pt.apply(items[:mid]); err != nil {
			return err
		}
		return pt.apply(items[mid:])
	}
	if len(live) == 0 {
		// attempt never reports an apply failure without events.
		return fmt.Errorf("apply failed with no events: %w", err)
	}
	policy := pt.s.p.cfg.retry
	backoff := policy.Backoff
	for attempt := 2; attempt <= policy.Attempts; attempt++ {
		if err := pt.sleep(backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, policy.MaxBackoff)
		err = pt.attempt(items)
		if !errors.As(err, &af) {
			return err // nil, or stopping / reseek
		}
	}
	it := &items[live[0]]
	if err := pt.deadLetter(it.rec, af.code, af.err, policy.Attempts); err != nil {
		return err
	}
	it.dead = true
	return pt.attempt(items)
}

// attempt runs commit until it succeeds, fails permanently, or the
// partition stops or must reseek. Transient failures (database down, a
// deadlock, another member's fence) are retried with backoff, without limit:
// giving up on them would lose nothing but would stop nothing either.
func (pt *partition) attempt(items []item) error {
	policy := pt.s.p.cfg.retry
	backoff := policy.Backoff
	fenced := 0
	for {
		err := pt.commit(items)
		var af *applyFailure
		var rs *reseekError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &af):
			pt.s.p.m.retries.WithLabelValues(pt.s.p.name, "permanent").Inc()
			pt.s.p.log.Warn("projection rejected a batch", "topic", pt.topic, "partition", pt.id,
				"first_offset", items[0].rec.Offset, "records", len(items), "code", af.code, "err", af.err)
			return err
		case errors.As(err, &rs):
			return err
		case pt.stopping():
			return errStopping
		case errors.Is(err, errFenced):
			// The next commit reads the new offset; only back off if
			// the offset keeps moving under us.
			pt.s.p.m.retries.WithLabelValues(pt.s.p.name, "fenced").Inc()
			if fenced++; fenced < 3 {
				continue
			}
		default:
			pt.s.p.m.retries.WithLabelValues(pt.s.p.name, "transient").Inc()
			pt.s.p.log.Warn("batch failed; retrying", "topic", pt.topic, "partition", pt.id,
				"first_offset", items[0].rec.Offset, "records", len(items), "backoff", backoff, "err", err)
		}
		if err := pt.sleep(backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, policy.MaxBackoff)
	}
}

const (
	asyncCommitSQL = `SET LOCAL synchronous_commit = off`

	lockOffsetSQL = `SELECT next_offset FROM projector_offsets
WHERE projector = $1 AND topic = $2 AND partition = $3 FOR UPDATE`

	appliedSQL = `SELECT event_id::text FROM applied_events
WHERE projector = $1 AND event_id = ANY($2::text[]::uuid[])`

	insertAppliedSQL = `INSERT INTO applied_events (projector, event_id)
SELECT $1, unnest($2::text[]::uuid[]) ON CONFLICT DO NOTHING`

	// The WHERE is the fence: the row must still hold the offset this
	// transaction started from. A member that lost the partition without
	// knowing it writes nothing.
	upsertOffsetSQL = `INSERT INTO projector_offsets AS o (projector, topic, partition, next_offset, updated_at)
VALUES ($1, $2, $3, $4, $6)
ON CONFLICT (projector, topic, partition) DO UPDATE
SET next_offset = EXCLUDED.next_offset, updated_at = EXCLUDED.updated_at
WHERE o.next_offset = $5`
)

// commit applies items in one transaction: lock the partition's offset row
// and check it, drop events already applied, apply the rest, record their
// ids, and move the offset past the last item.
func (pt *partition) commit(items []item) (err error) {
	p := pt.s.p
	// Bounded: a connection that hangs without failing must not hold the
	// partition for ever; a timeout is a transient failure, retried.
	ctx, cancel := context.WithTimeout(pt.ctx, p.cfg.txTimeout)
	defer cancel()
	start := time.Now()
	last := items[len(items)-1].rec.Offset
	if last < pt.next {
		return nil // all covered by Postgres already
	}

	var ids []string
	for i := range items {
		if items[i].live() && items[i].rec.Offset >= pt.next {
			ids = append(ids, items[i].ev.ID)
		}
	}

	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			// The transaction may be broken; bound the rollback so a dead
			// connection cannot hold the partition.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = tx.Rollback(rctx)
			cancel()
		}
	}()

	// One round trip: the lock, then (seeing what committed before we got
	// it) the ids already applied.
	b := &pgx.Batch{}
	if !p.cfg.syncCommit {
		// Safe for a projection: rows and offsets commit or vanish
		// together, so a commit lost in a Postgres crash is re-read from
		// the log (the offset row is then behind and the partition
		// re-seeks). It saves a WAL flush per batch, which bounds small
		// batches at a steady rate.
		b.Queue(asyncCommitSQL)
	}
	b.Queue(lockOffsetSQL, p.name, pt.topic, pt.id)
	if len(ids) > 0 {
		b.Queue(appliedSQL, p.name, ids)
	}
	br := tx.SendBatch(ctx, b)
	if !p.cfg.syncCommit {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return fmt.Errorf("set synchronous_commit: %w", err)
		}
	}
	var current int64
	if err := br.QueryRow().Scan(&current); errors.Is(err, pgx.ErrNoRows) {
		current = 0 // no row: nothing applied, start of the log
	} else if err != nil {
		_ = br.Close()
		return fmt.Errorf("lock offset: %w", err)
	}
	seen := map[string]bool{}
	if len(ids) > 0 {
		rows, err := br.Query()
		if err != nil {
			_ = br.Close()
			return fmt.Errorf("applied events: %w", err)
		}
		var id string
		if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { seen[id] = true; return nil }); err != nil {
			_ = br.Close()
			return fmt.Errorf("applied events: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("lock offset: %w", err)
	}

	switch {
	case pt.next < 0 || current < pt.next:
		// Unknown position, or the row went backwards (an operator
		// rewound the projector): read again from what Postgres says.
		return &reseekError{offset: current}
	case current > pt.next:
		// Another member applied up to current (we had lost the partition
		// without knowing, or it had it before us): skip what it covered.
		pt.next = current
		pt.position.Store(current)
		return errFenced
	}

	events := make([]domain.Event, 0, len(ids))
	applied := make([]string, 0, len(ids))
	inBatch := make(map[string]bool, len(ids))
	dups := 0
	for i := range items {
		it := &items[i]
		if !it.live() || it.rec.Offset < pt.next {
			continue
		}
		if seen[it.ev.ID] || inBatch[it.ev.ID] {
			dups++
			continue
		}
		inBatch[it.ev.ID] = true
		events = append(events, it.ev)
		applied = append(applied, it.ev.ID)
	}
	if len(events) > 0 {
		if err := p.proj.Apply(ctx, tx, events); err != nil {
			if code, ok := IsPermanent(err); ok {
				return &applyFailure{code: code, err: err}
			}
			return fmt.Errorf("apply: %w", err)
		}
	}

	b = &pgx.Batch{}
	if len(applied) > 0 {
		b.Queue(insertAppliedSQL, p.name, applied)
	}
	b.Queue(upsertOffsetSQL, p.name, pt.topic, pt.id, last+1, pt.next, p.cfg.now().UTC())
	br = tx.SendBatch(ctx, b)
	if len(applied) > 0 {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return fmt.Errorf("record applied events: %w", err)
		}
	}
	tag, err := br.Exec()
	if err != nil {
		_ = br.Close()
		return fmt.Errorf("write offset: %w", err)
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("write offset: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return errFenced
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}

	pt.next = last + 1
	pt.position.Store(pt.next)
	p.m.batchSeconds.WithLabelValues(p.name).Observe(time.Since(start).Seconds())
	p.m.applied.WithLabelValues(p.name).Add(float64(len(events)))
	if dups > 0 {
		p.m.duplicates.WithLabelValues(p.name).Add(float64(dups))
	}
	if p.cfg.committed != nil && len(events) > 0 {
		p.cfg.committed(pt.topic, pt.id, events)
	}
	return nil
}

// deadLetter sends rec to the DLQ, retrying until the broker has it (acks
// from all in-sync replicas) or the partition stops: the offset must not
// move past a record that is neither applied nor dead-lettered.
func (pt *partition) deadLetter(rec *kgo.Record, code domain.Code, cause error, attempts int) error {
	p := pt.s.p
	if code == "" {
		code = domain.CodeInternal
	}
	f := dlq.Failure{Consumer: p.name, Code: code, Err: cause.Error(), Attempts: attempts}
	backoff := p.cfg.retry.Backoff
	for {
		ctx, cancel := context.WithTimeout(pt.ctx, 30*time.Second)
		err := pt.s.dlq.ProduceSync(ctx, dlq.NewRecord(rec, f)).FirstErr()
		cancel()
		if err == nil {
			break
		}
		if pt.stopping() {
			return errStopping
		}
		p.log.Error("producing to the DLQ failed; retrying", "topic", rec.Topic, "partition", rec.Partition,
			"offset", rec.Offset, "err", err)
		if err := pt.sleep(backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, p.cfg.retry.MaxBackoff)
	}
	pt.dlqSent[rec.Offset] = true
	p.m.dlq.WithLabelValues(p.name, string(code)).Inc()
	// The error text never holds a record's value (decode errors name
	// fields and codes), so it is safe to log.
	p.log.Warn("record sent to the DLQ", "topic", rec.Topic, "partition", rec.Partition,
		"offset", rec.Offset, "code", code, "attempts", attempts, "err", cause)
	return nil
}
