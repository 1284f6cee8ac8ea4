package kafka

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Partition names one partition of a topic.
type Partition struct {
	Topic     string
	Partition int32
}

func (p Partition) String() string { return fmt.Sprintf("%s/%d", p.Topic, p.Partition) }

// Bounds are where a partition's read stood when it started: the log's
// start offset and the end offset the read stops before (the last stable
// offset or the high watermark, see ReadSpec.HighWatermark).
type Bounds struct {
	Start, End int64
}

// ReadSpec says what ReadToEnd reads and how.
type ReadSpec struct {
	// Topics are the topics read: every partition of each, unless
	// Partitions picks.
	Topics []string
	// Partitions, when set, picks the partitions to read of a topic with n
	// partitions; naming one the topic lacks is an error.
	Partitions func(topic string, n int) []int32
	// From, when set, returns the offset a partition's read starts at,
	// given its bounds; its error ends the read before anything is fetched.
	// Default: the log's start. A start at or past the end reads nothing of
	// that partition; one below the log's start fails the read (offsets
	// are never reset).
	From func(p Partition, b Bounds) (int64, error)
	// HighWatermark reads up to the high watermark as of the start,
	// waiting for the transactions open then to end. Default: up to the
	// last stable offset, what read_committed reaches without waiting.
	HighWatermark bool
	// ClientID is appended to cfg's client id ("<id>-<ClientID>") to name
	// the reader's client.
	ClientID string
	// Timeout, when set, bounds the whole read, listing included.
	Timeout time.Duration
	// FetchMaxBytes, when set, bounds a fetch and each partition's share
	// of it; a large log reads faster with large fetches.
	FetchMaxBytes int32
}

// listTimeout bounds the listing of the bounds when ctx has no sooner
// deadline.
const listTimeout = 30 * time.Second

// ReadToEnd reads partitions from where spec says to the end offsets they
// had when it started, read_committed (aborted transactions never show),
// on a client of its own joining no group, and calls fn with each record
// that is not a control record, each partition's in log order. An error
// from fn ends the read. It returns the bounds of every partition read.
func ReadToEnd(ctx context.Context, cfg Config, spec ReadSpec, fn func(*kgo.Record) error) (map[Partition]Bounds, error) {
	return ReadBatches(ctx, cfg, spec, func(recs []*kgo.Record) error {
		for _, r := range recs {
			if err := fn(r); err != nil {
				return err
			}
		}
		return nil
	})
}

// ReadBatches is ReadToEnd calling fn once per partition per fetch, with
// that partition's records of the fetch (never empty, never control
// records, never past the end), from one goroutine. fn may keep recs.
func ReadBatches(ctx context.Context, cfg Config, spec ReadSpec, fn func(recs []*kgo.Record) error) (map[Partition]Bounds, error) {
	if spec.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, spec.Timeout)
		defer cancel()
	}
	cl, err := newReader(cfg, spec)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	bounds, from, err := listBounds(ctx, kadm.NewClient(cl), spec)
	if err != nil {
		return nil, err
	}
	if err := readLoop(ctx, cl, from, bounds, fn); err != nil {
		return nil, err
	}
	return bounds, nil
}

// newReader returns the read's client: read_committed; control records kept,
// so a transaction marker at the end of a partition still counts as
// reaching it; no offset reset, so a start below the log's is an error,
// not a silent skip.
func newReader(cfg Config, spec ReadSpec) (*kgo.Client, error) {
	if spec.ClientID != "" {
		cfg.ClientID = clientID(cfg) + "-" + spec.ClientID
	}
	opts := []kgo.Opt{
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
	}
	if spec.FetchMaxBytes > 0 {
		opts = append(opts, kgo.FetchMaxBytes(spec.FetchMaxBytes), kgo.FetchMaxPartitionBytes(spec.FetchMaxBytes))
	}
	return NewClient(cfg, KindReader, opts...)
}

// listBounds lists the start and end offsets of the topics once, picks the
// partitions and returns the bounds of each and where each starts.
func listBounds(ctx context.Context, adm *kadm.Client, spec ReadSpec) (map[Partition]Bounds, map[Partition]int64, error) {
	lctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	starts, err := adm.ListStartOffsets(lctx, spec.Topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list start offsets of %v (run `mailplane topics apply`): %w", spec.Topics, err)
	}
	list := adm.ListCommittedOffsets
	if spec.HighWatermark {
		list = adm.ListEndOffsets
	}
	ends, err := list(lctx, spec.Topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list end offsets of %v: %w", spec.Topics, err)
	}
	bounds, from := map[Partition]Bounds{}, map[Partition]int64{}
	for _, topic := range spec.Topics {
		if err := pickBounds(topic, starts, ends, spec, bounds, from); err != nil {
			return nil, nil, err
		}
	}
	return bounds, from, nil
}

