package mailsync

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/mailplane/mailplane/internal/consume"
	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

// The worker as a member of the sync consumer (internal/sla): each owned
// mailbox.state partition's lag goes to the meter, and its position to
// the group's committed offsets, where Console and rpk look. Nothing reads
// those offsets back: a new owner reads the compacted partition from its
// start (fromStart).

// commitEvery is how often the positions are committed to the group.
const commitEvery = 5 * time.Second

// measureLocked reports p's position to the runtime's meter (c is the
// group consumer; the runtime forgets revoked and lost partitions). While
// p loads, the records before its end are history being replayed: they
// count as behind, and the seconds behind run from when the worker saw it
// behind (not from their append times, which may be months old in a
// compacted topic).
func (w *Worker) measureLocked(c *consume.Consumer, p *partition) {
	next := max(p.nextOffset, p.startOffset)
	c.Position(w.kcfg.Topic(topics.MailboxState), p.id, sla.Position{Next: next, End: max(next, p.endOffset, p.fetchedEnd)})
}

// positionsLocked returns the live partitions' positions when they are
// due to be committed (every commitEvery), else nil.
func (w *Worker) positionsLocked(now time.Time) map[int32]kgo.EpochOffset {
	if now.Sub(w.lastCommit) < commitEvery {
		return nil
	}
	w.lastCommit = now
	offs := map[int32]kgo.EpochOffset{}
	for id, p := range w.parts {
		if _, live := w.own.live(id); live && p.nextOffset > 0 {
			offs[id] = kgo.EpochOffset{Epoch: -1, Offset: p.nextOffset}
		}
	}
	return offs
}

// commitPositions commits positions to the group without waiting for the
// answer.
func (w *Worker) commitPositions(offs map[int32]kgo.EpochOffset) {
	if len(offs) == 0 || w.cl == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), commitEvery)
	w.cl.CommitOffsets(ctx, map[string]map[int32]kgo.EpochOffset{w.kcfg.Topic(topics.MailboxState): offs},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) {
			cancel()
			if err != nil {
				w.log.Debug("committing positions to the group for lag tools failed", "err", err)
			}
		})
}

// fromStart makes every assigned partition be read from its start.
func fromStart(_ context.Context, assigned map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	out := make(map[string]map[int32]kgo.Offset, len(assigned))
	for t, ps := range assigned {
		out[t] = make(map[int32]kgo.Offset, len(ps))
		for p := range ps {
			out[t][p] = kgo.NewOffset().AtStart().WithEpoch(-1)
		}
	}
	return out, nil
}
