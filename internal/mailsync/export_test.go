package mailsync

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/outbox"
)

// WriteTierChange records that owner changed mailboxID's tier from one
// tier to another under epoch of partition, exactly as a worker's record
// loop does: the sync.tier record and the sync.audit tier_changed event,
// queued in the outbox in a transaction fenced on the epoch.
func WriteTierChange(ctx context.Context, f *Fence, partition int32, epoch int64, owner, mailboxID string, from, to domain.SyncTier, reason string) error {
	recs, err := tierRecords(owner, partition, epoch, mailboxID, from, to, reason, time.Now().UTC())
	if err != nil {
		return err
	}
	return f.writeRecords(ctx, partition, epoch, owner, mailboxID, recs)
}

// WriteTierChangeHolding is WriteTierChange calling hold inside the fenced
// transaction, after the records are queued and before the commit.
func WriteTierChangeHolding(ctx context.Context, f *Fence, partition int32, epoch int64, owner, mailboxID string, from, to domain.SyncTier, reason string, hold func()) error {
	recs, err := tierRecords(owner, partition, epoch, mailboxID, from, to, reason, time.Now().UTC())
	if err != nil {
		return err
	}
	return f.write(ctx, partition, epoch, owner, mailboxID, "tier", func(ctx context.Context, tx pgx.Tx) error {
		if err := outbox.Add(ctx, tx, recs...); err != nil {
			return err
		}
		hold()
		return nil
	})
}
