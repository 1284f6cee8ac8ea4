package rebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/internal/applyonce"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/topics"
)

// PlacementBatchSize is the decisions a placement rebuild applies per
// transaction (Config.BatchSize unset).
const PlacementBatchSize = 20000

// PlacementSpec is the placement projection's (postgres.Projection): its
// decision log folded by the projection's own fold (postgres.Builder for
// the first pass, Projection.ApplyDecisions, as the live projector, to
// catch up). Every column of its tables is compared (the rows are read
// off the decisions, offsets and times included).
func PlacementSpec() Spec {
	return Spec{Tables: placementTables, decisions: true}
}

// placementTables are the tables Verify compares, in order; every column
// of each (the projection's rows are read off the decisions, offsets and
// times included).
var placementTables = []Table{
	{Name: "placement_checkpoint"}, {Name: "placement_workers"}, {Name: "placement_orgs"}, {Name: "placement_mailboxes"},
	{Name: "placement_assignment_retention"}, {Name: "placement_assignment_changes"}, {Name: "placement_history"},
	{Name: "placement_liveness"},
}

// decisionFold rebuilds the placement projection: the decision log, one
// partition, folded through postgres.Projection.
type decisionFold struct {
	proj *postgres.Projection
	log  kafka.Partition
}

func newDecisionFold(kcfg kafka.Config) *decisionFold {
	return &decisionFold{proj: postgres.New(kcfg.Namespace), log: kafka.Partition{Topic: kcfg.Topic(topics.PlacementDecisions)}}
}

// build loads the first pass with the keys and indexes of the big tables
// deferred (deferIndexes).
func (f *decisionFold) build(ctx context.Context, r *Rebuild) error {
	deferred, err := deferIndexes(ctx, r.pool, r.schema)
	if err != nil {
		return err
	}
	if err := f.load(ctx, r); err != nil {
		return err
	}
	return restoreIndexes(ctx, r.pool, r.schema, deferred, r.cfg.Logger)
}

// catchUp applies the decisions from the rebuild's offset up to the
// decision log's target.
func (f *decisionFold) catchUp(ctx context.Context, r *Rebuild, targets map[kafka.Partition]int64) error {
	to, ok := targets[f.log]
	if !ok || to == r.next[f.log] {
		return nil
	}
	return f.pass(ctx, r, to)
}

// settle adopts the live retention horizon of assignment changes (pruning
// below it, as postgres.PruneChanges did on the live side), outside the
// live snapshot tx, which would not see it; again says it did.
func (f *decisionFold) settle(ctx context.Context, r *Rebuild, tx pgx.Tx) (again bool, err error) {
	var horizon, rebuilt int64
	err = tx.QueryRow(ctx, `SELECT COALESCE((SELECT retained_from FROM placement_assignment_retention), 0),
    COALESCE((SELECT retained_from FROM `+pgx.Identifier{r.schema, "placement_assignment_retention"}.Sanitize()+`), 0)`).
		Scan(&horizon, &rebuilt)
	if err != nil || horizon == rebuilt {
		return false, err
	}
	_ = tx.Rollback(ctx)
	if _, err := postgres.PruneChanges(ctx, r.pool, horizon); err != nil {
		return false, fmt.Errorf("rebuild: adopt the live retention horizon %d: %w", horizon, err)
	}
	return true, nil
}

