package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/topics"
)

// Checkpoint is a state of the engine and where in the decision log it
// stands: the fold of every decision before NextOffset.
type Checkpoint struct {
	State placement.Snapshot
	// NextOffset is the first decision-log offset not folded into State.
	NextOffset int64
	// LastDecisionID is the ce_id of the last decision folded into State,
	// or "" when there is none or the snapshotter does not know it. It
	// only seeds tick decision ids (see DecisionID) and is replaced by the
	// id of any decision read after NextOffset.
	LastDecisionID string
}

// Snapshotter loads the checkpoint an engine restores from. The engine then
// reads the decision log from the checkpoint's NextOffset to its end. The
// placement projection in Postgres (which records the decision-log offset
// it has applied, in the same transaction as its rows) is the production
// snapshotter; LogSnapshotter is the one that needs nothing.
type Snapshotter interface {
	Load(ctx context.Context) (Checkpoint, error)
}

// LogSnapshotter starts from the empty state at offset 0: the engine folds
// the whole decision log on every start. Correct at any size, and fast
// enough for small logs; a projection-backed snapshotter bounds start-up
// time for large ones.
type LogSnapshotter struct{}

// Load returns the empty checkpoint.
func (LogSnapshotter) Load(context.Context) (Checkpoint, error) { return Checkpoint{}, nil }

// ErrLogGap is returned when a checkpoint points outside the decision log.
var ErrLogGap = errors.New("placement: checkpoint offset outside the decision log")

// ReadDecisions reads the decision log (read_committed) from offset from up
// to its last stable offset as of the call, calling fn for each decision in
// order, and returns that end offset. ctx bounds the whole read. The
// decision log has one partition; its total order is the engine's. A
// checkpoint outside the log is ErrLogGap, never a silent skip. Records
// are decoded on several goroutines (kafka.ReadDecoded: decoding is most
// of a large read's work); fn is called from one goroutine, in log order.
func ReadDecisions(ctx context.Context, kcfg kafka.Config, from int64, fn func(offset int64, d topics.Decision) error) (end int64, err error) {
	if from < 0 {
		return 0, fmt.Errorf("%w: offset %d", ErrLogGap, from)
	}
	log := kafka.Partition{Topic: kcfg.Topic(topics.PlacementDecisions), Partition: 0}
	spec := kafka.ReadSpec{
		Topics:     []string{log.Topic},
		Partitions: func(string, int) []int32 { return []int32{log.Partition} },
		ClientID:   "restore",
		From: func(_ kafka.Partition, b kafka.Bounds) (int64, error) {
			switch {
			case from > b.End:
				return 0, fmt.Errorf("%w: offset %d is past the log's end %d", ErrLogGap, from, b.End)
			case from < b.Start:
				return 0, fmt.Errorf("%w: offset %d is below the log's start %d (records deleted)", ErrLogGap, from, b.Start)
			}
			return from, nil
		},
	}
	type decoded struct {
		offset int64
		d      topics.Decision
	}
	decode := func(r *kgo.Record) (decoded, error) {
		d, err := topics.DecodeDecision(r)
		if err != nil {
			return decoded{}, fmt.Errorf("placement: decision at offset %d: %w", r.Offset, err)
		}
		return decoded{r.Offset, d}, nil
	}
	bounds, err := kafka.ReadDecoded(ctx, kcfg, spec, decode, func(ds []decoded) error {
		for i := range ds {
			if err := fn(ds[i].offset, ds[i].d); err != nil {
				return fmt.Errorf("placement: decision at offset %d (%s): %w", ds[i].offset, ds[i].d.Data.EventType(), err)
			}
			ds[i] = decoded{} // the chunk is not read again: let the decision go
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("placement: reading the decision log: %w", err)
	}
	return bounds[log].End, nil
}

// restored is a state rebuilt from a checkpoint and the log after it.
type restored struct {
	state      *placement.State
	end        int64    // decision-log offset the state is as of
	lastID     string   // last decision's ce_id
	workers    []string // every worker the state knows
	decisions  int      // decisions folded from the log
	checkpoint int64    // where the log was read from
	nonEmpty   bool     // the checkpoint or the log held committed decisions
	// Where the time went: loading the checkpoint, building the state
	// from it, reading and folding the log after it.
	loadTook, stateTook, logTook time.Duration
}

// restore loads the checkpoint and folds the decision log from its offset to
// the log's end.
func restore(ctx context.Context, kcfg kafka.Config, cfg placement.Config, snap Snapshotter) (*restored, error) {
	start := time.Now()
	ck, err := snap.Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("placement: loading the checkpoint: %w", err)
	}
	loaded := time.Now()
	st, err := placement.NewStateFromSnapshot(cfg, ck.State)
	if err != nil {
		return nil, fmt.Errorf("placement: checkpoint at offset %d: %w", ck.NextOffset, err)
	}
	r := &restored{state: st, lastID: ck.LastDecisionID, checkpoint: ck.NextOffset, loadTook: loaded.Sub(start)}
	r.nonEmpty = len(ck.State.Workers)+len(ck.State.Mailboxes)+len(ck.State.Orgs) > 0
	seen := make(map[string]bool, len(ck.State.Workers))
	r.workers = make([]string, 0, len(ck.State.Workers))
	for _, w := range ck.State.Workers {
		seen[w.ID] = true
		r.workers = append(r.workers, w.ID)
	}
	// The views are in the state now: let the collector have them while
	// the log is read (a million mailboxes' views are ~200 MiB).
	ck.State = placement.Snapshot{}
	built := time.Now()
	r.stateTook = built.Sub(loaded)
	r.end, err = ReadDecisions(ctx, kcfg, ck.NextOffset, func(_ int64, d topics.Decision) error {
		if err := st.ApplyDecision(d.Data); err != nil {
			return err
		}
		if w, ok := d.Data.(*domain.PlacementWorkerRegistered); ok && !seen[w.WorkerID] {
			seen[w.WorkerID] = true
			r.workers = append(r.workers, w.WorkerID)
		}
		r.lastID = d.ID
		r.decisions++
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.logTook = time.Since(built)
	r.nonEmpty = r.nonEmpty || r.decisions > 0
	return r, nil
}
