// Package replay rebuilds a projection from the log into a fresh schema,
// verifies it row for row against the live schema, and swaps it in
// (docs/architecture.md §5). A rebuild of the same log yields identical rows
// (invariant 2), so a rebuild that differs from the live projection says
// the live one drifted (or the code changed), and swapping the rebuild in
// repairs it.
//
// The placement projection (postgres.Projection) is the one rebuilt
// here: `mailplane replay placement`. Its fold of the decision log is its
// own; the fresh schema and its marker, the row comparison and the move of
// tables between schemas are internal/rebuild's, shared with the registry
// and health rebuilds.
package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/internal/rebuild"
	"github.com/mailplane/mailplane/topics"
)

// Config configures a placement rebuild.
type Config struct {
	// Kafka reaches the decision log.
	Kafka kafka.Config
	// Live is a pool on the live schema (its connections' search_path
	// selects it): where the rebuild's schema is created, what Verify
	// compares with and where Swap swaps.
	Live *pgxpool.Pool
	// Schema names the fresh schema (rebuild.CheckName: <prefix>_placement_<digits>,
	// not existing yet). Default: "<live>_placement_<unix seconds>".
	Schema string
	// BatchSize is how many decisions one transaction applies. Default
	// DefaultBatchSize.
	BatchSize int
	// Progress, when set, is called about every ProgressEvery while
	// decisions are applied, and once more when a pass is done.
	Progress      func(Progress)
	ProgressEvery time.Duration
	// Logger logs the steps. Default: discard.
	Logger *slog.Logger
}

// DefaultBatchSize is the decisions a rebuild applies per transaction.
const DefaultBatchSize = 20000

// Progress reports a pass over the decision log.
type Progress struct {
	// Decisions applied so far, in this pass.
	Decisions int64
	// Offset is the next decision-log offset to apply; From and To bound
	// the pass (To is the log's end when the pass began, or the offset
	// caught up to).
	Offset, From, To int64
	// Elapsed is the pass's time so far.
	Elapsed time.Duration
	// Done is set on the last report of a pass.
	Done bool
}

// Rate is the decisions applied per second so far.
func (p Progress) Rate() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Decisions) / p.Elapsed.Seconds()
}

// Fraction is the share of the pass's offsets done, in [0, 1].
func (p Progress) Fraction() float64 {
	if p.To <= p.From {
		return 1
	}
	return min(1, max(0, float64(p.Offset-p.From)/float64(p.To-p.From)))
}

// Placement is a rebuild of the placement projection in its own schema.
type Placement struct {
	cfg    Config
	live   string
	schema string
	pool   *pgxpool.Pool // search_path = schema
	proj   *postgres.Projection

	release   func() // the rebuild's hold on its schema (rebuild.Hold)
	next      int64  // the rebuild's checkpoint
	decisions int64  // decisions applied, all passes
	took      time.Duration
	swapped   bool
}