// swap moves every placement relation (tables and views) of the live
// schema to the rebuild's schema and the rebuild's in their place, and the
// live projector_offsets row of the placement projection to the rebuild's
// checkpoint. The live placement projector notices at its next batch (its
// checkpoint moved) and resumes from the rebuild's offset; the worker
// API's tokens stay valid (offsets are the log's).
func (f *decisionFold) swap(ctx context.Context, r *Rebuild, tx pgx.Tx) error {
	isPlacement := func(name string) bool { return strings.HasPrefix(name, "placement_") }
	// The checkpoint first: the placement projector's transactions lock
	// it before any other placement table, so taking it first waits for
	// the one in flight and holds the next back, and the two never
	// deadlock. Readers (the worker API, a restoring engine) may still
	// deadlock with the renames; then the swap is retried.
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '30s'; LOCK TABLE `+
		pgx.Identifier{r.live, "placement_checkpoint"}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		return err
	}
	liveRels, err := Relations(ctx, tx, r.live, isPlacement)
	if err != nil {
		return err
	}
	newRels, err := Relations(ctx, tx, r.schema, isPlacement)
	if err != nil {
		return err
	}
	if err := SameRelations(liveRels, newRels, r.live, r.schema); err != nil {
		return err
	}
	if err := MoveRelations(ctx, tx, r.live, r.schema, liveRels); err != nil {
		return err
	}
	// The live position row follows the swapped-in checkpoint (tx's
	// search_path is the live schema).
	ck, err := postgres.ReadCheckpoint(ctx, tx)
	if err != nil {
		return err
	}
	var m applyonce.Moves
	m.Add(f.log.Topic, f.log.Partition, -1, ck.NextOffset)
	if err := applyonce.Set(ctx, tx, postgres.Name, m, time.Now()); err != nil {
		return fmt.Errorf("rebuild: move the placement projector's offset: %w", err)
	}
	return nil
}

// deferredTables are the tables whose keys and indexes a rebuild builds
// after loading rather than row by row: building an index from sorted
// input at the end costs a fraction of maintaining it insert by insert,
// and a duplicate key still fails the rebuild, when the key is added back.
// (The first pass writes every row once, from memory, and reads none
// back; see postgres.Builder.)
var deferredTables = []string{"placement_workers", "placement_orgs", "placement_mailboxes", "placement_history", "placement_assignment_changes"}

// deferredIndex is a primary key or index dropped for the load.
type deferredIndex struct {
	table, name, def string
	constraint       bool // a primary key: def is the constraint's
}

// deferIndexes drops the deferred tables' keys and indexes and returns
// how to build them again, exactly as the migrations made them.
func deferIndexes(ctx context.Context, pool *pgxpool.Pool, schema string) ([]deferredIndex, error) {
	rows, _ := pool.Query(ctx, `
SELECT t.relname, i.relname, COALESCE(pg_get_constraintdef(c.oid), pg_get_indexdef(i.oid)), c.oid IS NOT NULL
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
LEFT JOIN pg_constraint c ON c.conindid = i.oid AND c.contype = 'p'
WHERE n.nspname = $1 AND t.relname = ANY($2)
ORDER BY t.relname, i.relname`, schema, deferredTables)
	var out []deferredIndex
	var d deferredIndex
	if _, err := pgx.ForEachRow(rows, []any{&d.table, &d.name, &d.def, &d.constraint}, func() error { out = append(out, d); return nil }); err != nil {
		return nil, fmt.Errorf("rebuild: indexes to defer: %w", err)
	}
	var stmts []string
	for _, d := range out {
		if d.constraint {
			stmts = append(stmts, "ALTER TABLE "+pgx.Identifier{schema, d.table}.Sanitize()+" DROP CONSTRAINT "+pgx.Identifier{d.name}.Sanitize())
		} else {
			stmts = append(stmts, "DROP INDEX "+pgx.Identifier{schema, d.name}.Sanitize())
		}
	}
	if len(stmts) > 0 {
		if _, err := pool.Exec(ctx, strings.Join(stmts, ";\n")); err != nil {
			return nil, fmt.Errorf("rebuild: defer indexes: %w", err)
		}
	}
	return out, nil
}

// restoreIndexes builds the deferred keys and indexes again.
func restoreIndexes(ctx context.Context, pool *pgxpool.Pool, schema string, ds []deferredIndex, logger *slog.Logger) error {
	var stmts []string
	for _, d := range ds {
		if d.constraint {
			stmts = append(stmts, "ALTER TABLE "+pgx.Identifier{schema, d.table}.Sanitize()+" ADD CONSTRAINT "+pgx.Identifier{d.name}.Sanitize()+" "+d.def)
		} else {
			stmts = append(stmts, d.def)
		}
	}
	if len(stmts) == 0 {
		return nil
	}
	start := time.Now()
	if _, err := pool.Exec(ctx, "SET maintenance_work_mem = '256MB';\n"+strings.Join(stmts, ";\n")+";\nRESET maintenance_work_mem"); err != nil {
		return fmt.Errorf("rebuild: build deferred indexes: %w", err)
	}
	logger.Debug("rebuild: deferred indexes built", "indexes", len(ds), "took", time.Since(start))
	return nil
}

var errStop = errors.New("rebuild: target offset reached")

// load is the first pass, from offset 0 to the log's end, into the empty
// tables: reader goroutines decode (readParallel), this one folds
// (postgres.Builder),
// and a writer goroutine COPYs the append-only rows as they come, then
// the rest, all in one transaction.
func (f *decisionFold) load(ctx context.Context, r *Rebuild) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	chunks := make(chan []postgres.Record, 16)
	var (
		readEnd int64
		readErr error
		readWG  sync.WaitGroup
	)
	readWG.Add(1)
	go func() {
		defer readWG.Done()
		readEnd, readErr = readParallel(ctx, r.cfg.Kafka, 0, chunks)
	}()

	b := postgres.NewBuilder(r.cfg.Kafka.Namespace)
	writes := make(chan postgres.AppendOnly, 4)
	finish := make(chan int64, 1) // the checkpoint, once everything is folded
	writeErr := make(chan error, 1)
	go func() {
		writeErr <- pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
				return err
			}
			for a := range writes {
				if err := a.WriteAppendOnly(ctx, tx); err != nil {
					return err
				}
			}
			r.cfg.Logger.Debug("rebuild: append-only rows written", "took", time.Since(start))
			next, ok := <-finish
			if !ok {
				return errors.New("rebuild: the fold failed")
			}
			err := b.Finish(ctx, tx, next)
			r.cfg.Logger.Debug("rebuild: final rows written", "took", time.Since(start))
			return err
		})
	}()

	var applied, offset atomic.Int64
	stopReport := f.reporter(r, 0, -1, start, &applied, &offset)
	var foldErr error
	pending := 0
	for recs := range chunks {
		if foldErr != nil {
			continue
		}
		if foldErr = b.Add(recs); foldErr != nil {
			cancel()
			continue
		}
		applied.Add(int64(len(recs)))
		offset.Store(recs[len(recs)-1].Offset + 1)
		if pending += len(recs); pending >= r.cfg.BatchSize {
			select {
			case writes <- b.TakeAppendOnly():
			case <-ctx.Done():
			}
			pending = 0
		}
	}
	readWG.Wait()
	r.cfg.Logger.Debug("rebuild: read and folded", "took", time.Since(start))
	if foldErr == nil && readErr != nil {
		foldErr = fmt.Errorf("rebuild: reading the decision log: %w", readErr)
	}
	if foldErr == nil {
		writes <- b.TakeAppendOnly()
		finish <- readEnd
	}
	close(writes)
	close(finish)
	err := <-writeErr
	if foldErr != nil {
		err = foldErr
	} else if err != nil {
		err = fmt.Errorf("rebuild: writing the rebuild: %w", err)
	}
	if err == nil {
		offset.Store(readEnd)
		r.next[f.log] = readEnd
	}
	took := time.Since(start)
	stopReport(err == nil)
	r.records += b.Decisions()
	r.took += took
	if err != nil {
		return err
	}
	r.cfg.Logger.Info("placement decisions applied", "schema", r.schema, "from", 0, "to", r.next[f.log],
		"decisions", b.Decisions(), "took", took)
	return nil
}

// readChunks reads the decision log from from (up to to, when not -1) in
// chunks into chunks, which it closes, and returns the log's end.
func (f *decisionFold) readChunks(ctx context.Context, r *Rebuild, from, to int64, chunks chan<- []postgres.Record) (int64, error) {
	defer close(chunks)
	const chunk = 2048
	buf := make([]postgres.Record, 0, chunk)
	end, err := engine.ReadDecisions(ctx, r.cfg.Kafka, from, func(off int64, d topics.Decision) error {
		if to >= 0 && off >= to {
			return errStop
		}
		buf = append(buf, postgres.Record{Offset: off, Decision: d})
		if len(buf) == chunk {
			select {
			case chunks <- buf:
			case <-ctx.Done():
				return ctx.Err()
			}
			buf = make([]postgres.Record, 0, chunk)
		}
		return nil
	})
	if len(buf) > 0 && (err == nil || errors.Is(err, errStop)) {
		select {
		case chunks <- buf:
		case <-ctx.Done():
		}
	}
	return end, err
}

// pass applies the log from the rebuild's offset up to to (exclusive), or
// to its end when to < 0: a reader goroutine decodes, this one applies,
// batch by batch, through Projection.ApplyDecisions, as the live projector.
func (f *decisionFold) pass(ctx context.Context, r *Rebuild, to int64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	from := r.next[f.log]
	start := time.Now()
	chunks := make(chan []postgres.Record, 8)
	var (
		readEnd int64
		readErr error
		readWG  sync.WaitGroup
	)
	readWG.Add(1)
	go func() {
		defer readWG.Done()
		readEnd, readErr = f.readChunks(ctx, r, from, to, chunks)
	}()

	var applied atomic.Int64
	var offset atomic.Int64
	offset.Store(from)
	stopReport := f.reporter(r, from, to, start, &applied, &offset)

	batch := make([]postgres.Record, 0, r.cfg.BatchSize)
	var applyErr error
	apply := func(next int64) {
		if applyErr != nil {
			return
		}
		err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
				return err
			}
			return f.proj.ApplyDecisions(ctx, tx, batch, next)
		})
		if err != nil {
			applyErr = fmt.Errorf("rebuild: applying decisions up to offset %d: %w", next, err)
			cancel()
			return
		}
		applied.Add(int64(len(batch)))
		offset.Store(next)
		r.next[f.log] = next
		batch = batch[:0]
	}
	for recs := range chunks {
		for _, rec := range recs {
			batch = append(batch, rec)
			if len(batch) == r.cfg.BatchSize {
				apply(rec.Offset + 1)
			}
		}
	}
	readWG.Wait()
	switch {
	case applyErr != nil:
	case readErr != nil && !errors.Is(readErr, errStop):
		applyErr = fmt.Errorf("rebuild: reading the decision log: %w", readErr)
	default:
		end := readEnd
		if to >= 0 {
			end = to
		}
		if len(batch) > 0 || end != r.next[f.log] {
			apply(end)
		}
	}
	took := time.Since(start)
	stopReport(applyErr == nil)
	r.records += applied.Load()
	r.took += took
	if applyErr != nil {
		return applyErr
	}
	r.cfg.Logger.Info("placement decisions applied", "schema", r.schema, "from", from, "to", r.next[f.log],
		"decisions", applied.Load(), "took", took)
	return nil
}

// logEnd reads the decision log's last stable offset (where a
// read_committed reader, ReadDecisions, stops).
func logEnd(kcfg kafka.Config) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm, err := kafka.NewAdmin(kcfg)
	if err != nil {
		return 0, err
	}
	defer adm.Close()
	log := kcfg.Topic(topics.PlacementDecisions)
	ends, err := adm.ListCommittedOffsets(ctx, log)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, err
	}
	o, ok := ends.Lookup(log, 0)
	if !ok {
		return 0, fmt.Errorf("rebuild: topic %s has no partition 0", log)
	}
	return o.Offset, nil
}

// reporter reports a pass from offset from to to (-1: the log's end, as
// the pass will find it) through r.reporter.
func (f *decisionFold) reporter(r *Rebuild, from, to int64, start time.Time, applied, offset *atomic.Int64) (stop func(ok bool)) {
	if r.cfg.Progress == nil {
		return func(bool) {}
	}
	target := to
	if target < 0 {
		// Until known, the offset reached.
		if end, err := logEnd(r.cfg.Kafka); err == nil {
			target = end
		}
	}
	return r.reporter(func() Progress {
		off := offset.Load()
		return Progress{Records: applied.Load(), Done: off - from, Total: max(target, off) - from, Elapsed: time.Since(start)}
	})
}