// pickBounds adds the bounds of topic's picked partitions to bounds, and to
// from where each starts if it has records to read.
func pickBounds(topic string, starts, ends kadm.ListedOffsets, spec ReadSpec, bounds map[Partition]Bounds, from map[Partition]int64) error {
	n := len(ends[topic])
	if n == 0 {
		return fmt.Errorf("%s has no partitions (run `mailplane topics apply`)", topic)
	}
	parts := make([]int32, n)
	for i := range parts {
		parts[i] = int32(i)
	}
	if spec.Partitions != nil {
		parts = spec.Partitions(topic, n)
	}
	for _, part := range parts {
		s, okS := starts.Lookup(topic, part)
		e, okE := ends.Lookup(topic, part)
		if !okS || !okE {
			return fmt.Errorf("%s has no partition %d", topic, part)
		}
		p, b := Partition{topic, part}, Bounds{Start: s.Offset, End: e.Offset}
		bounds[p] = b
		at := b.Start
		if spec.From != nil {
			var err error
			if at, err = spec.From(p, b); err != nil {
				return err
			}
		}
		if at < b.End {
			from[p] = at
		}
	}
	return nil
}

// readLoop fetches the partitions of from, each from its offset to its end,
// handing fn each partition's records of each fetch.
func readLoop(ctx context.Context, cl *kgo.Client, from map[Partition]int64, bounds map[Partition]Bounds, fn func([]*kgo.Record) error) error {
	if len(from) == 0 {
		return nil
	}
	consume := map[string]map[int32]kgo.Offset{}
	for p, at := range from {
		if consume[p.Topic] == nil {
			consume[p.Topic] = map[int32]kgo.Offset{}
		}
		consume[p.Topic][p.Partition] = kgo.NewOffset().At(at)
	}
	cl.AddConsumePartitions(consume)
	left := maps.Clone(from) // partitions short of their end
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("read %v short of the end: %w", slices.SortedFunc(maps.Keys(left), Partition.compare), err)
		}
		if fs.IsClientClosed() {
			return kgo.ErrClientClosed
		}
		if err := fetchError(fs); err != nil {
			return err
		}
		var ferr error
		fs.EachPartition(func(ft kgo.FetchTopicPartition) {
			if ferr == nil {
				ferr = takePartition(ft, bounds, left, fn)
			}
		})
		if ferr != nil {
			return ferr
		}
	}
	return nil
}

func (p Partition) compare(q Partition) int {
	if c := cmp.Compare(p.Topic, q.Topic); c != 0 {
		return c
	}
	return cmp.Compare(p.Partition, q.Partition)
}

// fetchError returns the first error of a fetch, if any.
func fetchError(fs kgo.Fetches) error {
	var ferr error
	fs.EachError(func(topic string, part int32, err error) {
		if ferr == nil {
			ferr = fmt.Errorf("read %s/%d: %w", topic, part, err)
		}
	})
	return ferr
}

// takePartition hands fn the records of one partition's fetch below its
// end, control records left out, and marks the partition done once its
// last record before the end is seen.
func takePartition(ft kgo.FetchTopicPartition, bounds map[Partition]Bounds, left map[Partition]int64, fn func([]*kgo.Record) error) error {
	p := Partition{ft.Topic, ft.Partition}
	if _, ok := left[p]; !ok || len(ft.Records) == 0 {
		return nil
	}
	end := bounds[p].End
	recs := ft.Records
	if i, _ := slices.BinarySearchFunc(recs, end, func(r *kgo.Record, end int64) int { return cmp.Compare(r.Offset, end) }); i < len(recs) {
		recs = recs[:i]
	}
	if len(recs) == 0 || recs[len(recs)-1].Offset >= end-1 {
		delete(left, p)
	}
	if live := dropControl(recs); len(live) > 0 {
		if err := fn(live); err != nil {
			return err
		}
	}
	return nil
}

// dropControl returns recs without its control records, recs itself when
// it has none.
func dropControl(recs []*kgo.Record) []*kgo.Record {
	i := slices.IndexFunc(recs, func(r *kgo.Record) bool { return r.Attrs.IsControl() })
	if i < 0 {
		return recs
	}
	out := slices.Clone(recs[:i])
	for _, r := range recs[i+1:] {
		if !r.Attrs.IsControl() {
			out = append(out, r)
		}
	}
	return out
}

// FetchEnd is a fetched partition's end: its last stable offset when
// reading committed (what can be read now), else its high watermark. It
// is what a consumer's lag counts to.
func FetchEnd(fp kgo.FetchTopicPartition) int64 {
	if fp.LastStableOffset >= 0 {
		return fp.LastStableOffset
	}
	return fp.HighWatermark
}
