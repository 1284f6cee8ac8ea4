package mailsync

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/domain"
)

// RecordingRunner is a Runner that syncs nothing: it records what it is
// told (which mailboxes run, at which epoch, in which tier) and writes a row
// to sync_recorder_writes through its fenced writer when it starts, every
// Beat, and when it stops, so that fencing is observable. It stands in for
// the IMAP runner in dev mode and tests.
type RecordingRunner struct {
	// Beat is how often a running mailbox writes a beat row; 0: only the
	// start and stop rows.
	Beat time.Duration
	// NoWrites skips the database (measurements of the worker alone).
	NoWrites bool
	// NewestMail, when set, gives the newest-mail date to report at start
	// (ok false: report nothing, as a runner that has not synced yet).
	NewestMail func(m domain.MailboxStateRecord) (newest time.Time, ok bool)
	// OnTier, when set, is called with every tier the runner is told,
	// the starting one included.
	OnTier func(mailboxID string, t domain.SyncTier, at time.Time)

	mu       sync.Mutex
	running  map[string]*RunInfo
	starts   int
	stops    int
	overlaps int
	fenced   int
	lastStop time.Time
}

// RunInfo describes one running mailbox.
type RunInfo struct {
	MailboxID string
	UserID    string
	Partition int32
	Epoch     int64
	Owner     string
	StartTier domain.SyncTier
	Tier      domain.SyncTier
	Since     time.Time
}

// RecorderStats counts what a RecordingRunner saw.
type RecorderStats struct {
	Starts, Stops int
	// Overlaps counts runs that started while another run of the same
	// mailbox was still running in this process (never, if the worker is
	// right).
	Overlaps int
	// Fenced counts writes refused as stale.
	Fenced int
	// LastStop is when the latest run ended (zero: none has).
	LastStop time.Time
}

// Running returns the mailboxes running now.
func (r *RecordingRunner) Running() map[string]RunInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]RunInfo, len(r.running))
	for k, v := range r.running {
		out[k] = *v
	}
	return out
}

// RunningIDs returns the ids of the mailboxes running now.
func (r *RecordingRunner) RunningIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.running))
}

// Stats returns the counts so far.
func (r *RecordingRunner) Stats() RecorderStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return RecorderStats{Starts: r.starts, Stops: r.stops, Overlaps: r.overlaps, Fenced: r.fenced, LastStop: r.lastStop}
}

// Run records the job until ctx is done.
func (r *RecordingRunner) Run(ctx context.Context, job *Job) error {
	tier, changed := job.Tier()
	id := job.Mailbox.MailboxID
	info := r.begin(job, tier)
	defer r.end(info)
	if r.OnTier != nil {
		r.OnTier(id, tier, time.Now())
	}
	// Connection setup waits for the host's pacing; tier changes are
	// heard meanwhile.
	paced := make(chan error, 1)
	go func() { paced <- job.PaceConnect(ctx) }()
	var (
		ticker  *time.Ticker
		beat    <-chan time.Time // ticker's, once started
		started bool
	)
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	for {
		select {
		case err := <-paced:
			paced = nil
			if err != nil {
				continue // ctx is done
			}
			started = true
			if ticker, err = r.start(ctx, job, tier); err != nil {
				if ctx.Err() != nil {
					continue
				}
				return err
			}
			if ticker != nil {
				beat = ticker.C
			}
		case <-ctx.Done():
			if !started {
				return nil
			}
			// The last write on the way out, as a runner flushing its
			// cursor would: its own short deadline, fenced as ever.
			fctx, cancel := job.LastWriteContext(ctx)
			_ = r.write(fctx, job, "stop", tier)
			cancel()
			return nil
		case <-changed:
			tier, changed = job.Tier()
			r.mu.Lock()
			info.Tier = tier
			r.mu.Unlock()
			if r.OnTier != nil {
				r.OnTier(id, tier, time.Now())
			}
		case <-beat:
			if err := r.write(ctx, job, "beat", tier); err != nil {
				if ctx.Err() != nil {
					continue
				}
				return err
			}
		}
	}
}

// begin records that job's mailbox runs from now, in tier.
func (r *RecordingRunner) begin(job *Job, tier domain.SyncTier) *RunInfo {
	id := job.Mailbox.MailboxID
	info := &RunInfo{MailboxID: id, UserID: job.Mailbox.UserID, Partition: job.Partition, Epoch: job.Epoch,
		Owner: job.Owner, StartTier: tier, Tier: tier, Since: time.Now()}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == nil {
		r.running = map[string]*RunInfo{}
	}
	if _, dup := r.running[id]; dup {
		r.overlaps++
	}
	r.running[id] = info
	r.starts++
	return info
}

// end records that the run of info stopped.
func (r *RecordingRunner) end(info *RunInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running[info.MailboxID] == info {
		delete(r.running, info.MailboxID)
	}
	r.stops++
	r.lastStop = time.Now()
}

// start is the run's start once paced: the newest mail is reported, the
// start row written, and the beat ticker (nil: none) started.
func (r *RecordingRunner) start(ctx context.Context, job *Job, tier domain.SyncTier) (*time.Ticker, error) {
	if r.NewestMail != nil {
		if t, ok := r.NewestMail(job.Mailbox); ok {
			if t.IsZero() {
				job.ReportNoMail()
			} else {
				job.ReportNewestMail(t)
			}
		}
	}
	if err := r.write(ctx, job, "start", tier); err != nil {
		return nil, err
	}
	if r.Beat <= 0 || r.NoWrites {
		return nil, nil
	}
	return time.NewTicker(r.Beat), nil
}

func (r *RecordingRunner) write(ctx context.Context, job *Job, kind string, tier domain.SyncTier) error {
	if r.NoWrites || job.Writer == nil {
		return nil
	}
	err := job.Writer.Write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO sync_recorder_writes (mailbox_id, partition, epoch, owner, kind, tier)
            VALUES ($1, $2, $3, $4, $5, $6)`, job.Mailbox.MailboxID, job.Partition, job.Epoch, job.Owner, kind, string(tier))
		return err
	})
	if errors.Is(err, ErrFenced) {
		r.mu.Lock()
		r.fenced++
		r.mu.Unlock()
	}
	return err
}
