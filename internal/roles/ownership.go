package roles

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/ownership"
)

// ownershipBackfillRetry is how long the api role waits before trying
// the claims' backfill again: 30 s, half jittered, as the api processes
// of a deployment may all be retrying it.
var ownershipBackfillRetry = backoff.Policy{Floor: 30 * time.Second, Cap: 30 * time.Second, Jitter: backoff.Half}

// backfillOwnership is a role of the api process: on a database whose
// claims were never backfilled (an installation upgraded to ownership),
// it backfills them from the log (`mailplane ownership backfill` does
// the same by hand), retrying on failure, then waits for the end. Until
// it is done the API answers 503 to mailbox events (docs/runbook.md,
// "Mailbox and org owners"). Several api processes may run it at once:
// it writes only missing claims.
func (p *process) backfillOwnership(store *ownership.Store, log *slog.Logger) func(context.Context) error {
	return func(ctx context.Context) error {
		b := backoff.New(ownershipBackfillRetry, nil)
		for {
			err := p.backfillOwnershipOnce(ctx, store, log)
			if err == nil {
				<-ctx.Done()
				return nil
			}
			wait := b.Next()
			if ctx.Err() == nil {
				log.Warn("ownership backfill failed; mailbox events get 503 until it is done; retrying", "in", wait, "err", err)
			}
			if backoff.Sleep(ctx, wait) != nil {
				return nil
			}
		}
	}
}

func (p *process) backfillOwnershipOnce(ctx context.Context, store *ownership.Store, log *slog.Logger) error {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	done, err := store.Backfilled(qctx)
	cancel()
	if err != nil || done {
		return err
	}
	var tenants []string
	if p.rc.tokensFile != "" {
		b, err := os.ReadFile(p.rc.tokensFile)
		if err != nil {
			return err
		}
		callers, _, err := access.Parse(b)
		if err != nil {
			return err
		}
		for _, c := range callers {
			tenants = append(tenants, c.Source)
		}
	}
	log.Info("ownership: backfilling the claims of what is on the log")
	rep, err := ownership.Backfill(ctx, p.kcfg("ownership-backfill"), store, tenants)
	if err != nil {
		return err
	}
	log.Info("ownership: claims backfilled", "mailboxes", rep.Mailboxes, "orgs", rep.Orgs, "written", rep.Written,
		"unmapped_sources", len(rep.Unmapped), "unmapped_claims", rep.UnmappedClaims)
	return nil
}
