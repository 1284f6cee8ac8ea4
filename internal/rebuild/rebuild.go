package rebuild

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/health"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/projections"
)

// Spec is the per-projection part of a rebuild of a generic-projector
// projection.
type Spec struct {
	// Projection is the fold: its Name keys its rows in projector_offsets
	// and applied_events, its Topics are read from offset 0.
	Projection projections.Projection
	// Tables are the tables that define the projection.
	Tables []Table
	// Publishes says the live projection publishes what it decides (the
	// health scorer's state changes) and the rebuild does not: a swap is
	// then refused while the rebuild is ahead of the live projector, since
	// the live projector would never apply, so never publish, the records
	// in between.
	Publishes bool
}

// RegistrySpec is the registry projection's. Every column is compared:
// the registry's timestamps are events' ce_time and last_event_id the last
// event's, so a rebuild of the same log has the same rows.
func RegistrySpec() Spec {
	return Spec{Projection: projections.NewRegistry(), Tables: []Table{
		{Name: "mailboxes"}, {Name: "orgs"}, {Name: "users"}, {Name: "workers"},
	}}
}

// HealthSpec is the health projection's: the scorer WithoutPublishing, so
// the rebuild queues no mailbox.health_scored (nothing reaches Kafka).
// The scorer's wall-clock ticker (health.Ticker) also evaluates live rows,
// with no record in the log; a live row evaluated after its last
// observation (its last_eval later than the rebuild's) cannot be rebuilt
// and is counted as skipped rather than compared.
func HealthSpec(policy domain.HealthPolicy) (Spec, error) {
	s, err := health.NewScorer(policy, health.WithoutPublishing())
	if err != nil {
		return Spec{}, err
	}
	return Spec{Projection: s, Publishes: true, Tables: []Table{{
		Name: "mailbox_health", Key: []string{"mailbox_id"},
		Skip:    "l.last_eval > r.last_eval",
		SkipWhy: "evaluated by the wall-clock ticker after its last observation (not in the log)",
	}}}, nil
}

// Config configures a rebuild.
type Config struct {
	// Kafka reaches the projection's topics.
	Kafka kafka.Config
	// Live is a pool on the live schema (its connections' search_path
	// selects it): where the rebuild's schema is created, what Verify
	// compares with and where Swap swaps.
	Live *pgxpool.Pool
	// Schema names the fresh schema (see CheckName). Default: DefaultName.
	Schema string
	// BatchSize is how many records one transaction applies. Default
	// projections.DefaultBatchSize.
	BatchSize int
	// Progress, when set, is called about every ProgressEvery while
	// records are applied, and once more when a pass is done.
	Progress      func(Progress)
	ProgressEvery time.Duration
	// Logger logs the steps. Default: discard.
	Logger *slog.Logger
}

// Progress reports a pass over the projection's partitions.
type Progress struct {
	// Records applied so far in this pass.
	Records int64
	// Done and Total are the offsets covered so far and to cover, summed
	// over the partitions.
	Done, Total int64
	Elapsed     time.Duration
	// Final is set on the last report of a pass.
	Final bool
}

// Fraction is the share of the pass done, in [0, 1].
func (p Progress) Fraction() float64 {
	if p.Total <= 0 {
		return 1
	}
	return min(1, max(0, float64(p.Done)/float64(p.Total)))
}

// Position is where a projection stands on one partition: the next offset
// to apply.
type Position struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Next      int64  `json:"next_offset"`
}

// Rebuild is a rebuild of one projection in its own schema.
type Rebuild struct {
	cfg     Config
	spec    Spec
	name    string
	live    string
	schema  string
	pool    *pgxpool.Pool // search_path = schema
	release func()

	next    map[kafka.Partition]int64
	records int64 // applied, all passes
	poison  int64 // passed without applying, all passes
	took    time.Duration
	swapped bool
}

