package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
)

// Handler handles one poll's batch. See the package doc.
type Handler func(ctx context.Context, b *Batch) error

// Middleware wraps a Handler with a policy.
type Middleware func(Handler) Handler

// Consumer is one consumer member: a client of its source, its handler
// wrapped in its policies. Create it with New, run it once with Run.
type Consumer struct {
	name string
	src  Source
	cfg  config
	log  *slog.Logger
	m    *metrics
	h    Handler

	cl   *kgo.Client
	sess *kgo.GroupTransactSession

	mu      sync.Mutex
	cancel  context.CancelFunc // ends the poll in progress
	woken   bool               // Wake was called outside a poll
	started bool
	left    sync.Once
	// meterMu guards ms, what the meter may hear of (meter.go).
	meterMu sync.Mutex
	ms      meterState
	// ready is closed when New returns: partition callbacks wait for it,
	// so they see the consumer whole.
	ready chan struct{}
}

// New returns the consumer name (its metrics label and log attribute) of
// src, built with the Kafka kit on kcfg, handling batches with h under
// opts. The client is created here (a group client starts joining); Run
// polls it, and Run or Close closes it.
func New(kcfg kafka.Config, name string, src Source, h Handler, opts ...Option) (*Consumer, error) {
	if h == nil || name == "" {
		return nil, errors.New("consume: New needs a name and a handler")
	}
	if err := src.validate(); err != nil {
		return nil, err
	}
	cfg := config{now: time.Now, leaveWithin: DefaultLeaveWithin}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.reg == nil {
		cfg.reg = prometheus.NewRegistry()
	}
	c := &Consumer{name: name, src: src, cfg: cfg, log: cfg.logger.With("consumer", name), m: newMetrics(cfg.reg, name), ready: make(chan struct{})}
	defer close(c.ready)
	c.h = c.wrap(h)
	if err := c.connect(kcfg); err != nil {
		return nil, fmt.Errorf("consume %s: %w", name, err)
	}
	return c, nil
}

// Name returns the consumer's name.
func (c *Consumer) Name() string { return c.name }

// Client returns the consumer's client (for a TransactGroup, the
// session's).
func (c *Consumer) Client() *kgo.Client { return c.cl }

// Session returns the transactional session of a TransactGroup consumer,
// nil for other sources.
func (c *Consumer) Session() *kgo.GroupTransactSession { return c.sess }

// Run polls and handles until ctx is done (it returns nil) or the handler
// or a fetch error policy fails (it returns that error); either way it
// leaves the group within the LeaveWithin bound first. A Consumer runs
// once.
func (c *Consumer) Run(ctx context.Context) error {
	c.mu.Lock()
	started := c.started
	c.started = true
	c.mu.Unlock()
	if started {
		return errors.New("consume: " + c.name + " already ran")
	}
	err := c.loop(ctx)
	c.leave()
	return err
}

// Close closes a consumer that will not be run (or leaves, as Run does at
// its end, if it is running: Run then ends with its poll's client closed).
func (c *Consumer) Close() { c.leave() }

func (c *Consumer) loop(ctx context.Context) error {
	for ctx.Err() == nil {
		fs := c.poll(ctx)
		if fs.IsClientClosed() {
			c.allowRebalance()
			return nil
		}
		if ctx.Err() != nil {
			// Nothing handled: the records are polled again by
			// whoever owns their partitions next.
			c.allowRebalance()
			return nil
		}
		if err := c.fetchErrors(fs); err != nil {
			c.allowRebalance()
			return err
		}
		b := &Batch{Records: fs.Records(), Fetches: fs, Polled: c.cfg.now(), c: c}
		c.m.records.Add(float64(len(b.Records)))
		err := c.h(ctx, b)
		c.allowRebalance()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			c.m.handlerErrors.Inc()
			return err
		}
	}
	return nil
}

