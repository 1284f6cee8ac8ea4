package kafka

import (
	"context"
	"errors"
	"runtime"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// decodeChunk is how many records one decoding job takes.
const decodeChunk = 1024

// ReadDecoded is ReadToEnd decoding the records on several goroutines:
// decoding (JSON and validation) is most of a large read's Go work. decode
// is called from several goroutines at once; fn gets the decoded values in
// chunks, in the order ReadToEnd would have handed it the records, from
// one goroutine. An error from decode or fn ends the read and is returned.
func ReadDecoded[T any](ctx context.Context, cfg Config, spec ReadSpec, decode func(*kgo.Record) (T, error), fn func([]T) error) (map[Partition]Bounds, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pp := startPipeline(ctx, cancel, decode, fn)
	bounds, err := ReadBatches(ctx, cfg, spec, pp.add)
	if err == nil {
		err = pp.flush()
	}
	if perr := pp.close(); perr != nil && (err == nil || errors.Is(err, context.Canceled)) {
		// The pipeline's failure canceled the read: report the cause.
		err = perr
	}
	if err != nil {
		return nil, err
	}
	return bounds, nil
}

// pipeline decodes chunks of records on its workers and hands the results
// to fn in submission order from its collector.
type pipeline[T any] struct {
	ctx       context.Context
	decode    func(*kgo.Record) (T, error)
	jobs      chan *decodeJob[T] // to the workers
	ordered   chan *decodeJob[T] // to the collector, in order
	workers   sync.WaitGroup
	collected chan error
	buf       []*kgo.Record
}

type decodeJob[T any] struct {
	recs []*kgo.Record
	done chan decodeResult[T]
}

type decodeResult[T any] struct {
	vals []T
	err  error
}

func startPipeline[T any](ctx context.Context, cancel context.CancelFunc, decode func(*kgo.Record) (T, error), fn func([]T) error) *pipeline[T] {
	pp := &pipeline[T]{
		ctx:       ctx,
		decode:    decode,
		jobs:      make(chan *decodeJob[T], 8),
		ordered:   make(chan *decodeJob[T], 64),
		collected: make(chan error, 1),
		buf:       make([]*kgo.Record, 0, decodeChunk),
	}
	for range max(2, runtime.GOMAXPROCS(0)) {
		pp.workers.Add(1)
		go pp.work()
	}
	go pp.collect(cancel, fn)
	return pp
}

func (pp *pipeline[T]) work() {
	defer pp.workers.Done()
	for j := range pp.jobs {
		vals := make([]T, 0, len(j.recs))
		var err error
		for _, r := range j.recs {
			v, derr := pp.decode(r)
			if derr != nil {
				err = derr
				break
			}
			vals = append(vals, v)
		}
		j.done <- decodeResult[T]{vals, err}
	}
}

// collect hands decoded chunks to fn in order. After a failure it cancels
// the read and drains what is still in flight.
func (pp *pipeline[T]) collect(cancel context.CancelFunc, fn func([]T) error) {
	var cerr error
	for j := range pp.ordered {
		res := <-j.done
		if cerr != nil {
			continue
		}
		if res.err == nil && len(res.vals) > 0 {
			res.err = fn(res.vals)
		}
		if res.err != nil {
			cerr = res.err
			cancel()
		}
	}
	pp.collected <- cerr
}

// add queues recs, submitting each full chunk.
func (pp *pipeline[T]) add(recs []*kgo.Record) error {
	for len(recs) > 0 {
		n := min(decodeChunk-len(pp.buf), len(recs))
		pp.buf = append(pp.buf, recs[:n]...)
		recs = recs[n:]
		if len(pp.buf) == decodeChunk {
			if err := pp.flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

// flush submits what is queued.
func (pp *pipeline[T]) flush() error {
	if len(pp.buf) == 0 {
		return nil
	}
	j := &decodeJob[T]{recs: pp.buf, done: make(chan decodeResult[T], 1)}
	pp.buf = make([]*kgo.Record, 0, decodeChunk)
	select {
	case pp.ordered <- j:
	case <-pp.ctx.Done():
		return pp.ctx.Err()
	}
	select {
	case pp.jobs <- j:
		return nil
	case <-pp.ctx.Done():
		// The collector waits for this job: answer it.
		j.done <- decodeResult[T]{err: pp.ctx.Err()}
		return pp.ctx.Err()
	}
}

// close stops the workers and the collector and returns the collector's
// first error.
func (pp *pipeline[T]) close() error {
	close(pp.jobs)
	pp.workers.Wait()
	close(pp.ordered)
	return <-pp.collected
}
