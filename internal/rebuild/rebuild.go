package rebuild

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/applyonce"
	"github.com/mailplane/mailplane/internal/health"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/projections"
)

// Spec is the per-projection part of a rebuild: RegistrySpec, HealthSpec,
// PlacementSpec, or Of by name.
type Spec struct {
	// Projection is the fold of a projection of the generic projector
	// (package projections): its Name keys its rows in projector_offsets
	// and applied_events, its Topics are read from offset 0. Unset for
	// the placement projection (PlacementSpec).
	Projection projections.Projection
	// Tables are the tables that define the projection.
	Tables []Table
	// Publishes says the live projection publishes what it decides (the
	// health scorer's state changes) and the rebuild does not: a swap is
	// then refused while the rebuild is ahead of the live projector, since
	// the live projector would never apply, so never publish, the records
	// in between.
	Publishes bool
	// decisions: the placement projection, its decision log folded by
	// decisionFold.
	decisions bool
}

// Of is the spec of the projection named (Registry, Placement, Health);
// health with the default policy.
func Of(name string) (Spec, error) {
	switch name {
	case Registry:
		return RegistrySpec(), nil
	case Placement:
		return PlacementSpec(), nil
	case Health:
		return HealthSpec(domain.DefaultHealthPolicy())
	}
	return Spec{}, fmt.Errorf("rebuild: no projection %q (%s)", name, strings.Join(Projections, ", "))
}

// fold is how a rebuild applies its projection's log: the part of the one
// driver that differs between the projections of the generic projector
// (eventFold) and the placement projection (decisionFold).
type fold interface {
	// build applies the log from offset 0 to its ends as of the call into
	// the empty schema.
	build(ctx context.Context, r *Rebuild) error
	// catchUp applies the log from r's positions up to targets.
	catchUp(ctx context.Context, r *Rebuild, targets map[kafka.Partition]int64) error
	// settle brings into the rebuild what the live side did outside the
	// log, before a compare in the live snapshot tx; again says it did
	// (and rolled tx back): compare in a new snapshot.
	settle(ctx context.Context, r *Rebuild, tx pgx.Tx) (again bool, err error)
	// swap exchanges the live projection and the rebuild in tx.
	swap(ctx context.Context, r *Rebuild, tx pgx.Tx) error
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

// Config configures a rebuild (of any projection).
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
	// projections.DefaultBatchSize (PlacementBatchSize for placement).
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
	// Records applied so far in this pass (events, or decisions for the
	// placement projection).
	Records int64
	// Done and Total are the offsets covered so far and to cover, summed
	// over the partitions.
	Done, Total int64
	Elapsed     time.Duration
	// Final is set on the last report of a pass.
	Final bool
}

// Rate is the records applied per second so far.
func (p Progress) Rate() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Records) / p.Elapsed.Seconds()
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

// Rebuild is a rebuild of one projection in its own schema: the one
// driver of every projection's rebuild (`mailplane rebuild`).
type Rebuild struct {
	cfg     Config
	spec    Spec
	fold    fold
	name    string
	live    string
	schema  string
	pool    *pgxpool.Pool // search_path = schema
	release func()

	next    map[kafka.Partition]int64 // where the rebuild stands
	rows    map[kafka.Partition]int64 // what its projector_offsets rows hold
	records int64                     // applied, all passes
	poison  int64                     // passed without applying, all passes
	took    time.Duration
	swapped bool
}

