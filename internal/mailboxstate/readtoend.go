package mailboxstate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
)

// readTimeout bounds one read to the end, which may wait for transactions
// still open on the topic to end (at most their timeout).
const readTimeout = 2 * time.Minute

// readToEnd reads partitions of topic from their start to their high
// watermark as of the call, read-committed (so it sees every transaction
// that ended before and waits for those still open), on a client of its
// own, and calls fn for each record that is not a control record. pick
// chooses the partitions, given the topic's partition count. It returns how
// many records fn saw.
func (p *Processor) readToEnd(ctx context.Context, clientSuffix, topic string, pick func(partitions int) []int32, fn func(*kgo.Record)) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	cl, err := kgo.NewClient(append(kafka.ConnOptions(p.kcfg),
		kgo.ClientID(p.kcfg.ClientID+"-"+clientSuffix),
		kgo.RequestTimeoutOverhead(10*time.Second),
		kgo.RetryTimeout(30*time.Second),
		kgo.MetadataMinAge(250*time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.WithLogger(kgoLogger{p.log}),
	)...)
	if err != nil {
		return 0, fmt.Errorf("%s client: %w", clientSuffix, err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("list start offsets of %s (run `mailplane topics apply`): %w", topic, err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("list end offsets of %s: %w", topic, err)
	}
	if len(ends[topic]) == 0 {
		return 0, fmt.Errorf("%s has no partitions (run `mailplane topics apply`)", topic)
	}
	want := map[int32]int64{} // partition → offset of the last record to read
	offsets := map[int32]kgo.Offset{}
	for _, part := range pick(len(ends[topic])) {
		s, okS := starts.Lookup(topic, part)
		e, okE := ends.Lookup(topic, part)
		if !okS || !okE {
			return 0, fmt.Errorf("%s has no partition %d", topic, part)
		}
		if e.Offset > s.Offset {
			want[part] = e.Offset - 1
			offsets[part] = kgo.NewOffset().At(s.Offset)
		}
	}
	if len(want) > 0 {
		cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets})
	}
	n := 0
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("read %s partitions %v: %w", topic, keys(want), err)
		}
		var ferr error
		fs.EachError(func(_ string, part int32, err error) {
			if ferr == nil && !errors.Is(err, context.Canceled) {
				ferr = fmt.Errorf("read %s partition %d: %w", topic, part, err)
			}
		})
		if ferr != nil {
			return 0, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			last, ok := want[r.Partition]
			if !ok {
				return
			}
			if r.Offset <= last && !r.Attrs.IsControl() {
				fn(r)
				n++
			}
			if r.Offset >= last {
				delete(want, r.Partition)
			}
		})
	}
	return n, nil
}

// ReadLive returns every live mailbox of the mailbox.state topic, read from
// its start to its end as of the call (read-committed), by mailbox id.
// Records that do not decode are skipped and counted in bad. Operator
// commands use it (`mailplane credentials reseal`); the processor and the
// sync workers have their own readers.
func ReadLive(ctx context.Context, kcfg kafka.Config, topic string, log *slog.Logger) (live map[string]domain.MailboxStateRecord, bad int, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Processor{kcfg: kcfg, log: log}
	live = map[string]domain.MailboxStateRecord{}
	all := func(n int) []int32 {
		ps := make([]int32, n)
		for i := range ps {
			ps[i] = int32(i)
		}
		return ps
	}
	_, err = p.readToEnd(ctx, "read-live", topic, all, func(r *kgo.Record) {
		m, ok, err := Decode(r)
		switch {
		case err != nil:
			bad++
		case !ok:
			delete(live, m.MailboxID)
		default:
			live[m.MailboxID] = m
		}
	})
	if err != nil {
		return nil, 0, err
	}
	return live, bad, nil
}
