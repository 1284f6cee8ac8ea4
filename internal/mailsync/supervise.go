package mailsync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/backoff"
)

// supervisor runs one runner goroutine per mailbox it is told to start,
// restarts a runner that failed after a backoff with jitter, and lets the
// worker wait until every runner of some partitions has returned. It
// decides nothing about ownership: the worker starts a runner only in a
// live partition at its epoch (see ownership), and a runner's fenced write
// is handed back to the worker (fenced).
//
// Runs of one mailbox never overlap: a runner started while the previous
// one is still stopping waits for it first. Runners pace their connection
// setup per IMAP host through the supervisor's pacer (Job.PaceConnect).
type supervisor struct {
	runner Runner
	pacer  *hostPacer
	polls  *HostSlots
	log    *slog.Logger
	m      *metrics
	// restart paces the restarts of a failed runner: from
	// Config.RestartBackoff to RestartMaxBackoff, half jittered, so the
	// runners of one failing server do not come back together.
	restart backoff.Policy
	// failed reports a failed run (sync.failed); fenced, a run whose
	// write was refused at its epoch.
	failed func(job *Job, attempt int, err error)
	fenced func(partition int32, epoch int64)

	mu       sync.Mutex
	exited   *sync.Cond            // signalled when a runner goroutine exits
	runs     map[string]*runHandle // by mailbox id: running
	stopping map[string]*runHandle // stopped, maybe not yet returned
	alive    map[int32]int         // runner goroutines alive, by partition
	closing  bool                  // no more starts: the worker is leaving
}

type runHandle struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
	job    *Job
}

func newSupervisor(runner Runner, cfg Config, log *slog.Logger, m *metrics) *supervisor {
	s := &supervisor{runner: runner, pacer: newHostPacer(cfg.ConnectRatePerHost, cfg.ConnectBurstPerHost), polls: NewHostSlots(cfg.PollsInFlight),
		log: log, m: m, restart: backoff.Policy{Floor: cfg.RestartBackoff, Cap: cfg.RestartMaxBackoff, Jitter: backoff.Half},
		runs: map[string]*runHandle{}, stopping: map[string]*runHandle{}, alive: map[int32]int{}}
	s.exited = sync.NewCond(&s.mu)
	return s
}

// start runs job's mailbox unless it runs already or the worker is
// leaving; it reports whether a runner was started.
func (s *supervisor) start(job *Job) bool {
	job.pacer, job.polls = s.pacer, s.polls
	s.mu.Lock()
	defer s.mu.Unlock()
	id := job.Mailbox.MailboxID
	if s.closing || s.runs[id] != nil {
		return false
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	h := &runHandle{cancel: cancel, done: make(chan struct{}), job: job}
	s.runs[id] = h
	s.alive[job.Partition]++
	tier, _ := job.Tier()
	s.m.runners.WithLabelValues(string(tier)).Inc()
	var prev <-chan struct{}
	if p := s.stopping[id]; p != nil {
		prev = p.done
	}
	go s.runLoop(ctx, h, prev)
	return true
}

// stop cancels mailboxID's runner without waiting for it (wait says when
// it is gone); it reports whether one was running. Its last write
// (Job.LastWriteContext) has the usual LastWriteTimeout.
func (s *supervisor) stop(mailboxID string) bool {
	return s.stopBy(mailboxID, time.Time{})
}

// stopBy is stop with a bound on the runner's last write: by (zero: none)
// is when the partition may be someone else's (see stopCause).
func (s *supervisor) stopBy(mailboxID string, by time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.runs[mailboxID]
	if h == nil {
		return false
	}
	h.cancel(&stopCause{by: by})
	delete(s.runs, mailboxID)
	s.stopping[mailboxID] = h
	tier, _ := h.job.Tier()
	s.m.runners.WithLabelValues(string(tier)).Dec()
	return true
}

// running reports whether mailboxID's runner runs.
func (s *supervisor) running(mailboxID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[mailboxID] != nil
}

// retiered moves a running mailbox's runner between the tiers' gauges.
func (s *supervisor) retiered(mailboxID string, from, to domain.SyncTier) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runs[mailboxID] != nil {
		s.m.runners.WithLabelValues(string(from)).Dec()
		s.m.runners.WithLabelValues(string(to)).Inc()
	}
}

// aliveIn returns how many runner goroutines of partition are alive.
func (s *supervisor) aliveIn(partition int32) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.alive[partition]
}

// wait waits until no runner goroutine of partitions is alive. The caller
// must not hold the worker's lock: a runner on its way out may need it.
func (s *supervisor) wait(partitions []int32) {
	start := time.Now()
	warned := false
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		busy := 0
		for _, p := range partitions {
			busy += s.alive[p]
		}
		if busy == 0 {
			return
		}
		if !warned && time.Since(start) > 5*time.Second {
			warned = true
			s.log.Warn("runners are slow to stop", "running", busy)
		}
		s.exited.Wait()
	}
}

// close refuses further starts.
func (s *supervisor) close() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
}

// runLoop runs one mailbox until ctx is done, restarting a failed runner
// after a backoff.
func (s *supervisor) runLoop(ctx context.Context, h *runHandle, prev <-chan struct{}) {
	job := h.job
	id := job.Mailbox.MailboxID
	defer func() {
		s.mu.Lock()
		if s.alive[job.Partition]--; s.alive[job.Partition] <= 0 {
			delete(s.alive, job.Partition)
		}
		if s.stopping[id] == h {
			delete(s.stopping, id)
		}
		s.exited.Broadcast()
		s.mu.Unlock()
		close(h.done)
	}()
	if prev != nil {
		select {
		case <-prev:
		case <-ctx.Done():
			return
		}
	}
	b := backoff.New(s.restart, nil)
	for attempt := 1; ; attempt++ {
		err := s.safeRun(ctx, job)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrFenced) {
			s.log.Warn("a runner's write was fenced; stopping the partition's runners", "partition", job.Partition, "epoch", job.Epoch, "err", err)
			s.fenced(job.Partition, job.Epoch)
			return
		}
		if err == nil {
			err = errors.New("runner returned before it was stopped")
		}
		s.m.runnerFailures.Inc()
		s.log.Warn("runner failed; restarting after a backoff", "mailbox", id, "attempt", attempt, "err", err)
		s.failed(job, attempt, err)
		if backoff.Sleep(ctx, b.Next()) != nil {
			return
		}
	}
}

// safeRun calls the runner, turning a panic into an error: one mailbox's
// bug must not take every other mailbox of the worker down.
func (s *supervisor) safeRun(ctx context.Context, job *Job) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("runner panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return s.runner.Run(ctx, job)
}
