package billing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Stripe does not order webhook deliveries: an event created before the one
// last applied for the same subscription may arrive after it. Applying it
// would undo the newer state (a downgrade to free after an upgrade). The
// webhook keeps, per subscription, the Stripe event last applied (created
// time, then event id for ties) and what the subscription grants at it, in
// Postgres, and ignores older events: they are recorded in
// billing_stale_events, logged and answered 200, so Stripe stops retrying,
// and nothing is produced. The subscription's row, then its org's (plan.go),
// are locked from the comparison until the produce is acknowledged and the
// rows updated, so of two concurrent deliveries for one subscription or one
// org the second waits and then compares against the first.

// last is the Stripe event last applied for a subscription, and the org it
// then belonged to ("" for a row recorded before the org was kept).
type last struct {
	created int64
	eventID string
	orgID   string
}

// newerThan reports whether l is after (created, eventID), ties on created
// going to the larger event id. The event applied itself (a retry) is not
// older: it is applied again, and produces only if the org's plan differs
// from the one last produced.
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
	var org *string
	err := tx.QueryRow(ctx, `SELECT created, event_id, org_id::text FROM billing_subscriptions WHERE subscription_id = $1 FOR UPDATE`,
		subscription).Scan(&l.created, &l.eventID, &org)
	if org != nil {
		l.orgID = *org
	}
	return l, err
}

// setApplied moves the subscription's high-water mark to ev and records
// what it grants orgID from now on.
func setApplied(ctx context.Context, tx pgx.Tx, subscription string, ev stripeEvent, orgID string, g grant, now time.Time) error {
	_, err := tx.Exec(ctx, `UPDATE billing_subscriptions SET created = $2, event_id = $3, applied_at = $4,
org_id = $5, plan = $6, dedicated_workers = $7 WHERE subscription_id = $1`,
		subscription, ev.Created, ev.ID, now, orgID, string(g.plan), g.dedicated)
	return err
}

func recordStale(ctx context.Context, tx pgx.Tx, ev stripeEvent, subscription string, l last, now time.Time) error {
	_, err := tx.Exec(ctx, `INSERT INTO billing_stale_events
(event_id, event_type, subscription_id, created, applied_event_id, applied_created, received_at)
VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (event_id) DO NOTHING`,
		ev.ID, ev.Type, subscription, ev.Created, l.eventID, l.created, now)
	return err
}

// outcome is what applying a delivery came to.
type outcome struct {
	stale    bool // older than applied: recorded, nothing else
	applied  last // the subscription's last applied event before ev
	produced bool // publish was called; its answer is in the buffered response
}

// apply applies ev, which says the subscription grants g to orgID: if ev
// is older than the subscription's last applied event, it is recorded as
// stale (outcome.stale). Otherwise, with the subscription's row and then
// its orgs' rows locked (the org it names and, if the subscription moved,
// the one it left; in id order, so two deliveries never wait on each other
// in a cycle), the subscription moves to ev and each org's plan is derived
// again (plan.go). Changed plans are handed to publish, and the transaction
// commits only if publish answered 202; without changes it commits with
// nothing produced.
func apply(ctx context.Context, db *pgxpool.Pool, ev stripeEvent, subscription, orgID string, g grant, now time.Time,
	publish func(http.ResponseWriter, []orgChange), rw *bufferedResponse) (outcome, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return outcome{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	l, err := lockSubscription(ctx, tx, subscription, now)
	if err != nil {
		return outcome{}, err
	}
	out := outcome{applied: l}
	if l.newerThan(ev.Created, ev.ID) {
		if err := recordStale(ctx, tx, ev, subscription, l, now); err != nil {
			return out, err
		}
		out.stale = true
		return out, tx.Commit(ctx)
	}
	order := []string{orgID}
	if l.orgID != "" && l.orgID != orgID {
		order = append(order, l.orgID)
		slices.Sort(order)
	}
	orgs := make(map[string]orgRow, len(order))
	for _, org := range order {
		if orgs[org], err = lockOrg(ctx, tx, org, now); err != nil {
			return out, err
		}
	}
	if err := setApplied(ctx, tx, subscription, ev, orgID, g, now); err != nil {
		return out, err
	}
	changes, err := derivePlans(ctx, tx, ev, orgID, orgs, order, now)
	if err != nil {
		return out, err
	}
	if len(changes) > 0 {
		out.produced = true
		if publish(rw, changes); rw.status != http.StatusAccepted {
			return out, nil // rolled back: the rows stay as they were
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return out, fmt.Errorf("billing: recording the applied event (a plan change may have been produced; a retry dedupes): %w", err)
	}
	return out, nil
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
