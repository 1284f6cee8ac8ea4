package mailsync

import (
	"context"
	"errors"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// Runner syncs mailboxes. The worker calls Run once per mailbox it runs,
// on its own goroutine, and cancels ctx to stop it: when the mailbox is
// removed or disabled, its record changes, the partition is revoked or lost,
// or the watchdog fires.
//
// Run must return promptly once ctx is done (well within a second): the
// worker waits for it before it lets another worker take the partition. It
// may make a last write on the way out (a cursor flush) under
// Job.LastWriteContext; that write is fenced like any other.
//
// An error return (other than ctx's) is logged, reported to sync.audit
// (truncated; it must never carry a credential), and Run is called again
// after a backoff with jitter. A return wrapping
// ErrFenced means the partition has a newer owner: the worker stops every
// runner of the partition and does not restart them unless the group
// confirms it still owns the partition.
type Runner interface {
	Run(ctx context.Context, job *Job) error
}

// RunnerFunc adapts a function to Runner.
type RunnerFunc func(ctx context.Context, job *Job) error

// Run calls f.
func (f RunnerFunc) Run(ctx context.Context, job *Job) error { return f(ctx, job) }

// Job is one mailbox handed to a runner: what to sync, under which epoch,
// and the channels back to the worker. It is valid until Run returns; a
// changed mailbox record is a new Job (the runner is restarted).
type Job struct {
	// Mailbox is the mailbox's mailbox.state record.
	Mailbox domain.MailboxStateRecord
	// Partition and Epoch are the ownership the runner works under; Owner
	// is the worker's id.
	Partition int32
	Epoch     int64
	Owner     string
	// Writer makes the runner's writes, each conditional on Epoch.
	Writer Writer
	// PollWarm and PollCold are the configured poll intervals.
	PollWarm time.Duration
	PollCold time.Duration

	box    *tierBox
	pacer  *hostPacer
	polls  *HostSlots
	report func(newest time.Time, known bool)
}

// Tier returns the mailbox's current tier and a channel closed at its next
// change. The tier changes while the runner runs (a user.active promotes to
// hot at once); a runner selects on the channel and calls Tier again.
func (j *Job) Tier() (domain.SyncTier, <-chan struct{}) { return j.box.get() }

// PollInterval is how often a runner in tier t polls: INBOX and the
// special-use folders for warm and cold; the special-use folders alongside
// IDLE for hot.
func (j *Job) PollInterval(t domain.SyncTier) time.Duration {
	if t == domain.SyncTierCold {
		return j.PollCold
	}
	return j.PollWarm
}

// PaceConnect waits for the mailbox's IMAP host's connection pacing; call
// it before every connection setup.
func (j *Job) PaceConnect(ctx context.Context) error {
	if j.pacer == nil {
		return ctx.Err()
	}
	return j.pacer.wait(ctx, j.Mailbox.IMAP.Host)
}

// PollSlot waits for one of the worker's poll slots of the mailbox's IMAP
// host (Config.PollsInFlight) and returns its release. A warm or cold poll
// holds one from before it reads its cursors until its connection is
// closed, so that a worker never holds more poll connections open on a
// host than it can finish; a hot mailbox's long-lived IDLE connection takes
// none. Call release once the poll's connection is closed; calling it again
// does nothing.
func (j *Job) PollSlot(ctx context.Context) (release func(), err error) {
	return j.polls.Acquire(ctx, j.Mailbox.IMAP.Host)
}

// ReportNewestMail tells the worker the internal date of the newest message
// the runner has seen; recent mail keeps a mailbox hot.
func (j *Job) ReportNewestMail(t time.Time) {
	if j.report != nil {
		j.report(t, true)
	}
}

// ReportNoMail tells the worker the mailbox holds no mail at all.
func (j *Job) ReportNoMail() {
	if j.report != nil {
		j.report(time.Time{}, true)
	}
}

// LastWriteTimeout bounds a runner's last write once it was stopped (see
// Job.LastWriteContext).
const LastWriteTimeout = 2 * time.Second

// stopCause is why a runner's context was cancelled, and until when its
// last write may run. The watchdog stops runners when the coordinator may
// expire the member's session soon; a write still running when it has
// would be refused by the fence at best, so the watchdog bounds last
// writes to end well before the coordinator can give the partition away
// (watchdog.lastWritesBy). A fenced partition bounds them by now: another
// worker owns it.
type stopCause struct {
	by time.Time // zero: only LastWriteTimeout
}

func (c *stopCause) Error() string { return "mailsync: runner stopped" }

// LastWriteContext returns the context for a runner's last write after ctx
// (Run's) is done: not cancelled with ctx, at most LastWriteTimeout long,
// and ending when the worker's ownership may end, if the worker said when.
// Before ctx is done it returns a child of ctx.
func (j *Job) LastWriteContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() == nil {
		return context.WithCancel(ctx)
	}
	by := time.Now().Add(LastWriteTimeout)
	var c *stopCause
	if errors.As(context.Cause(ctx), &c) && !c.by.IsZero() && c.by.Before(by) {
		by = c.by
	}
	return context.WithDeadline(context.WithoutCancel(ctx), by)
}

// NewJob builds a Job for tests of runners outside a worker: a fixed tier
// (changed through the returned setter), no pacing, and reports passed to
// report (may be nil).
func NewJob(m domain.MailboxStateRecord, partition int32, epoch int64, owner string, w Writer, tier domain.SyncTier, report func(newest time.Time, known bool)) (*Job, func(domain.SyncTier)) {
	box := newTierBox(tier, domain.SyncReasonDefault)
	d := DefaultConfig()
	j := &Job{Mailbox: m, Partition: partition, Epoch: epoch, Owner: owner, Writer: w,
		PollWarm: d.PollWarm, PollCold: d.PollCold, box: box, report: report}
	return j, func(t domain.SyncTier) { box.set(t, "test") }
}
