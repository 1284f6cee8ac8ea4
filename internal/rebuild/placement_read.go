package rebuild

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/topics"
)

// readFetchBytes sizes the rebuild's fetches: a large log reads faster in
// large ones.
const readFetchBytes = 64 << 20

// readParallel reads the decision log from offset from to its last stable
// offset as of the call, like engine.ReadDecisions (read_committed,
// markers skipped, no offset reset: a log that does not reach back to
// from is engine.ErrLogGap), but decodes on several goroutines
// (kafka.ReadDecoded): decoding (JSON and validation) is most of a
// rebuild's Go work. Chunks of decisions reach out in log order; out is
// closed when the read ends. It returns the end offset.
func readParallel(ctx context.Context, kcfg kafka.Config, from int64, out chan<- []postgres.Record) (int64, error) {
	defer close(out)
	log := kafka.Partition{Topic: kcfg.Topic(topics.PlacementDecisions), Partition: 0}
	spec := kafka.ReadSpec{
		Topics:     []string{log.Topic},
		Partitions: func(string, int) []int32 { return []int32{log.Partition} },
		From: func(_ kafka.Partition, b kafka.Bounds) (int64, error) {
			if from > b.End || from < b.Start {
				return 0, fmt.Errorf("%w: offset %d is outside the log [%d, %d)", engine.ErrLogGap, from, b.Start, b.End)
			}
			return from, nil
		},
		FetchMaxBytes: readFetchBytes,
	}
	decode := func(r *kgo.Record) (postgres.Record, error) {
		d, err := topics.DecodeDecision(r)
		if err != nil {
			return postgres.Record{}, fmt.Errorf("rebuild: decision at offset %d: %w", r.Offset, err)
		}
		return postgres.Record{Offset: r.Offset, Decision: d}, nil
	}
	bounds, err := kafka.ReadDecoded(ctx, kcfg, spec, decode, func(ds []postgres.Record) error {
		select {
		case out <- ds:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if err != nil {
		return 0, fmt.Errorf("rebuild: reading the decision log: %w", err)
	}
	return bounds[log].End, nil
}
