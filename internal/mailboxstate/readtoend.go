package mailboxstate

import (
	"context"
	"fmt"
	"log/slog"
	"time"

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
	spec := kafka.ReadSpec{
		Topics:        []string{topic},
		Partitions:    func(_ string, n int) []int32 { return pick(n) },
		HighWatermark: true,
		ClientID:      clientSuffix,
		Timeout:       readTimeout,
	}
	n := 0
	_, err := kafka.ReadToEnd(ctx, p.kcfg, spec, func(r *kgo.Record) error {
		fn(r)
		n++
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", clientSuffix, err)
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
	p := &Processor{kcfg: kcfg.WithLogger(log), log: log}
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
