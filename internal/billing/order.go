package billing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Stripe does not order webhook deliveries: an event created before the one
// last applied for the same subscription may arrive after it. Applying it
// would undo the newer state (a downgrade to free after an upgrade). The
// webhook keeps, per subscription, the Stripe event last applied (created
// time, then event id for ties) in Postgres, and ignores older events: they
// are recorded in billing_stale_events, logged and answered 200, so Stripe
// stops retrying, and nothing is produced. The row is locked from the
// comparison until the produce is acknowledged and the row updated, so of
// two concurrent deliveries for one subscription the second waits and then
// compares against the first.

// last is the Stripe event last applied for a subscription.
type last struct {
	created int64
	eventID string
}

// newerThan reports whether l is after (created, eventID), ties on created
// going to the larger event id. The event applied itself (a retry) is not
// older: it is applied again, and its derived event id dedupes downstream.
func (l last) newerThan(created int64, eventID string) bool {
	if l.created != created {
		return l.created > created
	}
	return l.eventID > eventID
}

// lockSubscription returns the subscription's last applied event, holding
// its row lock until tx ends. A subscription seen for the first time gets a
// row older than any event (created -1), inserted so that it can be locked:
// a concurrent first delivery waits on the insert.
func lockSubscription(ctx context.Context, tx pgx.Tx, subscription string, now time.Time) (last, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO billing_subscriptions (subscription_id, created, event_id, applied_at)
VALUES ($1, -1, '', $2) ON CONFLICT (subscription_id) DO NOTHING`, subscription, now); err != nil {
		return last{}, err
	}
	var l last
	err := tx.QueryRow(ctx, `SELECT created, event_id FROM billing_subscriptions WHERE subscription_id = $1 FOR UPDATE`,
		subscription).Scan(&l.created, &l.eventID)
	return l, err
}

func setApplied(ctx context.Context, tx pgx.Tx, subscription string, created int64, eventID string, now time.Time) error {
	_, err := tx.Exec(ctx, `UPDATE billing_subscriptions SET created = $2, event_id = $3, applied_at = $4 WHERE subscription_id = $1`,
		subscription, created, eventID, now)
	return err
}

func recordStale(ctx context.Context, tx pgx.Tx, ev stripeEvent, subscription string, l last, now time.Time) error {
	_, err := tx.Exec(ctx, `INSERT INTO billing_stale_events
(event_id, event_type, subscription_id, created, applied_event_id, applied_created, received_at)
VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (event_id) DO NOTHING`,
		ev.ID, ev.Type, subscription, ev.Created, l.eventID, l.created, now)
	return err
}

// inOrder runs publish for ev, a subscription event newer than the last one
// applied, with the subscription's row locked; the row moves to ev only if
// publish answered 202. It returns stale (and the last applied event) when
// ev is older, having recorded it, without calling publish.
func inOrder(ctx context.Context, db *pgxpool.Pool, ev stripeEvent, subscription string, now time.Time,
	publish func(http.ResponseWriter), rw *bufferedResponse) (stale bool, applied last, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, last{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	l, err := lockSubscription(ctx, tx, subscription, now)
	if err != nil {
		return false, last{}, err
	}
	if l.newerThan(ev.Created, ev.ID) {
		if err := recordStale(ctx, tx, ev, subscription, l, now); err != nil {
			return false, l, err
		}
		return true, l, tx.Commit(ctx)
	}
	if err := setApplied(ctx, tx, subscription, ev.Created, ev.ID, now); err != nil {
		return false, l, err
	}
	if publish(rw); rw.status != http.StatusAccepted {
		return false, l, nil // rolled back: the row stays at the last applied event
	}
	if err := tx.Commit(ctx); err != nil {
		return false, l, fmt.Errorf("billing: recording the applied event (the plan change was produced; a retry dedupes): %w", err)
	}
	return false, l, nil
}

// bufferedResponse holds a response until the transaction it depends on
// has ended, so that a 202 is sent only once the subscription's row has
// moved.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func newBufferedResponse() *bufferedResponse { return &bufferedResponse{header: http.Header{}} }

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}

// sendTo writes the held response to rw.
func (b *bufferedResponse) sendTo(rw http.ResponseWriter) {
	for k, v := range b.header {
		rw.Header()[k] = v
	}
	if b.status == 0 {
		b.status = http.StatusOK
	}
	rw.WriteHeader(b.status)
	_, _ = rw.Write(b.body.Bytes())
}

var errNoDatabase = errors.New("billing: a database is required (WithDatabase): Stripe events are applied in order per subscription")
