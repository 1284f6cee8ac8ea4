package mailsync_test

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/mailsync"
)

// Example wires what `mailplane sync` (and dev mode) runs: the
// mailbox.state processor and a sync worker. Each Run blocks until ctx is
// done; a command runs them side by side.
func Example() {
	ctx := context.Background()
	brokers := []string{"127.0.0.1:19092"}
	reg := prometheus.NewRegistry()
	log := slog.Default()
	pool, err := pgxpool.New(ctx, "postgres://...") // migrated schema
	if err != nil {
		return
	}

	// One processor per deployment (a fixed transactional id fences a
	// zombie predecessor).
	proc, err := mailboxstate.New(kafka.Config{Brokers: brokers, ClientID: "mailplane-mailbox-state", Registerer: reg},
		mailboxstate.WithLogger(log), mailboxstate.WithRegisterer(reg))
	if err != nil {
		return
	}
	go func() { _ = proc.Run(ctx) }()

	// Any number of workers, each with its own id.
	cfg := mailsync.DefaultConfig()
	cfg.WorkerID = "sync-1"                 // MAILPLANE_SYNC_WORKER_ID
	cfg.PollWarm = 2 * time.Minute          // MAILPLANE_POLL_WARM
	cfg.PollCold = 30 * time.Minute         // MAILPLANE_POLL_COLD
	cfg.TierSessionGrace = 15 * time.Minute // MAILPLANE_TIER_SESSION_GRACE
	cfg.TierHotActivity = 2 * time.Hour     // MAILPLANE_TIER_HOT_ACTIVITY
	cfg.TierColdAfter = 7 * 24 * time.Hour  // MAILPLANE_TIER_COLD_AFTER
	cfg.HotBudgetPerWorker = 2000           // MAILPLANE_HOT_BUDGET_PER_WORKER
	cfg.Logger, cfg.Registerer = log, reg
	// Each worker runs an outbox relay (tier records and sync.audit events
	// go through the outbox) unless the process runs one for all of them:
	// cfg.NoOutboxRelay = true
	w, err := mailsync.New(kafka.Config{Brokers: brokers, Registerer: reg}, pool, &mailsync.RecordingRunner{Beat: 30 * time.Second}, cfg)
	if err != nil {
		return
	}
	_ = w.Run(ctx)
}
