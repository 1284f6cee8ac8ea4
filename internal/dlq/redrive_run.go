package dlq

// A redrive's run: the lock, the reads of the DLQ and the source
// partitions, the records in dlq_redrives, the produce (see redrive.go).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/topics"
)

type redrive struct {
	cfg  kafka.Config
	pool *pgxpool.Pool
	// db is the connection holding the lock: every statement of the
	// redrive runs on it, so a pool of one connection does not deadlock.
	db     querier
	caller *domain.Caller
	sel    Selection
	c      redriveConfig
	report Report
}

// Location is where a dead letter is in the DLQ topic.
type Location struct {
	Partition int32
	Offset    int64
}

func (e Entry) location() Location { return Location{e.Partition, e.Offset} }

// The lock redrives take turns on: a fixed class and the schema's hash, as
// migrations do, so that tests in their own schemas do not wait for each
// other.
const (
	redriveLockClass int32 = 0x646c7172 // "dlqr"
	redriveLockSQL         = `SELECT pg_advisory_lock($1, hashtext(current_schema()))`
	redriveUnlockSQL       = `SELECT pg_advisory_unlock($1, hashtext(current_schema()))`
)

func (r *redrive) run(ctx context.Context) (Report, error) {
	r.report.DryRun = r.sel.DryRun
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("dlq redrive: %w", err)
	}
	if _, err := conn.Exec(ctx, redriveLockSQL, redriveLockClass); err != nil {
		conn.Release()
		return Report{}, fmt.Errorf("dlq redrive: wait for other redrives: %w", err)
	}
	r.db = conn
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, redriveUnlockSQL, redriveLockClass); err != nil {
			// Closing the connection releases the lock for sure.
			_ = conn.Conn().Close(uctx)
		}
		conn.Release()
	}()

	pending, err := pendingRows(ctx, r.db)
	if err != nil {
		return Report{}, err
	}
	entries, err := r.read(ctx, pending)
	if err != nil {
		return Report{}, err
	}
	if !r.sel.DryRun && len(pending) > 0 {
		if err := r.complete(ctx, pending, entries); err != nil {
			return r.report, err
		}
	}
	var picked []Entry
	for _, e := range entries {
		if r.sel.matches(e) {
			picked = append(picked, e)
		}
	}
	done, err := redrives(ctx, r.db, picked)
	if err != nil {
		return Report{}, err
	}
	var todo []Entry
	for _, e := range picked {
		if why := refusal(r.cfg.Namespace, e); why != nil {
			r.report.Items = append(r.report.Items, Item{Entry: e, Outcome: OutcomeRefused, Code: why.Code, Reason: why.Message, Offset: -1})
			if !r.sel.DryRun && r.c.metrics != nil {
				r.c.metrics.refused.WithLabelValues(e.Consumer, codeLabel(why.Code)).Inc()
			}
			continue
		}
		if prev, ok := done[e.location()]; ok && !r.sel.Again {
			how := "redriven"
			if !prev.Done {
				how = "recorded pending (the next redrive completes it)"
			}
			r.report.Items = append(r.report.Items, Item{Entry: e, Outcome: OutcomeSkipped, Code: domain.CodeAlreadyRedriven,
				Reason: fmt.Sprintf("%s by %s at %s (redrive %s); redrive it again with --again", how, prev.Actor,
					prev.RequestedAt.UTC().Format(time.RFC3339), prev.RedriveID), RedriveID: prev.RedriveID, Offset: prev.Offset})
			continue
		}
		todo = append(todo, e)
	}
	if !r.sel.OutOfOrder && len(todo) > 0 {
		if todo, err = r.keepInOrder(ctx, todo); err != nil {
			return Report{}, err
		}
	}
	if r.sel.DryRun {
		for _, e := range todo {
			r.report.Items = append(r.report.Items, Item{Entry: e, Outcome: OutcomeWouldRedrive, Offset: -1})
		}
		return r.report, nil
	}
	if len(todo) == 0 {
		return r.report, nil
	}
	r.report.RedriveID = domain.NewEventID() // a UUIDv7
	return r.report, r.redrive(ctx, todo)
}

