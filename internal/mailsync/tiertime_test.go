package mailsync_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailsync"
)

// settableClock is a tier clock the test moves.
type settableClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *settableClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *settableClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestFutureUserActiveDoesNotKeepSessionHot: a user.active dated 2099 (its
// event time and its record timestamp, as a producer writing straight to
// the topic can) counts as activity at the worker's clock: it puts the
// user in session now, and the session ends after the grace like any
// other, so the mailbox (old mail) goes back to warm.
func TestFutureUserActiveDoesNotKeepSessionHot(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	f := newFixture(33)
	start := time.Now()
	clock := &settableClock{now: start}
	user := f.uuid()
	mb := f.mailbox(user, time.Hour)
	rec := &mailsync.RecordingRunner{NewestMail: func(domain.MailboxStateRecord) (time.Time, bool) {
		return start.Add(-3 * time.Hour), true // too old to be hot by itself
	}}
	cfg := testConfig(t, "session-clock")
	cfg.Now = clock.Now
	cfg.TierEvaluateEvery = 200 * time.Millisecond
	cfg.TierSessionGrace = 15 * time.Minute
	e.produce(userActive(t, user, time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)))
	e.start(cfg, rec)
	e.produce(stateRecords(t, mb)...)
	waitFor(t, 15*time.Second, "the session's mailbox hot", func() (bool, string) {
		got := rec.Running()[mb.MailboxID].Tier
		return got == domain.SyncTierHot, fmt.Sprintf("tier %q", got)
	})

	clock.Add(cfg.TierSessionGrace + time.Minute)
	waitFor(t, 15*time.Second, "the session over, the mailbox warm", func() (bool, string) {
		got := rec.Running()[mb.MailboxID].Tier
		return got == domain.SyncTierWarm, fmt.Sprintf("tier %q", got)
	})
}