// RebuildPlacement creates the fresh schema, migrates it, and applies the
// decision log from offset 0 to its end as of the call.
func RebuildPlacement(ctx context.Context, cfg Config) (*Placement, error) {
	if cfg.Live == nil || len(cfg.Kafka.Brokers) == 0 {
		return nil, errors.New("replay: a live pool and brokers are required")
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 200 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Kafka.ClientID == "" {
		cfg.Kafka.ClientID = "mailplane-replay"
	}
	live, err := rebuild.LiveSchema(ctx, cfg.Live)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if cfg.Schema == "" {
		cfg.Schema = rebuild.DefaultName(live, rebuild.Placement, time.Now())
	}
	p := &Placement{cfg: cfg, live: live, schema: cfg.Schema, proj: postgres.New(cfg.Kafka.Namespace)}
	if err := rebuild.Create(ctx, cfg.Live, rebuild.Placement, live, p.schema); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if err := p.rebuild(ctx); err != nil {
		// Leave nothing half-built behind.
		p.Close()
		if derr := rebuild.DropSchema(ctx, cfg.Live, p.schema); derr != nil {
			cfg.Logger.Warn("could not drop the failed rebuild's schema", "schema", p.schema, "err", derr)
		}
		return nil, err
	}
	return p, nil
}

func (p *Placement) rebuild(ctx context.Context) error {
	release, err := rebuild.Hold(ctx, p.cfg.Live, p.schema)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	p.release = release
	pool, err := rebuild.Pool(ctx, p.cfg.Live, p.schema)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	p.pool = pool
	if err := migrations.Apply(ctx, pool); err != nil {
		return fmt.Errorf("replay: migrate %s: %w", p.schema, err)
	}
	p.cfg.Logger.Info("rebuilding the placement projection", "schema", p.schema, "live", p.live)
	deferred, err := deferIndexes(ctx, pool, p.schema)
	if err != nil {
		return err
	}
	if err := p.build(ctx); err != nil {
		return err
	}
	if err := restoreIndexes(ctx, pool, p.schema, deferred, p.cfg.Logger); err != nil {
		return err
	}
	return rebuild.SetState(ctx, pool, p.schema, rebuild.StateBuilt)
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
		return nil, fmt.Errorf("replay: indexes to defer: %w", err)
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
			return nil, fmt.Errorf("replay: defer indexes: %w", err)
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
		return fmt.Errorf("replay: build deferred indexes: %w", err)
	}
	logger.Debug("replay: deferred indexes built", "indexes", len(ds), "took", time.Since(start))
	return nil
}

// Schema is the rebuild's schema (after Swap, the previous live
// projection's).
func (p *Placement) Schema() string { return p.schema }

// LiveSchema is the live schema.
func (p *Placement) LiveSchema() string { return p.live }

// NextOffset is the decision-log offset the rebuild stands at.
func (p *Placement) NextOffset() int64 { return p.next }

// Decisions is how many decisions the rebuild applied.
func (p *Placement) Decisions() int64 { return p.decisions }

// Took is the time spent applying decisions.
func (p *Placement) Took() time.Duration { return p.took }

// Pool is a pool on the rebuild's schema (closed by Close).
func (p *Placement) Pool() *pgxpool.Pool { return p.pool }

// Close closes the pool on the rebuild's schema and lets replay cleanup
// drop it; the schema stays.
func (p *Placement) Close() {
	if p.pool != nil {
		p.pool.Close()
	}
	if p.release != nil {
		p.release()
		p.release = nil
	}
}

// Drop drops the rebuild's schema (after Swap: the previous projection).
func (p *Placement) Drop(ctx context.Context) error {
	p.Close()
	_, err := p.cfg.Live.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{p.schema}.Sanitize()+` CASCADE`)
	return err
}

// CatchUp applies the decisions from the rebuild's offset up to offset to
// (exclusive), so that the rebuild stands exactly there.
func (p *Placement) CatchUp(ctx context.Context, to int64) error {
	if p.swapped {
		return errors.New("replay: the rebuild was swapped in")
	}
	if to < p.next {
		return fmt.Errorf("replay: cannot catch up backwards from %d to %d", p.next, to)
	}
	if to == p.next {
		return nil
	}
	return p.pass(ctx, to)
}

var errStop = errors.New("replay: target offset reached")