// poll polls once: up to the wait (none after a Wake), ended early by
// Wake or ctx.
func (c *Consumer) poll(ctx context.Context) kgo.Fetches {
	n := 0
	if c.cfg.maxRecords != nil {
		n = c.cfg.maxRecords()
	}
	wait := time.Duration(-1) // unbounded
	if c.cfg.wait != nil {
		wait = max(c.cfg.wait(), 0)
	}
	c.mu.Lock()
	if c.woken {
		wait, c.woken = 0, false
	}
	var pctx context.Context
	var cancel context.CancelFunc
	switch {
	case wait == 0:
		c.mu.Unlock()
		c.m.polls.Inc()
		// A nil context takes what the client has buffered and returns
		// (a canceled one would return nothing).
		//lint:ignore SA1012 kgo documents a nil context as "do not wait"
		return c.pollWith(nil, n)
	case wait < 0:
		pctx, cancel = context.WithCancel(ctx)
	default:
		pctx, cancel = context.WithTimeout(ctx, wait)
	}
	c.cancel = cancel
	c.mu.Unlock()
	c.m.polls.Inc()
	fs := c.pollWith(pctx, n)
	c.mu.Lock()
	c.cancel, c.woken = nil, false
	c.mu.Unlock()
	cancel()
	return fs
}

// pollWith polls the session or the client; a nil ctx does not wait.
func (c *Consumer) pollWith(ctx context.Context, n int) kgo.Fetches {
	if c.sess != nil {
		return c.sess.PollRecords(ctx, n)
	}
	return c.cl.PollRecords(ctx, n)
}

// Wake ends the poll in progress early, or, between polls, makes the next
// poll take only what is buffered: the handler runs again soon (a tick
// became due, housekeeping is needed).
func (c *Consumer) Wake() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.woken = true
	if c.cancel != nil {
		c.cancel()
	}
}

// PollBuffered takes up to n records the client has buffered (all when n
// is 0) without waiting, for a handler that takes more within its call
// (the projectors' lanes). The policies do not see them.
func (c *Consumer) PollBuffered(n int) kgo.Fetches {
	//lint:ignore SA1012 kgo documents a nil context as "do not wait"
	return c.pollWith(nil, n)
}

// Pause stops fetching partitions (backpressure: records that cannot be
// applied now stop piling up); what is buffered of them is dropped and
// fetched again on Resume.
func (c *Consumer) Pause(partitions map[string][]int32) { c.cl.PauseFetchPartitions(partitions) }

// Resume fetches paused partitions again.
func (c *Consumer) Resume(partitions map[string][]int32) { c.cl.ResumeFetchPartitions(partitions) }

func (c *Consumer) allowRebalance() {
	if c.src.kind == kindGroup {
		c.cl.AllowRebalance()
	}
}

// fetchErrors applies the fetch-error policy to a poll's errors.
func (c *Consumer) fetchErrors(fs kgo.Fetches) error {
	var first error
	fs.EachError(func(topic string, partition int32, err error) {
		if first != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return
		}
		c.m.fetchErrors.Inc()
		if c.cfg.fetchErr != nil {
			first = c.cfg.fetchErr(topic, partition, err)
			return
		}
		c.log.Warn("fetch error", "topic", topic, "partition", partition, "err", err)
	})
	return first
}

// leave runs the BeforeLeave hooks, closes the client (leaving the group)
// within the bound and forgets the meter's partitions. It runs once.
func (c *Consumer) leave() {
	c.left.Do(func() {
		for _, fn := range c.cfg.beforeLeave {
			fn()
		}
		closeFn := c.cl.Close
		switch {
		case c.sess != nil:
			closeFn = c.sess.Close
		case c.src.kind == kindGroup:
			// The revoke in the leave must not wait on a poll gate
			// nobody will open again.
			closeFn = c.cl.CloseAllowingRebalance
		}
		if !kafka.CloseWithin(c.cfg.leaveWithin, closeFn) {
			c.m.leaveTimeouts.Inc()
			c.log.Warn("leaving did not finish in time; the group expires the member instead", "waited", c.cfg.leaveWithin)
		}
		c.forgetAll()
	})
}