// Start creates the fresh schema, migrates it, and applies the
// projection's topics from offset 0 of every partition to their ends as of
// the call. On failure it drops the schema.
func Start(ctx context.Context, spec Spec, cfg Config) (*Rebuild, error) {
	if cfg.Live == nil || len(cfg.Kafka.Brokers) == 0 || spec.Projection == nil || len(spec.Tables) == 0 {
		return nil, errors.New("rebuild: a live pool, brokers and a projection with tables are required")
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = projections.DefaultBatchSize
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 200 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	name := spec.Projection.Name()
	live, err := LiveSchema(ctx, cfg.Live)
	if err != nil {
		return nil, err
	}
	if cfg.Schema == "" {
		cfg.Schema = DefaultName(live, name, time.Now())
	}
	if err := Create(ctx, cfg.Live, name, live, cfg.Schema); err != nil {
		return nil, err
	}
	r := &Rebuild{cfg: cfg, spec: spec, name: name, live: live, schema: cfg.Schema, next: map[kafka.Partition]int64{}}
	if err := r.build(ctx); err != nil {
		r.Close()
		if derr := DropSchema(ctx, cfg.Live, r.schema); derr != nil {
			cfg.Logger.Warn("could not drop the failed rebuild's schema", "schema", r.schema, "err", derr)
		}
		return nil, err
	}
	return r, nil
}

func (r *Rebuild) build(ctx context.Context) error {
	release, err := Hold(ctx, r.cfg.Live, r.schema)
	if err != nil {
		return err
	}
	r.release = release
	if r.pool, err = Pool(ctx, r.cfg.Live, r.schema); err != nil {
		return err
	}
	if err := migrations.Apply(ctx, r.pool); err != nil {
		return fmt.Errorf("rebuild: migrate %s: %w", r.schema, err)
	}
	r.cfg.Logger.Info("rebuilding a projection", "projection", r.name, "schema", r.schema, "live", r.live)
	if err := r.pass(ctx, nil); err != nil {
		return err
	}
	return SetState(ctx, r.pool, r.schema, StateBuilt)
}

// Name is the projection's name.
func (r *Rebuild) Name() string { return r.name }

// Schema is the rebuild's schema (after Swap, the previous live
// projection's).
func (r *Rebuild) Schema() string { return r.schema }

// LiveSchema is the live schema.
func (r *Rebuild) LiveSchema() string { return r.live }

// Records is how many records the rebuild applied; Poison how many it
// passed without applying (undecodable, or refused by the projection: the
// records the live projector dead-letters).
func (r *Rebuild) Records() int64 { return r.records }

// Poison is how many records the rebuild passed without applying.
func (r *Rebuild) Poison() int64 { return r.poison }

// Took is the time spent applying records.
func (r *Rebuild) Took() time.Duration { return r.took }

// Pool is a pool on the rebuild's schema (closed by Close and Swap).
func (r *Rebuild) Pool() *pgxpool.Pool { return r.pool }

// Positions are where the rebuild stands, by topic and partition.
func (r *Rebuild) Positions() []Position { return positions(r.next) }

func positions(m map[kafka.Partition]int64) []Position {
	out := make([]Position, 0, len(m))
	for p, n := range m {
		out = append(out, Position{Topic: p.Topic, Partition: p.Partition, Next: n})
	}
	slices.SortFunc(out, func(a, b Position) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}

// Close closes the pool on the rebuild's schema and lets cleanup drop it;
// the schema stays.
func (r *Rebuild) Close() {
	if r.pool != nil {
		r.pool.Close()
	}
	if r.release != nil {
		r.release()
		r.release = nil
	}
}

// CatchUp applies the records from the rebuild's positions up to targets
// (exclusive), so that it stands exactly there on each partition named.
func (r *Rebuild) CatchUp(ctx context.Context, targets map[kafka.Partition]int64) error {
	if r.swapped {
		return errors.New("rebuild: the rebuild was swapped in")
	}
	for p, to := range targets {
		if to < r.next[p] {
			return fmt.Errorf("rebuild: cannot catch up %s backwards from %d to %d", p, r.next[p], to)
		}
	}
	return r.pass(ctx, targets)
}

// pass reads the projection's topics from the rebuild's positions, up to
// targets when set (partitions not named are not read) or to the ends as
// of the read's start, and applies them in transactions of a batch.
func (r *Rebuild) pass(ctx context.Context, targets map[kafka.Partition]int64) error {
	start := time.Now()
	var applied, done, total atomic.Int64
	stop := r.reporter(start, &applied, &done, &total)
	var (
		batch   []*kgo.Record
		passErr error
	)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		n, err := r.applyBatch(ctx, batch)
		if err != nil {
			return err
		}
		applied.Add(n)
		done.Add(int64(len(batch)))
		batch = batch[:0]
		return nil
	}
	spec := kafka.ReadSpec{
		Topics:   r.cfg.Kafka.Namespace.Topics(r.spec.Projection.Topics()...),
		ClientID: "rebuild-" + r.name,
		From: func(p kafka.Partition, b kafka.Bounds) (int64, error) {
			from := r.next[p]
			end := b.End
			if targets != nil {
				to, ok := targets[p]
				if !ok || to <= from {
					return b.End, nil
				}
				end = min(end, to)
			}
			if from < b.Start && end > from {
				return 0, fmt.Errorf("rebuild: %s starts at offset %d, past %d: the log no longer holds the projection's history", p, b.Start, from)
			}
			total.Add(max(0, end-from))
			return from, nil
		},
	}
	_, passErr = kafka.ReadBatches(ctx, r.cfg.Kafka, spec, func(recs []*kgo.Record) error {
		for _, rec := range recs {
			p := kafka.Partition{Topic: rec.Topic, Partition: rec.Partition}
			if targets != nil {
				if to, ok := targets[p]; !ok || rec.Offset >= to {
					continue
				}
			}
			batch = append(batch, rec)
			if len(batch) >= r.cfg.BatchSize {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if passErr == nil {
		passErr = flush()
	}
	if passErr == nil {
		// A partition whose records end before the target (control
		// records) stands at the target all the same.
		for p, to := range targets {
			r.next[p] = max(r.next[p], to)
		}
	}
	took := time.Since(start)
	done.Store(total.Load())
	stop(passErr == nil)
	r.records += applied.Load()
	r.took += took
	if passErr != nil {
		return fmt.Errorf("rebuild: %s: %w", r.name, passErr)
	}
	r.cfg.Logger.Info("records applied", "projection", r.name, "schema", r.schema, "records", applied.Load(), "took", took)
	return nil
}

// applyBatch applies recs (each partition's in log order) in one
// transaction: the first copy of each event not applied before, as the
// projector does (applied_events), and the partitions' positions. When
// the projection refuses a record, the batch is applied again a record at
// a time, and the refused ones are passed, as the projector dead-letters
// them.
func (r *Rebuild) applyBatch(ctx context.Context, recs []*kgo.Record) (int64, error) {
	n, err := r.applyTx(ctx, recs, false)
	if _, permanent := projections.IsPermanent(err); err == nil || !permanent {
		return n, err
	}
	n = 0
	for i := range recs {
		k, err := r.applyTx(ctx, recs[i:i+1], true)
		if err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}

func (r *Rebuild) applyTx(ctx context.Context, recs []*kgo.Record, isolate bool) (int64, error) {
	var (
		fresh []projections.Record
		ids   [][16]byte
		seen  = map[[16]byte]bool{}
		next  = map[kafka.Partition]int64{}
		bad   int64
	)
	for _, rec := range recs {
		next[kafka.Partition{Topic: rec.Topic, Partition: rec.Partition}] = rec.Offset + 1
		if dlq.ForOtherConsumer(rec, r.name) {
			continue // redriven for another consumer: passed, as the projector passes it
		}
		ev, id, err := projections.DecodeEvent(rec)
		if err != nil {
			bad++
			continue
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		ids = append(ids, id)
		fresh = append(fresh, projections.Record{Event: ev, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Appended: rec.Timestamp})
	}
	var applied int64
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return err
		}
		if len(ids) > 0 {
			rows, _ := tx.Query(ctx, `INSERT INTO applied_events (projector, event_id) SELECT $1, unnest($2::uuid[])
ON CONFLICT DO NOTHING RETURNING event_id`, r.name, ids)
			firsts := map[[16]byte]bool{}
			var id [16]byte
			if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { firsts[id] = true; return nil }); err != nil {
				return err
			}
			keep := fresh[:0]
			for i, rec := range fresh {
				if firsts[ids[i]] {
					keep = append(keep, rec)
				}
			}
			fresh = keep
			if len(fresh) > 0 {
				if err := r.spec.Projection.Apply(ctx, tx, fresh); err != nil {
					if _, permanent := projections.IsPermanent(err); permanent && isolate {
						return errRefused
					}
					return err
				}
			}
		}
		var (
			ts  []string
			ps  []int32
			nxt []int64
		)
		for p, n := range next {
			ts, ps, nxt = append(ts, p.Topic), append(ps, p.Partition), append(nxt, n)
		}
		_, err := tx.Exec(ctx, `INSERT INTO projector_offsets (projector, topic, partition, next_offset, updated_at)
SELECT $1, u.topic, u.partition, u.next_offset, now()
FROM unnest($2::text[], $3::int4[], $4::int8[]) AS u(topic, partition, next_offset)
ON CONFLICT (projector, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = EXCLUDED.updated_at`,
			r.name, ts, ps, nxt)
		applied = int64(len(fresh))
		return err
	})
	if errors.Is(err, errRefused) {
		// Pass the record as the projector would after dead-lettering it:
		// its position moves, nothing else.
		r.cfg.Logger.Warn("the projection refused a record; passed, as the projector dead-letters it",
			"projection", r.name, "topic", recs[0].Topic, "partition", recs[0].Partition, "offset", recs[0].Offset)
		r.poison++
		return 0, r.passRefused(ctx, recs[0])
	}
	if err != nil {
		return 0, err
	}
	for p, n := range next {
		r.next[p] = n
	}
	r.poison += bad
	return applied, nil
}

var errRefused = errors.New("rebuild: the projection refused the record")

func (r *Rebuild) passRefused(ctx context.Context, rec *kgo.Record) error {
	_, err := r.pool.Exec(ctx, `INSERT INTO projector_offsets (projector, topic, partition, next_offset, updated_at)
VALUES ($1, $2, $3, $4, now())
ON CONFLICT (projector, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = EXCLUDED.updated_at`,
		r.name, rec.Topic, rec.Partition, rec.Offset+1)
	if err == nil {
		r.next[kafka.Partition{Topic: rec.Topic, Partition: rec.Partition}] = rec.Offset + 1
	}
	return err
}

// reporter calls cfg.Progress every ProgressEvery until the returned stop,
// which reports once more (Final when the pass succeeded).
func (r *Rebuild) reporter(start time.Time, applied, done, total *atomic.Int64) (stop func(ok bool)) {
	if r.cfg.Progress == nil {
		return func(bool) {}
	}
	report := func(final bool) {
		r.cfg.Progress(Progress{Records: applied.Load(), Done: done.Load(), Total: total.Load(), Elapsed: time.Since(start), Final: final})
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				report(false)
			}
		}
	})
	return func(ok bool) {
		close(quit)
		wg.Wait()
		report(ok)
	}
}