// Start creates the fresh schema, migrates it, and applies the
// projection's topics from offset 0 of every partition to their ends as of
// the call. On failure it drops the schema.
func Start(ctx context.Context, spec Spec, cfg Config) (*Rebuild, error) {
	if cfg.Live == nil || len(cfg.Kafka.Brokers) == 0 || (spec.Projection == nil && !spec.decisions) || len(spec.Tables) == 0 {
		return nil, errors.New("rebuild: a live pool, brokers and a projection with tables are required")
	}
	var (
		name string
		f    fold
	)
	if spec.decisions {
		name, f = Placement, newDecisionFold(cfg.Kafka)
		cfg.BatchSize = cmp.Or(max(cfg.BatchSize, 0), PlacementBatchSize)
	} else {
		name, f = spec.Projection.Name(), eventFold{}
		cfg.BatchSize = cmp.Or(max(cfg.BatchSize, 0), projections.DefaultBatchSize)
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 200 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Kafka.ClientID = cmp.Or(cfg.Kafka.ClientID, "mailplane-rebuild")
	live, err := LiveSchema(ctx, cfg.Live)
	if err != nil {
		return nil, err
	}
	named := cfg.Schema != ""
	for try := 0; ; try++ {
		if !named {
			cfg.Schema = DefaultName(live, name, time.Now())
		}
		err = Create(ctx, cfg.Live, name, live, cfg.Schema)
		// A default name taken meanwhile (another rebuild's): another.
		if err == nil || named || !errors.Is(err, errSchemaExists) || try == 3 {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	r := &Rebuild{cfg: cfg, spec: spec, fold: f, name: name, live: live, schema: cfg.Schema,
		next: map[kafka.Partition]int64{}, rows: map[kafka.Partition]int64{}}
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
	if err := r.fold.build(ctx, r); err != nil {
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

// Drop drops the rebuild's schema (after Swap: the previous projection).
func (r *Rebuild) Drop(ctx context.Context) error {
	r.Close()
	return DropSchema(ctx, r.cfg.Live, r.schema)
}

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
	return r.fold.catchUp(ctx, r, targets)
}

// eventFold rebuilds a projection of the generic projector: its topics
// applied through applyonce.Run, the live projector's transaction.
type eventFold struct{}

func (eventFold) build(ctx context.Context, r *Rebuild) error { return r.pass(ctx, nil) }

func (eventFold) catchUp(ctx context.Context, r *Rebuild, targets map[kafka.Partition]int64) error {
	return r.pass(ctx, targets)
}

func (eventFold) settle(context.Context, *Rebuild, pgx.Tx) (bool, error) { return false, nil }

// pass reads the projection's topics from the rebuild's positions, up to
// targets when set (partitions not named are not read) or to the ends as
// of the read's start, and applies them in transactions of a batch.
func (r *Rebuild) pass(ctx context.Context, targets map[kafka.Partition]int64) error {
	start := time.Now()
	var applied, done, total atomic.Int64
	stop := r.reporter(func() Progress {
		return Progress{Records: applied.Load(), Done: done.Load(), Total: total.Load(), Elapsed: time.Since(start)}
	})
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

// applyBatch applies recs (each partition's in log order) in transactions
// of applyonce.Run, the live projector's: the first copy of each event not
// applied before (applied_events), and the partitions' positions. A record
// the projection refuses is found by applyonce.Isolate, the live
// projector's poison path, and passed: committed with its position and
// nothing else, as the projector commits a record it dead-lettered, and
// counted in Poison. It returns how many records were applied.
func (r *Rebuild) applyBatch(ctx context.Context, recs []*kgo.Record) (int64, error) {
	rp := &replay{r: r}
	entries := make([]*entry, len(recs))
	bad := int64(0)
	for i, rec := range recs {
		e := &entry{rec: rec}
		ev, id, other, err := projections.Decode(rec, r.name)
		switch {
		case other: // passed, as the projector passes it
		case err != nil:
			bad++ // poison: the projector dead-letters it and passes it
		default:
			e.ev, e.id, e.live = ev, id, true
		}
		entries[i] = e
	}
	// One refusal makes a record poison: the projection is a function of
	// the events and the rows, so a replay refuses what it refused once.
	if err := applyonce.Isolate(ctx, entries, rp, 1); err != nil {
		return rp.applied, err
	}
	r.poison += bad
	return rp.applied, nil
}

// entry is a record of a rebuild's batch, decoded.
type entry struct {
	rec  *kgo.Record
	ev   domain.Event
	id   [16]byte
	live bool // decoded, for this projection, not refused
}

// replay is a rebuild's side of applyonce.Isolate: a refused record is
// passed and counted; any other failure ends the rebuild.
type replay struct {
	r       *Rebuild
	applied int64
	// tries of every partition alike: one refusal makes a record poison,
	// so a count never outlives its record.
	tries applyonce.Tries
}

func (*replay) Live(e *entry) bool { return e.live }
func (*replay) Aside(*entry) bool  { return false }
func (*replay) Interrupted() bool  { return false }
func (rp *replay) Tries(e *entry) (*applyonce.Tries, int64) {
	return &rp.tries, e.rec.Offset
}

func (rp *replay) Refused(_ context.Context, e *entry, rf applyonce.Refusal) {
	r := rp.r
	r.cfg.Logger.Warn("the projection refused a record; passed, as the projector dead-letters it",
		"projection", r.name, "topic", e.rec.Topic, "partition", e.rec.Partition, "offset", e.rec.Offset,
		"code", rf.Code, "err", rf.Err)
	e.live = false
	r.poison++
}

func (*replay) Failed(_ context.Context, _ []*entry, err error) (bool, error) { return false, err }

// Commit commits entries through applyonce.Run and moves the rebuild's
// positions past them.
func (rp *replay) Commit(ctx context.Context, entries []*entry) error {
	r := rp.r
	var (
		fresh []projections.Record
		ids   [][16]byte
		seen  = map[[16]byte]bool{}
		moves applyonce.Moves
		at    = map[kafka.Partition]int{}
	)
	for _, e := range entries {
		rec := e.rec
		p := kafka.Partition{Topic: rec.Topic, Partition: rec.Partition}
		if i, ok := at[p]; ok {
			moves.Next[i] = rec.Offset + 1
		} else {
			at[p] = moves.Len()
			moves.Add(p.Topic, p.Partition, r.rows[p], rec.Offset+1)
		}
		if !e.live || seen[e.id] {
			continue
		}
		seen[e.id] = true
		ids = append(ids, e.id)
		fresh = append(fresh, projections.Record{Event: e.ev, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Appended: rec.Timestamp})
	}
	applied := int64(len(fresh))
	b := applyonce.Batch{Projector: r.name, Moves: moves, IDs: ids, Async: true, Now: time.Now()}
	err := applyonce.Run(ctx, r.pool, b, func(ctx context.Context, tx pgx.Tx, firsts map[[16]byte]struct{}) error {
		recs := fresh
		if firsts != nil {
			recs = make([]projections.Record, 0, len(firsts))
			for i, rec := range fresh {
				if _, ok := firsts[ids[i]]; ok {
					recs = append(recs, rec)
				}
			}
		}
		applied = int64(len(recs))
		if len(recs) == 0 {
			return nil
		}
		return r.spec.Projection.Apply(ctx, tx, recs)
	})
	if err != nil {
		return err
	}
	for i, t := range moves.Topics {
		p := kafka.Partition{Topic: t, Partition: moves.Partitions[i]}
		r.rows[p], r.next[p] = moves.Next[i], moves.Next[i]
	}
	rp.applied += applied
	return nil
}

// reporter calls cfg.Progress with snap() every ProgressEvery until the
// returned stop, which reports once more (Final when the pass succeeded).
func (r *Rebuild) reporter(snap func() Progress) (stop func(ok bool)) {
	if r.cfg.Progress == nil {
		return func(bool) {}
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
				r.cfg.Progress(snap())
			}
		}
	})
	return func(ok bool) {
		close(quit)
		wg.Wait()
		p := snap()
		p.Final = ok
		r.cfg.Progress(p)
	}
}
