package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Querier runs queries; pgx.Tx, *pgx.Conn and *pgxpool.Pool are ones.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// The invariants of docs/architecture.md §8 that the placement projection's
// rows can show, written independently of the fold.
const (
	// Invariant 3: a mailbox sits only on a worker of its org's tier (free
	// orgs on shared_free, paid ones on shared_premium or their own
	// dedicated worker) and, on a shared worker, of its band's pool.
	invariant3SQL = `
SELECT m.mailbox_id::text, m.org_id::text, w.worker_id::text, w.tier, w.pool, COALESCE(w.dedicated_org::text, ''), m.band,
       COALESCE(c.class, 'free')
FROM placement_mailboxes m
JOIN placement_workers w ON w.worker_id = m.worker_id
LEFT JOIN placement_org_classes c ON c.org_id = m.org_id
WHERE NOT CASE w.tier
    WHEN 'shared_free'    THEN COALESCE(c.class, 'free') = 'free' AND w.pool = m.band
    WHEN 'shared_premium' THEN COALESCE(c.class, 'free') <> 'free' AND w.pool = m.band
    WHEN 'dedicated'      THEN COALESCE(c.class, 'free') <> 'free' AND w.dedicated_org = m.org_id
    ELSE false END
ORDER BY m.mailbox_id
LIMIT 20`
	// Invariant 4: a worker's load is the sum of its mailboxes' weights
	// (and its count their number); no mailbox sits on an unknown worker.
	invariant4SQL = `
SELECT w.worker_id::text, w.load_milli, COALESCE(s.load, 0), w.mailboxes, COALESCE(s.n, 0)
FROM placement_workers w
LEFT JOIN (SELECT worker_id, sum(weight_milli) AS load, count(*) AS n
           FROM placement_mailboxes WHERE worker_id IS NOT NULL GROUP BY worker_id) s ON s.worker_id = w.worker_id
WHERE w.load_milli <> COALESCE(s.load, 0) OR w.mailboxes <> COALESCE(s.n, 0)
UNION ALL
SELECT m.worker_id::text, -1, m.weight_milli, -1, 1
FROM placement_mailboxes m
WHERE m.worker_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM placement_workers w WHERE w.worker_id = m.worker_id)
ORDER BY 1
LIMIT 20`
	// A dead worker carries nothing (its mailboxes moved or were refused
	// when it died), which is also what lets the engine forget it.
	deadIdleSQL = `
SELECT worker_id::text, mailboxes, load_milli
FROM placement_workers
WHERE NOT live AND (mailboxes <> 0 OR load_milli <> 0)
ORDER BY 1
LIMIT 20`
)

// CheckInvariants checks invariants 3 and 4 on the placement
// projection's rows, and that dead workers carry nothing, and returns
// every violation found (at most 20 of each kind), or nil. Run it in one snapshot (a repeatable-read
// transaction) when the projector may be writing. The rows hold the
// invariants at every checkpoint that ends an input's decisions (the
// engine's transactions do), not necessarily in the middle of one.
func CheckInvariants(ctx context.Context, q Querier) error {
	var errs []error
	rows, _ := q.Query(ctx, invariant3SQL)
	var mb, org, w, tier, pool, dorg, band, class string
	_, err := pgx.ForEachRow(rows, []any{&mb, &org, &w, &tier, &pool, &dorg, &band, &class}, func() error {
		errs = append(errs, fmt.Errorf("invariant 3: mailbox %s (org %s, class %s, band %s) on worker %s (%s, pool %s, org %q)",
			mb, org, class, band, w, tier, pool, dorg))
		return nil
	})
	if err != nil {
		return fmt.Errorf("placement invariants: %w", err)
	}
	rows, _ = q.Query(ctx, invariant4SQL)
	var load, sum, n, count int64
	_, err = pgx.ForEachRow(rows, []any{&w, &load, &sum, &n, &count}, func() error {
		if load < 0 {
			errs = append(errs, fmt.Errorf("invariant 4: a mailbox of weight %d sits on unknown worker %s", sum, w))
		} else {
			errs = append(errs, fmt.Errorf("invariant 4: worker %s has load %d and %d mailboxes; its mailboxes weigh %d and number %d",
				w, load, n, sum, count))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("placement invariants: %w", err)
	}
	rows, _ = q.Query(ctx, deadIdleSQL)
	_, err = pgx.ForEachRow(rows, []any{&w, &n, &load}, func() error {
		errs = append(errs, fmt.Errorf("dead worker %s carries %d mailboxes (load %d)", w, n, load))
		return nil
	})
	if err != nil {
		return fmt.Errorf("placement invariants: %w", err)
	}
	return errors.Join(errs...)
}