// read reads the DLQ from the first dead letter the selection or a pending
// row may need, up to its end.
func (r *redrive) read(ctx context.Context, pending []pendingRow) ([]Entry, error) {
	from := int64(-1)
	if r.sel.FromOffset != nil {
		from = *r.sel.FromOffset
	}
	for _, p := range pending {
		if from < 0 || p.loc.Offset < from {
			from = p.loc.Offset
		}
	}
	spec := kafka.ReadSpec{
		Topics:   []string{r.cfg.Topic(topics.DLQ)},
		ClientID: "dlq-redrive",
		From: func(_ kafka.Partition, b kafka.Bounds) (int64, error) {
			return max(b.Start, from), nil
		},
	}
	var out []Entry
	if _, err := kafka.ReadToEnd(ctx, r.cfg, spec, func(rec *kgo.Record) error {
		out = append(out, Parse(rec))
		return nil
	}); err != nil {
		return nil, fmt.Errorf("dlq redrive: read the DLQ: %w", err)
	}
	return out, nil
}

// keepInOrder returns the entries of es whose key has no later record in
// its source partition that their consumer applies, and reports the others
// refused (out_of_order): a redriven record is applied at its new place in
// the log, after those, and would undo them (a removal redriven after the
// mailbox was added again removes it). It reads each source partition from
// its first such entry to its end.
func (r *redrive) keepInOrder(ctx context.Context, es []Entry) ([]Entry, error) {
	from := map[kafka.Partition]int64{}
	var tps []string
	for _, e := range es {
		k := kafka.Partition{Topic: e.SourceTopic, Partition: e.SourcePartition}
		if f, ok := from[k]; !ok || e.SourceOffset+1 < f {
			from[k] = e.SourceOffset + 1
		}
		if !slices.Contains(tps, e.SourceTopic) {
			tps = append(tps, e.SourceTopic)
		}
	}
	type later struct {
		n     int
		first int64
	}
	found := make([]later, len(es))
	spec := kafka.ReadSpec{
		Topics:     tps,
		ClientID:   "dlq-redrive-order",
		Partitions: partitionsOf(from),
		From: func(p kafka.Partition, b kafka.Bounds) (int64, error) {
			return max(b.Start, from[p]), nil
		},
	}
	if _, err := kafka.ReadToEnd(ctx, r.cfg, spec, func(rec *kgo.Record) error {
		copyOf, isCopy := redriveKey(rec)
		for i, e := range es {
			if rec.Offset <= e.SourceOffset || rec.Partition != e.SourcePartition || rec.Topic != e.SourceTopic ||
				!bytes.Equal(rec.Key, e.Key) || ForOtherConsumer(rec, e.Consumer) || isCopy && copyOf.loc == e.location() {
				continue
			}
			if found[i].n == 0 {
				found[i].first = rec.Offset
			}
			found[i].n++
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("dlq redrive: read the source partitions after the dead letters: %w", err)
	}
	var keep []Entry
	for i, e := range es {
		if found[i].n == 0 {
			keep = append(keep, e)
			continue
		}
		r.report.Items = append(r.report.Items, Item{Entry: e, Outcome: OutcomeRefused, Code: domain.CodeOutOfOrder, Offset: -1,
			Reason: fmt.Sprintf("%d later records of its key follow it in %s[%d] (the first at offset %d): redriven, it would be applied "+
				"after them; check them, and redrive with --out-of-order if it must still apply", found[i].n, e.SourceTopic, e.SourcePartition, found[i].first)})
		if !r.sel.DryRun && r.c.metrics != nil {
			r.c.metrics.refused.WithLabelValues(e.Consumer, codeLabel(domain.CodeOutOfOrder)).Inc()
		}
	}
	return keep, nil
}

// partitionsOf picks, for ReadSpec.Partitions, the partitions of from.
func partitionsOf(from map[kafka.Partition]int64) func(topic string, n int) []int32 {
	return func(topic string, n int) []int32 {
		var ps []int32
		for k := range from {
			if k.Topic == topic && int(k.Partition) < n {
				ps = append(ps, k.Partition)
			}
		}
		slices.Sort(ps)
		return ps
	}
}

// redrive records todo pending, produces it, and records it done.
func (r *redrive) redrive(ctx context.Context, todo []Entry) error {
	ends, err := r.sourceEnds(ctx, todo)
	if err != nil {
		return err
	}
	var keep []Entry
	for _, e := range todo {
		if _, ok := ends[topicPartition{e.SourceTopic, e.SourcePartition}]; !ok {
			r.report.Items = append(r.report.Items, Item{Entry: e, Outcome: OutcomeRefused, Code: domain.CodeNotRedrivable,
				Reason: fmt.Sprintf("the broker has no partition %s/%d", e.SourceTopic, e.SourcePartition), Offset: -1})
			continue
		}
		keep = append(keep, e)
	}
	if len(keep) == 0 {
		return nil
	}
	now := r.c.now().UTC()
	batch := &pgx.Batch{}
	for _, e := range keep {
		batch.Queue(insertRedriveSQL, e.Partition, e.Offset, r.report.RedriveID, e.Consumer, string(e.ErrorCode),
			e.SourceTopic, e.SourcePartition, e.SourceOffset, r.caller.Name, r.caller.Source, r.sel.Again,
			ends[topicPartition{e.SourceTopic, e.SourcePartition}], now)
	}
	if err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error { return tx.SendBatch(ctx, batch).Close() }); err != nil {
		return fmt.Errorf("dlq redrive: record the redrive: %w", err)
	}
	recs := make([]*kgo.Record, len(keep))
	for i, e := range keep {
		recs[i] = RedriveRecord(e, r.report.RedriveID)
	}
	offsets, perr := r.produce(ctx, recs)
	landed := make([]Location, 0, len(keep))
	var landedAt []int64
	for i, e := range keep {
		it := Item{Entry: e, Outcome: OutcomePending, RedriveID: r.report.RedriveID, Offset: -1}
		if off, ok := offsets[i]; ok {
			it.Outcome, it.Offset = OutcomeRedriven, off
			landed, landedAt = append(landed, e.location()), append(landedAt, off)
		} else {
			it.Code, it.Reason = domain.CodeUnavailable, "recorded but not produced; the next redrive completes it"
		}
		r.report.Items = append(r.report.Items, it)
	}
	if err := markDone(ctx, r.db, r.report.RedriveID, landed, landedAt, r.c.now().UTC()); err != nil {
		return err
	}
	for _, it := range r.report.Items {
		if it.Outcome == OutcomeRedriven {
			r.count(it.Entry)
			r.c.log.Info("dead letter redriven", "consumer", it.Entry.Consumer, "dlq_partition", it.Entry.Partition,
				"dlq_offset", it.Entry.Offset, "topic", it.Entry.SourceTopic, "partition", it.Entry.SourcePartition,
				"offset", it.Offset, "redrive_id", it.RedriveID, "actor", r.caller.Name)
		}
	}
	if perr != nil {
		return fmt.Errorf("dlq redrive: %d of %d records not produced (recorded pending; run the redrive again to complete them): %w",
			len(keep)-len(landed), len(keep), perr)
	}
	return nil
}

func (r *redrive) count(e Entry) {
	if r.c.metrics != nil {
		r.c.metrics.redriven.WithLabelValues(e.Consumer, codeLabel(e.ErrorCode)).Inc()
	}
}

type topicPartition struct {
	topic     string
	partition int32
}

// sourceEnds lists the end offsets of the source partitions of es; a
// partition the broker lacks is absent.
func (r *redrive) sourceEnds(ctx context.Context, es []Entry) (map[topicPartition]int64, error) {
	var tps []string
	for _, e := range es {
		if !slices.Contains(tps, e.SourceTopic) {
			tps = append(tps, e.SourceTopic)
		}
	}
	adm, err := kafka.NewAdmin(r.cfg.WithClientID(clientIDOf(r.cfg) + "-dlq-redrive"))
	if err != nil {
		return nil, err
	}
	defer adm.Close()
	lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(lctx, tps...)
	if err != nil {
		return nil, fmt.Errorf("dlq redrive: list the source partitions' ends: %w", err)
	}
	out := map[topicPartition]int64{}
	for _, e := range es {
		if o, ok := ends.Lookup(e.SourceTopic, e.SourcePartition); ok && o.Err == nil {
			out[topicPartition{e.SourceTopic, e.SourcePartition}] = o.Offset
		}
	}
	return out, nil
}

func clientIDOf(cfg kafka.Config) string {
	if cfg.ClientID != "" {
		return cfg.ClientID
	}
	return "mailplane"
}

// produce appends recs, each to the partition it names, and returns the
// offsets of those that landed, by index.
func (r *redrive) produce(ctx context.Context, recs []*kgo.Record) (map[int]int64, error) {
	cl, err := kafka.NewProducer(r.cfg, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	index := make(map[*kgo.Record]int, len(recs))
	for i, rec := range recs {
		index[rec] = i
	}
	out := map[int]int64{}
	var errs []error
	for _, res := range cl.ProduceSync(pctx, recs...) {
		if res.Err != nil {
			errs = append(errs, res.Err)
			continue
		}
		out[index[res.Record]] = res.Record.Offset
	}
	return out, errors.Join(errs...)
}

// complete finishes the rows an earlier redrive left pending: a record
// found in its source partition (by redrive id and dead letter) is marked
// done where it landed; one not found is produced again under its redrive
// id, then marked done.
func (r *redrive) complete(ctx context.Context, pending []pendingRow, entries []Entry) error {
	byLoc := make(map[Location]Entry, len(entries))
	for _, e := range entries {
		byLoc[e.location()] = e
	}
	found, err := r.findRedriven(ctx, pending)
	if err != nil {
		return err
	}
	byID := map[string][]int{}
	for i, p := range pending {
		byID[p.redriveID] = append(byID[p.redriveID], i)
	}
	for id, idx := range byID {
		var (
			landed   []Location
			landedAt []int64
			recs     []*kgo.Record
			recIdx   []int
		)
		for _, i := range idx {
			p := pending[i]
			if off, ok := found[pendingKey{p.redriveID, p.loc}]; ok {
				landed, landedAt = append(landed, p.loc), append(landedAt, off)
				continue
			}
			e, ok := byLoc[p.loc]
			if !ok {
				return fmt.Errorf("dlq redrive: pending dead letter %d/%d of redrive %s is gone from the DLQ; "+
					"it was never appended: delete its dlq_redrives row to redrive it anew", p.loc.Partition, p.loc.Offset, id)
			}
			recs, recIdx = append(recs, RedriveRecord(e, id)), append(recIdx, i)
		}
		var (
			offsets map[int]int64
			perr    error
		)
		if len(recs) > 0 {
			offsets, perr = r.produce(ctx, recs)
		}
		for j, i := range recIdx {
			if off, ok := offsets[j]; ok {
				landed, landedAt = append(landed, pending[i].loc), append(landedAt, off)
			}
		}
		if err := markDone(ctx, r.db, id, landed, landedAt, r.c.now().UTC()); err != nil {
			return err
		}
		for k, loc := range landed {
			e := byLoc[loc]
			if e.Consumer == "" {
				e = Entry{Partition: loc.Partition, Offset: loc.Offset}
			}
			r.report.Items = append(r.report.Items, Item{Entry: e, Outcome: OutcomeCompleted, RedriveID: id, Offset: landedAt[k]})
		}
		for j, i := range recIdx {
			if _, ok := offsets[j]; ok {
				r.count(byLoc[pending[i].loc])
			}
		}
		if perr != nil {
			return fmt.Errorf("dlq redrive: completing redrive %s: %w", id, perr)
		}
	}
	return nil
}

type pendingKey struct {
	redriveID string
	loc       Location
}

// findRedriven looks for the records of pending rows in their source
// partitions, from where each partition ended before its produce, up to
// the high watermark (waiting for transactions open on it: none of ours,
// redrives do not produce transactionally, but another writer's may be).
func (r *redrive) findRedriven(ctx context.Context, pending []pendingRow) (map[pendingKey]int64, error) {
	from := map[kafka.Partition]int64{}
	var tps []string
	for _, p := range pending {
		k := kafka.Partition{Topic: p.sourceTopic, Partition: p.sourcePartition}
		if f, ok := from[k]; !ok || p.scanFrom < f {
			from[k] = p.scanFrom
		}
		if !slices.Contains(tps, p.sourceTopic) {
			tps = append(tps, p.sourceTopic)
		}
	}
	want := map[pendingKey]bool{}
	for _, p := range pending {
		want[pendingKey{p.redriveID, p.loc}] = true
	}
	spec := kafka.ReadSpec{
		Topics:        tps,
		ClientID:      "dlq-redrive-find",
		HighWatermark: true,
		Partitions:    partitionsOf(from),
		From: func(p kafka.Partition, b kafka.Bounds) (int64, error) {
			return max(b.Start, from[p]), nil
		},
	}
	found := map[pendingKey]int64{}
	if _, err := kafka.ReadToEnd(ctx, r.cfg, spec, func(rec *kgo.Record) error {
		k, ok := redriveKey(rec)
		if ok && want[k] {
			if _, dup := found[k]; !dup {
				found[k] = rec.Offset
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("dlq redrive: look for pending records: %w", err)
	}
	return found, nil
}

// redriveKey reads the redrive id and dead letter of a redriven record.
func redriveKey(rec *kgo.Record) (pendingKey, bool) {
	var (
		k            pendingKey
		haveP, haveO bool
	)
	for _, h := range rec.Headers {
		switch h.Key {
		case HeaderRedriveID:
			k.redriveID = string(h.Value)
		case HeaderRedriveDLQPartition:
			p, err := strconv.ParseInt(string(h.Value), 10, 32)
			k.loc.Partition, haveP = int32(p), err == nil
		case HeaderRedriveDLQOffset:
			o, err := strconv.ParseInt(string(h.Value), 10, 64)
			k.loc.Offset, haveO = o, err == nil
		}
	}
	return k, k.redriveID != "" && haveP && haveO
}

const (
	insertRedriveSQL = `INSERT INTO dlq_redrives (dlq_partition, dlq_offset, redrive_id, consumer, error_code,
    source_topic, source_partition, source_offset, actor, actor_source, again, state, scan_from, requested_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'pending', $12, $13)`

	markDoneSQL = `UPDATE dlq_redrives AS r SET state = 'done', redriven_offset = u.off, done_at = $5
FROM unnest($2::int4[], $3::int8[], $4::int8[]) AS u(part, dlq_off, off)
WHERE r.redrive_id = $1 AND r.dlq_partition = u.part AND r.dlq_offset = u.dlq_off AND r.state = 'pending'`

	pendingSQL = `SELECT dlq_partition, dlq_offset, redrive_id::text, source_topic, source_partition, scan_from
FROM dlq_redrives WHERE state = 'pending' ORDER BY requested_at, dlq_partition, dlq_offset`

	redrivesSQL = `SELECT DISTINCT ON (dlq_partition, dlq_offset) dlq_partition, dlq_offset, redrive_id::text, actor, actor_source,
    state, coalesce(redriven_offset, -1), requested_at
FROM dlq_redrives
WHERE (dlq_partition, dlq_offset) IN (SELECT * FROM unnest($1::int4[], $2::int8[]))
ORDER BY dlq_partition, dlq_offset, requested_at DESC`
)

func markDone(ctx context.Context, db querier, id string, locs []Location, at []int64, now time.Time) error {
	if len(locs) == 0 {
		return nil
	}
	parts, offs := make([]int32, len(locs)), make([]int64, len(locs))
	for i, l := range locs {
		parts[i], offs[i] = l.Partition, l.Offset
	}
	if _, err := db.Exec(ctx, markDoneSQL, id, parts, offs, at, now); err != nil {
		return fmt.Errorf("dlq redrive: record the redrive done (the next redrive completes it): %w", err)
	}
	return nil
}

type pendingRow struct {
	loc             Location
	redriveID       string
	sourceTopic     string
	sourcePartition int32
	scanFrom        int64
}

func pendingRows(ctx context.Context, db querier) ([]pendingRow, error) {
	rows, err := db.Query(ctx, pendingSQL)
	if err != nil {
		return nil, fmt.Errorf("dlq redrive: read pending redrives: %w", err)
	}
	var (
		out []pendingRow
		p   pendingRow
	)
	if _, err := pgx.ForEachRow(rows, []any{&p.loc.Partition, &p.loc.Offset, &p.redriveID, &p.sourceTopic, &p.sourcePartition, &p.scanFrom}, func() error {
		out = append(out, p)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("dlq redrive: read pending redrives: %w", err)
	}
	return out, nil
}

// Redriven is the latest redrive of a dead letter.
type Redriven struct {
	RedriveID   string
	Actor       string
	ActorSource string
	// Done: the record was appended at Offset of its source partition;
	// else it is pending (-1), completed by the next redrive.
	Done        bool
	Offset      int64
	RequestedAt time.Time
}

// Redrives returns the latest redrive of each of entries that was
// redriven, by location.
func Redrives(ctx context.Context, pool *pgxpool.Pool, entries []Entry) (map[Location]Redriven, error) {
	return redrives(ctx, pool, entries)
}

// querier is a pool or one of its connections.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

func redrives(ctx context.Context, db querier, entries []Entry) (map[Location]Redriven, error) {
	out := map[Location]Redriven{}
	if len(entries) == 0 {
		return out, nil
	}
	parts, offs := make([]int32, len(entries)), make([]int64, len(entries))
	for i, e := range entries {
		parts[i], offs[i] = e.Partition, e.Offset
	}
	rows, err := db.Query(ctx, redrivesSQL, parts, offs)
	if err != nil {
		return nil, fmt.Errorf("dlq: read redrives: %w", err)
	}
	var (
		loc   Location
		r     Redriven
		state string
	)
	if _, err := pgx.ForEachRow(rows, []any{&loc.Partition, &loc.Offset, &r.RedriveID, &r.Actor, &r.ActorSource, &state, &r.Offset, &r.RequestedAt}, func() error {
		r.Done = state == "done"
		out[loc] = r
		return nil
	}); err != nil {
		return nil, fmt.Errorf("dlq: read redrives: %w", err)
	}
	return out, nil
}
