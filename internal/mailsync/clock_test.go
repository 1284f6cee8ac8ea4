package mailsync_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/topics"
)

// TestRecordsCarryTheInjectedClock: every time a worker records comes from
// Config.Now, here a clock standing years away from the wall clock: the
// sync.tier record's changed_at, the tier_changed, ownership_lost and
// sync.failed events' at, and the CloudEvent time of each. (An
// ownership_acquired event carries its epoch's acquired_at, the time
// Postgres recorded the epoch in the epoch history, and is left out.)
func TestRecordsCarryTheInjectedClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	at := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	mb := newFixture(77).mailbox("", time.Hour)
	// Mail a minute old by the clock: hot, a tier change to record.
	rec := &mailsync.RecordingRunner{NewestMail: func(domain.MailboxStateRecord) (time.Time, bool) {
		return at.Add(-time.Minute), true
	}}
	// The first run fails, for a sync.failed event.
	var failed atomic.Bool
	runner := mailsync.RunnerFunc(func(ctx context.Context, job *mailsync.Job) error {
		if failed.CompareAndSwap(false, true) {
			return errors.New("the first run fails")
		}
		return rec.Run(ctx, job)
	})
	cfg := testConfig(t, "fixed-clock")
	cfg.Now = func() time.Time { return at }
	cfg.TierEvaluateEvery = 200 * time.Millisecond
	cfg.RestartBackoff = 10 * time.Millisecond
	cfg.Registerer = prometheus.NewRegistry()
	kcfg := e.kcfg
	kcfg.ClientID = "sync-fixed-clock"
	w, err := mailsync.New(kcfg, e.db.Pool, runner, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	e.produce(stateRecords(t, mb)...)
	waitFor(t, 15*time.Second, "the mailbox hot", func() (bool, string) {
		got := rec.Running()[mb.MailboxID].Tier
		return got == domain.SyncTierHot, fmt.Sprintf("tier %q", got)
	})
	cancel() // the partition is revoked: ownership_lost
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the worker did not stop")
	}

	var audit []*kgo.Record
	waitFor(t, 15*time.Second, "the worker's records published", func() (bool, string) {
		types := map[string]int{}
		audit = readTopic(t, e, topics.SyncAudit)
		for _, r := range audit {
			typ, _ := topics.Header(r, topics.HeaderType)
			types[typ]++
		}
		return types[domain.TypeSyncTierChanged] >= 1 && types[domain.TypeSyncOwnershipLost] >= 1 && types[domain.TypeSyncFailed] >= 1,
			fmt.Sprintf("audit types %v", types)
	})
	tiers := readTopic(t, e, topics.SyncTier)
	if len(tiers) == 0 {
		t.Fatal("no sync.tier record")
	}
	for _, r := range append(tiers, audit...) {
		typ, _ := topics.Header(r, topics.HeaderType)
		if typ == domain.TypeSyncOwnershipAcquired {
			continue
		}
		ceTime, _ := topics.Header(r, topics.HeaderTime)
		if got, err := time.Parse(time.RFC3339Nano, ceTime); err != nil || !got.Equal(at) {
			t.Errorf("%s record's ce_time %q, want the clock's %s", typ, ceTime, at)
		}
		var data struct {
			At        time.Time `json:"at"`
			ChangedAt time.Time `json:"changed_at"`
		}
		if err := json.Unmarshal(r.Value, &data); err != nil {
			t.Fatal(err)
		}
		got := data.At
		if typ == domain.TypeSyncTierRecord {
			got = data.ChangedAt
		}
		if !got.Equal(at) {
			t.Errorf("%s record's time %s, want the clock's %s", typ, got, at)
		}
	}
}