// build is the first pass, from offset 0 to the log's end, into the empty
// tables: reader goroutines decode (readParallel), this one folds
// (PlacementBuilder),
// and a writer goroutine COPYs the append-only rows as they come, then
// the rest, all in one transaction.
func (p *Placement) build(ctx context.Context) error {
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
		readEnd, readErr = readParallel(ctx, p.cfg.Kafka, 0, chunks)
	}()

	b := postgres.NewBuilder(p.cfg.Kafka.Namespace)
	writes := make(chan postgres.AppendOnly, 4)
	finish := make(chan int64, 1) // the checkpoint, once everything is folded
	writeErr := make(chan error, 1)
	go func() {
		writeErr <- pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
				return err
			}
			for a := range writes {
				if err := a.WriteAppendOnly(ctx, tx); err != nil {
					return err
				}
			}
			p.cfg.Logger.Debug("replay: append-only rows written", "took", time.Since(start))
			next, ok := <-finish
			if !ok {
				return errors.New("replay: the fold failed")
			}
			err := b.Finish(ctx, tx, next)
			p.cfg.Logger.Debug("replay: final rows written", "took", time.Since(start))
			return err
		})
	}()

	var applied, offset atomic.Int64
	stopReport := p.reporter(0, -1, start, &applied, &offset)
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
		if pending += len(recs); pending >= p.cfg.BatchSize {
			select {
			case writes <- b.TakeAppendOnly():
			case <-ctx.Done():
			}
			pending = 0
		}
	}
	readWG.Wait()
	p.cfg.Logger.Debug("replay: read and folded", "took", time.Since(start))
	if foldErr == nil && readErr != nil {
		foldErr = fmt.Errorf("replay: reading the decision log: %w", readErr)
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
		err = fmt.Errorf("replay: writing the rebuild: %w", err)
	}
	if err == nil {
		offset.Store(readEnd)
		p.next = readEnd
	}
	took := time.Since(start)
	stopReport(err == nil)
	p.decisions += b.Decisions()
	p.took += took
	if err != nil {
		return err
	}
	p.cfg.Logger.Info("placement decisions applied", "schema", p.schema, "from", 0, "to", p.next,
		"decisions", b.Decisions(), "took", took)
	return nil
}

// pass applies the log from p.next up to to (exclusive), or to its end when
// to < 0: a reader goroutine decodes, this one applies, batch by batch.
// readChunks reads the decision log from from (up to to, when not -1) in
// chunks into chunks, which it closes, and returns the log's end.
func (p *Placement) readChunks(ctx context.Context, from, to int64, chunks chan<- []postgres.Record) (int64, error) {
	defer close(chunks)
	const chunk = 2048
	buf := make([]postgres.Record, 0, chunk)
	end, err := engine.ReadDecisions(ctx, p.cfg.Kafka, from, func(off int64, d topics.Decision) error {
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

func (p *Placement) pass(ctx context.Context, to int64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	from := p.next
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
		readEnd, readErr = p.readChunks(ctx, from, to, chunks)
	}()

	var applied atomic.Int64
	var offset atomic.Int64
	offset.Store(from)
	stopReport := p.reporter(from, to, start, &applied, &offset)

	batch := make([]postgres.Record, 0, p.cfg.BatchSize)
	var applyErr error
	apply := func(next int64) {
		if applyErr != nil {
			return
		}
		err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
				return err
			}
			return p.proj.ApplyDecisions(ctx, tx, batch, next)
		})
		if err != nil {
			applyErr = fmt.Errorf("replay: applying decisions up to offset %d: %w", next, err)
			cancel()
			return
		}
		applied.Add(int64(len(batch)))
		offset.Store(next)
		p.next = next
		batch = batch[:0]
	}
	for recs := range chunks {
		for _, r := range recs {
			batch = append(batch, r)
			if len(batch) == p.cfg.BatchSize {
				apply(r.Offset + 1)
			}
		}
	}
	readWG.Wait()
	switch {
	case applyErr != nil:
	case readErr != nil && !errors.Is(readErr, errStop):
		applyErr = fmt.Errorf("replay: reading the decision log: %w", readErr)
	default:
		end := readEnd
		if to >= 0 {
			end = to
		}
		if len(batch) > 0 || end != p.next {
			apply(end)
		}
	}
	took := time.Since(start)
	stopReport(applyErr == nil)
	p.decisions += applied.Load()
	p.took += took
	if applyErr != nil {
		return applyErr
	}
	p.cfg.Logger.Info("placement decisions applied", "schema", p.schema, "from", from, "to", p.next,
		"decisions", applied.Load(), "took", took)
	return nil
}

// reporter calls cfg.Progress every ProgressEvery until the returned stop,
// which reports once more (Done when the pass succeeded).
func (p *Placement) reporter(from, to int64, start time.Time, applied, offset *atomic.Int64) (stop func(done bool)) {
	if p.cfg.Progress == nil {
		return func(bool) {}
	}
	target := to
	if target < 0 {
		// The log's end, as the pass will find it; until known, the
		// offset reached.
		if end, err := logEnd(p.cfg.Kafka); err == nil {
			target = end
		}
	}
	report := func(done bool) {
		off := offset.Load()
		p.cfg.Progress(Progress{Decisions: applied.Load(), Offset: off, From: from, To: max(target, off), Elapsed: time.Since(start), Done: done})
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(p.cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				report(false)
			}
		}
	}()
	return func(done bool) {
		close(quit)
		wg.Wait()
		report(done)
	}
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
		return 0, fmt.Errorf("replay: topic %s has no partition 0", log)
	}
	return o.Offset, nil
}

