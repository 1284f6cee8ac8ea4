package replay

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/placement/projection"
	"github.com/mailplane/mailplane/topics"
)

// readParallel reads the decision log from offset from to its last stable
// offset as of the call, like engine.ReadDecisions (read_committed,
// markers skipped, no offset reset: a log that does not reach back to
// from is engine.ErrLogGap), but decodes on several goroutines: decoding
// (JSON and validation) is most of a rebuild's Go work. Chunks of
// decisions reach out in log order; out is closed when the read ends. It
// returns the end offset.
func readParallel(ctx context.Context, kcfg kafka.Config, from int64, out chan<- []projection.Record) (int64, error) {
	defer close(out)
	cl, err := kgo.NewClient(append(kafka.ConnOptions(kcfg),
		kgo.ClientID(kcfg.ClientID),
		kgo.RequestTimeoutOverhead(10*time.Second),
		kgo.RetryTimeout(30*time.Second),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.FetchMaxBytes(64<<20),
		kgo.FetchMaxPartitionBytes(64<<20),
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topics.PlacementDecisions: {0: kgo.NewOffset().At(from)}}),
	)...)
	if err != nil {
		return 0, fmt.Errorf("replay: decision-log reader: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListCommittedOffsets(ctx, topics.PlacementDecisions)
	if err == nil {
		err = ends.Error()
	}
	starts, serr := adm.ListStartOffsets(ctx, topics.PlacementDecisions)
	if err == nil && serr == nil {
		err = starts.Error()
	} else if err == nil {
		err = serr
	}
	if err != nil {
		return 0, fmt.Errorf("replay: decision-log bounds: %w", err)
	}
	e, ok1 := ends.Lookup(topics.PlacementDecisions, 0)
	s, ok2 := starts.Lookup(topics.PlacementDecisions, 0)
	if !ok1 || !ok2 {
		return 0, fmt.Errorf("replay: topic %s has no partition 0", topics.PlacementDecisions)
	}
	end := e.Offset
	switch {
	case from > end || from < s.Offset:
		return 0, fmt.Errorf("%w: offset %d is outside the log [%d, %d)", engine.ErrLogGap, from, s.Offset, end)
	case from == end:
		return end, nil
	}

	type job struct {
		recs []*kgo.Record
		res  chan []projection.Record
		err  chan error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan *job, 8)
	ordered := make(chan *job, 64)
	var wg sync.WaitGroup
	for range max(2, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				ds := make([]projection.Record, 0, len(j.recs))
				var derr error
				for _, r := range j.recs {
					d, err := topics.DecodeDecision(r)
					if err != nil {
						derr = fmt.Errorf("replay: decision at offset %d: %w", r.Offset, err)
						break
					}
					ds = append(ds, projection.Record{Offset: r.Offset, Decision: d})
				}
				j.res <- ds
				j.err <- derr
			}
		}()
	}
	// The collector hands decoded chunks on in order.
	collected := make(chan error, 1)
	go func() {
		var cerr error
		for j := range ordered {
			ds, err := <-j.res, <-j.err
			if cerr != nil {
				continue
			}
			if err != nil {
				cerr = err
				cancel()
				continue
			}
			if len(ds) == 0 {
				continue
			}
			select {
			case out <- ds:
			case <-ctx.Done():
				cerr = ctx.Err()
			}
		}
		collected <- cerr
	}()
	submit := func(recs []*kgo.Record) bool {
		j := &job{recs: recs, res: make(chan []projection.Record, 1), err: make(chan error, 1)}
		select {
		case ordered <- j:
		case <-ctx.Done():
			return false
		}
		select {
		case jobs <- j:
			return true
		case <-ctx.Done():
			// The collector waits for this job: answer it.
			j.res <- nil
			j.err <- ctx.Err()
			return false
		}
	}

	var rerr error
	last := from - 1
	const chunk = 1024
	buf := make([]*kgo.Record, 0, chunk)
	for last < end-1 && rerr == nil {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			rerr = err
			break
		}
		fs.EachError(func(_ string, _ int32, err error) {
			if rerr == nil {
				rerr = fmt.Errorf("replay: reading the decision log: %w", err)
			}
		})
		for it := fs.RecordIter(); !it.Done() && rerr == nil; {
			r := it.Next()
			if r.Offset >= end {
				last = end - 1
				break
			}
			last = r.Offset
			if r.Attrs.IsControl() {
				continue
			}
			buf = append(buf, r)
			if len(buf) == chunk {
				if !submit(buf) {
					rerr = ctx.Err()
				}
				buf = make([]*kgo.Record, 0, chunk)
			}
		}
	}
	if rerr == nil && len(buf) > 0 && !submit(buf) {
		rerr = ctx.Err()
	}
	close(jobs)
	wg.Wait()
	close(ordered)
	if cerr := <-collected; cerr != nil && (rerr == nil || errors.Is(rerr, context.Canceled)) {
		rerr = cerr
	}
	if rerr != nil {
		return 0, rerr
	}
	return end, nil
}
