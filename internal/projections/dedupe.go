package projections

// The dedupe window, how long applied_events remembers an event id, is
// internal/applyonce's rule (prune.go there); the projector prunes on its
// own clock, when Run starts and every window/16 after.

import (
	"context"
	"fmt"
	"time"

	"github.com/mailplane/mailplane/internal/applyonce"
)

// DefaultDedupeWindow is how long a projector remembers an applied event's
// id unless WithDedupeWindow says otherwise: the window of mailbox.state's
// processor (internal/mailboxstate), for the same producers.
const DefaultDedupeWindow = 7 * 24 * time.Hour

// pruneTimeout bounds one prune run by the projector.
const pruneTimeout = 10 * time.Minute

// WithDedupeWindow sets how long applied event ids are remembered (see
// the window rule in internal/applyonce). Zero or less keeps the default.
func WithDedupeWindow(d time.Duration) Option { return func(c *config) { c.dedupeWindow = d } }

// pruneEvery is how often Run prunes: a sixteenth of the window.
func (c *config) pruneEvery() time.Duration { return max(c.dedupeWindow/16, time.Millisecond) }

// pruneSlack is how long before a mark an id must have been applied to be
// pruned with it: a transaction stamped then has committed by the mark.
func (c *config) pruneSlack() time.Duration { return 2 * c.txTimeout }

// Pruned is what one prune did.
type Pruned = applyonce.Pruned

// Prune marks where the projector's partitions stand and forgets the event
// ids applied more than the dedupe window ago, raising the partitions'
// floors first (internal/applyonce). Run prunes by itself; Prune is
// for tools and tests. It is safe while the projector runs, from any
// member: one prunes at a time, the others skip.
func (p *Projector) Prune(ctx context.Context) (Pruned, error) {
	res, err := p.prune(ctx)
	if err != nil {
		return res, fmt.Errorf("projections: prune %s: %w", p.name, err)
	}
	return res, nil
}

func (p *Projector) prune(ctx context.Context) (Pruned, error) {
	return applyonce.Prune(ctx, p.pool, applyonce.Window{
		Projector: p.name, Window: p.cfg.dedupeWindow, Slack: p.cfg.pruneSlack(), Now: p.cfg.now(), Logger: p.log,
		Deleted: func(n int64) { p.m.pruned.WithLabelValues(p.name).Add(float64(n)) },
	})
}

// pruneLoop prunes when Run starts and every pruneEvery until ctx is done.
func (p *Projector) pruneLoop(ctx context.Context) {
	t := time.NewTicker(p.cfg.pruneEvery())
	defer t.Stop()
	for {
		// Bounded, so a connection that hangs cannot stop the pruning; a
		// prune cut short leaves its ids to the next.
		pctx, cancel := context.WithTimeout(ctx, pruneTimeout)
		res, err := p.Prune(pctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			p.log.Warn("pruning applied event ids failed; trying again later", "err", err)
		case res.IDs > 0:
			p.log.Info("pruned applied event ids", "ids", res.IDs, "applied_before", res.Before)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ErrBelowFloor is returned by Seek for a position below the partition's
// forgotten_below (applyonce.ErrBelowFloor).
var ErrBelowFloor = applyonce.ErrBelowFloor