// placementTables are the tables Verify compares, in order; every column
// of each (the projection's rows are read off the decisions, offsets and
// times included).
var placementTables = []rebuild.Table{
	{Name: "placement_checkpoint"}, {Name: "placement_workers"}, {Name: "placement_orgs"}, {Name: "placement_mailboxes"},
	{Name: "placement_assignment_retention"}, {Name: "placement_assignment_changes"}, {Name: "placement_history"},
	{Name: "placement_liveness"},
}

// TableReport is one table's comparison.
type TableReport = rebuild.TableReport

// Report is the outcome of Verify.
type Report struct {
	// Offset is the decision-log offset both sides stood at.
	Offset int64         `json:"offset"`
	Tables []TableReport `json:"tables"`
}

// Equal reports whether every table matched row for row.
func (r Report) Equal() bool { return rebuild.AllEqual(r.Tables) }

// Format writes the report as a table.
func (r Report) Format(w io.Writer) {
	fmt.Fprintf(w, "compared at decision-log offset %d\n", r.Offset)
	rebuild.FormatTables(w, r.Tables)
}

// ErrLiveBehind: the live projection stayed behind the rebuild, so the two
// could not be compared at one offset (is the placement projector
// running?).
var ErrLiveBehind = errors.New("replay: the live projection is behind the rebuild")

