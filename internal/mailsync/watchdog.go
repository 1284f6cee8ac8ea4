package mailsync

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/mailplane/mailplane/domain"
)

// watchdog tracks when the group coordinator last answered this member.
//
// franz-go keeps a member's partitions assigned while its heartbeats go
// unanswered (each is retried for as long as the client's retry timeout),
// so the member can run its partitions for seconds after the coordinator
// expired its session and gave them to another (docs/architecture.md §14). The
// watchdog does not wait for franz-go: it sees every answered Heartbeat,
// JoinGroup and SyncGroup through a broker hook, and counts an answer from
// when its request was written, the latest moment the coordinator can have
// renewed the session from. If SessionTimeout - WatchdogMargin passes with
// no answer, every runner stops.
//
// The hook sees that an answer arrived, not its error code. An answer with
// an error still proves the coordinator was reachable; errors that mean
// "you are out" make franz-go call OnPartitionsLost, which stops the
// runners too. Resuming after a stop is stricter: it needs two heartbeats
// sent after the stop to be answered while the partition is still
// assigned. A heartbeat answered with an error ends the group session, and
// franz-go revokes or loses partitions before any heartbeat of the next
// session, so the second answer is proof enough.
//
// While a rebalance waits for a dead member, franz-go sits in JoinGroup and
// sends nothing the coordinator answers; the worker's probe (watchdog.probe)
// fills that silence with heartbeats of its own, counted only when the
// coordinator answers that it still holds the member.
//
// Its times are on the monotonic clock, not Config.Now: it races the
// coordinator's session timer, which runs on real time, against round
// trips franz-go measures in real time; a test clock that stands still or
// jumps must neither trip it nor keep it from confirming.
type watchdog struct {
	group     string
	limit     time.Duration // of silence: SessionTimeout - WatchdogMargin
	session   time.Duration
	heartbeat time.Duration
	disabled  bool
	log       *slog.Logger
	m         *metrics

	mu          sync.Mutex
	lastContact time.Time
	heartbeats  [8]time.Time // send times of the latest answered heartbeats
	next        int
	tripped     bool
	trippedAt   time.Time
}

func newWatchdog(cfg Config, log *slog.Logger, m *metrics) *watchdog {
	return &watchdog{group: cfg.Group, limit: cfg.SessionTimeout - cfg.WatchdogMargin, session: cfg.SessionTimeout, heartbeat: cfg.HeartbeatInterval,
		disabled: cfg.WatchdogMargin < 0, log: log, m: m}
}

// OnBrokerE2E implements kgo.HookBrokerE2E.
func (d *watchdog) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if e2e.Err() != nil {
		return
	}
	k := kmsg.Key(key)
	if k != kmsg.Heartbeat && k != kmsg.JoinGroup && k != kmsg.SyncGroup {
		return
	}
	sent := time.Now().Add(-e2e.DurationE2E())
	d.mu.Lock()
	defer d.mu.Unlock()
	if sent.After(d.lastContact) {
		d.lastContact = sent
	}
	if k == kmsg.Heartbeat {
		d.heartbeats[d.next] = sent
		d.next = (d.next + 1) % len(d.heartbeats)
	}
}

// silentFor returns how long ago the last answered request was sent.
func (d *watchdog) silentFor(now time.Time) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lastContact.IsZero() {
		return 0
	}
	return now.Sub(d.lastContact)
}

// confirmedSince reports whether at least two heartbeats sent after t were
// answered.
func (d *watchdog) confirmedSince(t time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, s := range d.heartbeats {
		if s.After(t) {
			n++
		}
	}
	return n >= 2
}

// lastWritesBy bounds the last writes of runners the watchdog stops
// (Job.LastWriteContext). The coordinator may expire the member's session
// from the last answered request's send time plus the session timeout;
// the watchdog trips a margin before that, and the runners get the first
// half of the margin for their last writes and the second to return, so
// that they are gone before another member can be given the partitions.
func (d *watchdog) lastWritesBy() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lastContact.IsZero() {
		return time.Time{} // never answered: no session to expire
	}
	return d.lastContact.Add(d.limit + (d.session-d.limit)/2)
}

func (d *watchdog) isTripped() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tripped
}

func (d *watchdog) trip(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tripped, d.trippedAt = true, now
}

// untripIfConfirmed clears the trip once the group answered twice since.
func (d *watchdog) untripIfConfirmed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.tripped {
		return false
	}
	n := 0
	for _, s := range d.heartbeats {
		if s.After(d.trippedAt) {
			n++
		}
	}
	if n < 2 {
		return false
	}
	d.tripped = false
	return true
}

// loop checks the coordinator's silence every tenth of a heartbeat
// interval (at least every 50ms); when it is too long while partitions are
// active, it trips and calls stopAll. Once the coordinator answers again it
// calls wake, so that the worker's housekeeping resumes the partitions.
func (d *watchdog) loop(ctx context.Context, active func() bool, stopAll func(reason string, by time.Time) int, wake func()) {
	if d.disabled {
		return
	}
	t := time.NewTicker(min(max(d.heartbeat/10, 10*time.Millisecond), 50*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		if d.untripIfConfirmed() {
			d.log.Info("watchdog: the group coordinator answers again; partitions resume once confirmed")
			wake()
		}
		silent := d.silentFor(now)
		if silent <= d.limit || d.isTripped() || !active() {
			continue
		}
		d.trip(now)
		d.m.watchdogStops.Inc()
		d.log.Warn("watchdog: no group request answered in time; stopping every runner", "silent_for", silent, "limit", d.limit)
		n := stopAll(domain.SyncSuspendedWatchdog, d.lastWritesBy())
		d.log.Warn("watchdog: runners stopped", "runners", n, "took", time.Since(now))
	}
}

// contact records an answer to a request sent at sent.
func (d *watchdog) contact(sent time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if sent.After(d.lastContact) {
		d.lastContact = sent
	}
}

// probe keeps the watchdog informed while franz-go sends nothing the
// coordinator answers: during a rebalance the member waits in JoinGroup for
// as long as the coordinator waits for every member — up to a dead member's
// session — and its heartbeats stop. Without the probe, survivors of a
// member's death that coincides with a join would stop their runners for
// nothing. The probe is a Heartbeat with the member's id and generation,
// sent on the worker's other client (whose answers the watchdog's hook does
// not see): the coordinator answers REBALANCE_IN_PROGRESS only while it
// still holds the member in the group, and no other member can be given
// the member's partitions before the member revokes them (cooperative
// protocol), so that answer is contact. Any other answer (unknown member,
// illegal generation) or none is not.
func (d *watchdog) probe(ctx context.Context, cl, out *kgo.Client) {
	if d.disabled {
		return
	}
	t := time.NewTicker(d.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Only when the group client has been silent for two heartbeats.
		if d.silentFor(time.Now()) < 2*d.heartbeat {
			continue
		}
		member, gen := cl.GroupMetadata()
		if member == "" || gen < 0 {
			continue
		}
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, d.heartbeat)
		resp, err := (&kmsg.HeartbeatRequest{Group: d.group, Generation: gen, MemberID: member}).RequestWith(rctx, out)
		cancel()
		if err != nil {
			continue
		}
		if resp.ErrorCode == kerr.RebalanceInProgress.Code {
			d.contact(sent)
			d.m.watchdogProbes.Inc()
		}
	}
}