// Verify compares the rebuild with the live projection row for row, both
// at one decision-log offset: in one snapshot of the live schema it reads
// the live checkpoint; when the live projection is ahead the rebuild
// catches up to exactly its offset first, when it is behind Verify waits
// for it (up to wait). The rebuild also adopts the live retention horizon
// of assignment changes (pruning below it, as postgres.PruneChanges did
// on the live side). Each table is compared with EXCEPT both ways.
func (p *Placement) Verify(ctx context.Context, wait time.Duration) (Report, error) {
	if p.swapped {
		return Report{}, errors.New("replay: the rebuild was swapped in")
	}
	deadline := time.Now().Add(wait)
	for {
		rep, again, err := p.verifyOnce(ctx)
		if err != nil || !again {
			return rep, err
		}
		if time.Now().After(deadline) {
			return Report{}, fmt.Errorf("%w (live at offset %d, rebuild at %d after waiting %s)", ErrLiveBehind, rep.Offset, p.next, wait)
		}
		select {
		case <-ctx.Done():
			return Report{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// verifyOnce compares in one live snapshot; again says the live side was
// behind (rep.Offset holds its offset).
func (p *Placement) verifyOnce(ctx context.Context) (rep Report, again bool, err error) {
	for {
		tx, err := p.cfg.Live.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return Report{}, false, fmt.Errorf("replay: begin: %w", err)
		}
		ck, err := postgres.ReadCheckpoint(ctx, tx)
		var horizon, rebuiltHorizon int64
		if err == nil {
			err = tx.QueryRow(ctx, `SELECT COALESCE((SELECT retained_from FROM placement_assignment_retention), 0),
    COALESCE((SELECT retained_from FROM `+pgx.Identifier{p.schema, "placement_assignment_retention"}.Sanitize()+`), 0)`).
				Scan(&horizon, &rebuiltHorizon)
		}
		if err != nil {
			_ = tx.Rollback(ctx)
			return Report{}, false, fmt.Errorf("replay: live position: %w", err)
		}
		switch {
		case ck.NextOffset < p.next:
			_ = tx.Rollback(ctx)
			return Report{Offset: ck.NextOffset}, true, nil
		case ck.NextOffset > p.next:
			_ = tx.Rollback(ctx)
			if err := p.CatchUp(ctx, ck.NextOffset); err != nil {
				return Report{}, false, err
			}
			continue
		}
		if horizon != rebuiltHorizon {
			// Outside the snapshot, which would not see it.
			_ = tx.Rollback(ctx)
			if err := p.adoptHorizon(ctx, horizon); err != nil {
				return Report{}, false, err
			}
			continue
		}
		rep, err = p.compare(ctx, tx)
		_ = tx.Rollback(ctx)
		rep.Offset = ck.NextOffset
		return rep, false, err
	}
}

// adoptHorizon prunes the rebuild's assignment changes below the live
// retention horizon and records the horizon, as the live side did.
func (p *Placement) adoptHorizon(ctx context.Context, horizon int64) error {
	_, err := postgres.PruneChanges(ctx, p.pool, horizon)
	if err != nil {
		return fmt.Errorf("replay: adopt the live retention horizon %d: %w", horizon, err)
	}
	return nil
}

// compare compares every table in tx (the live snapshot; the rebuild does
// not move meanwhile).
func (p *Placement) compare(ctx context.Context, tx pgx.Tx) (Report, error) {
	ts, err := rebuild.CompareTables(ctx, tx, p.live, p.schema, placementTables)
	if err != nil {
		return Report{}, fmt.Errorf("replay: %w", err)
	}
	return Report{Tables: ts}, nil
}

// Swap swaps the rebuild in, in one transaction: every placement relation
// (tables and views) of the live schema moves to the rebuild's schema and
// the rebuild's take their place, and the live projector_offsets row of
// the placement projection moves to the rebuild's checkpoint. The live
// placement projector notices at its next batch (its checkpoint moved) and
// resumes from the rebuild's offset; the worker API's tokens stay valid
// (offsets are the log's). Afterwards the rebuild's schema holds the
// previous projection: drop it once satisfied (Drop).
func (p *Placement) Swap(ctx context.Context) error {
	if p.swapped {
		return errors.New("replay: already swapped")
	}
	isPlacement := func(name string) bool { return strings.HasPrefix(name, "placement_") }
	swap := func(tx pgx.Tx) error {
		// The checkpoint first: the placement projector's transactions
		// lock it before any other placement table, so taking it first
		// waits for the one in flight and holds the next back, and the
		// two never deadlock. Readers (the worker API, a restoring
		// engine) may still deadlock with the renames; then the swap
		// is retried.
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '30s'; LOCK TABLE `+
			pgx.Identifier{p.live, "placement_checkpoint"}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		liveRels, err := rebuild.Relations(ctx, tx, p.live, isPlacement)
		if err != nil {
			return err
		}
		newRels, err := rebuild.Relations(ctx, tx, p.schema, isPlacement)
		if err != nil {
			return err
		}
		if err := rebuild.SameRelations(liveRels, newRels, p.live, p.schema); err != nil {
			return err
		}
		if err := rebuild.MoveRelations(ctx, tx, p.live, p.schema, liveRels); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{p.live, "projector_offsets"}.Sanitize()+`
    (projector, topic, partition, next_offset, updated_at)
SELECT $1, $2, 0, COALESCE((SELECT next_offset FROM `+pgx.Identifier{p.live, "placement_checkpoint"}.Sanitize()+`), 0), now()
ON CONFLICT (projector, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = EXCLUDED.updated_at`,
			postgres.Name, p.cfg.Kafka.Topic(topics.PlacementDecisions))
		if err != nil {
			return fmt.Errorf("replay: move the placement projector's offset: %w", err)
		}
		return rebuild.SetState(ctx, tx, p.schema, rebuild.StatePrevious)
	}
	err := rebuild.Retry(ctx, 5, func() error { return pgx.BeginFunc(ctx, p.cfg.Live, swap) }, func(attempt int, err error) {
		p.cfg.Logger.Warn("swap collided with another transaction; retrying", "attempt", attempt, "err", err)
	})
	if err != nil {
		return err
	}
	p.swapped = true
	p.pool.Close()
	p.cfg.Logger.Info("rebuilt placement projection swapped in", "live", p.live, "previous", p.schema, "offset", p.next)
	return nil
}
