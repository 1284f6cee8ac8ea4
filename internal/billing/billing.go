// Package billing turns Stripe subscription webhooks into org.plan_changed
// events. It mounts POST /v1/webhooks/billing on an api.Server without the
// bearer-token check: the Stripe-Signature header is the authentication
// (see Verify). Events are produced through api.Server.Publish, so the
// answers to accepted and failed produces are those of POST /v1/events.
//
// Handled event types: customer.subscription.created, .updated and
// .deleted. The subscription's metadata names the org (key "org_id" by
// default, see Config.OrgMetadataKey) and its items' prices name the plan
// through a configured map (see ParsePrices). Status decides payment:
//
//   - active, trialing, past_due: the mapped plan, paid (unless the plan is
//     free); past_due keeps the plan while Stripe retries the payment;
//   - incomplete, paused: not paying yet or any more: free, not paid;
//   - canceled, unpaid, incomplete_expired, and every .deleted event: the
//     subscription ended: free, not paid, no dedicated workers.
//
// Stripe does not order deliveries: per subscription, an event created
// before the one last applied (ties: the smaller event id) is recorded in
// billing_stale_events and ignored (see order.go). The plan is the org's:
// it is derived from all of the org's subscriptions, each at its last
// applied event (see plan.go), and org.plan_changed is produced only when
// that derived plan changes, never dated before the org's previous change.
// The subscription's row and its org's are locked in Postgres across the
// produce, so concurrent deliveries are applied one after the other.
// Handled events must carry "created".
//
// The produced event's source is "stripe:<event id>" and its CloudEvent id
// is derived from the Stripe event id (EventID), so producing the same
// change again (the produce landed but the commit failed, and Stripe
// retries) gives the same event id, deduplicated downstream.
//
// Answers (JSON, api.ErrorResponse for errors):
//
//	202 accepted (api.AcceptedResponse)         the org's plan changed and was produced
//	                                            (two events when the subscription moved
//	                                            to another org: both orgs' plans)
//	200 ignored (IgnoredResponse)               another event type, or an event older
//	                                            than the subscription's last applied
//	                                            one; Stripe wants 2xx
//	200 unchanged (IgnoredResponse)             applied to the subscription, the org's
//	                                            derived plan is the same: nothing produced
//	400 invalid_signature                       header missing or malformed, no
//	                                            signature matches, stale timestamp
//	400 malformed_json, invalid, required, ...  the signed event is not usable
//	413 too_large                               body over the limit
//	422 unknown_price                           no item's price, plan or product
//	                                            is in the price map (a config
//	                                            gap: Stripe retries for days, so
//	                                            fixing the map recovers it)
//	405 method_not_allowed                      not POST
//	503 unavailable                             the log did not acknowledge
//
// Nothing is produced for any non-2xx answer.
package billing

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/promreg"
)

// Route is the webhook's route.
const Route = "POST /v1/webhooks/billing"

// CodeUnknownPrice is the stable code of a 422: the subscription is live
// but none of its prices is in the price map.
const CodeUnknownPrice domain.Code = "unknown_price"

// Defaults.
const (
	// DefaultSource is the ce_source of the events produced.
	DefaultSource = "mailplane/billing/stripe"
	// DefaultMaxBodyBytes bounds a webhook body. Stripe's subscription
	// events are a few KiB (tens with many items); the cap is what the
	// billing class's budget is counted in (api.ClassBilling).
	DefaultMaxBodyBytes = 256 << 10
)

// Stripe event types handled.
const (
	EventSubscriptionCreated = "customer.subscription.created"
	EventSubscriptionUpdated = "customer.subscription.updated"
	EventSubscriptionDeleted = "customer.subscription.deleted"
)

// IgnoredResponse is the 200 body of a delivery that produced nothing: an
// event type not handled or a stale event ("ignored"), or an event applied
// that left the org's plan as it was ("unchanged").
type IgnoredResponse struct {
	Status    string `json:"status"` // "ignored" or "unchanged"
	EventID   string `json:"event_id,omitempty"`
	EventType string `json:"event_type"`
	Message   string `json:"message"`
}

type options struct {
	now     func() time.Time
	source  string
	maxBody int64
	logger  *slog.Logger
	db      *pgxpool.Pool
	reg     prometheus.Registerer
}

// Option configures the webhook.
type Option func(*options)

// WithClock sets the clock the signature timestamp is checked against
// (default time.Now).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithDatabase sets the database (migrated) holding, per subscription, the
// Stripe event last applied (see order.go). Required.
func WithDatabase(db *pgxpool.Pool) Option { return func(o *options) { o.db = db } }

// WithRegisterer registers the webhook's metrics on reg (default: a private
// registry).
func WithRegisterer(reg prometheus.Registerer) Option { return func(o *options) { o.reg = reg } }

// WithSource sets the ce_source of produced events (default DefaultSource).
func WithSource(s string) Option { return func(o *options) { o.source = s } }

// WithMaxBodyBytes bounds webhook bodies (default DefaultMaxBodyBytes).
func WithMaxBodyBytes(n int64) Option { return func(o *options) { o.maxBody = n } }

// WithLogger sets the logger (default: discard). Bodies, headers and
// secrets are never logged.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

type webhook struct {
	cfg   Config
	opt   options
	srv   *api.Server
	log   *slog.Logger
	stale prometheus.Counter
}

// Register mounts POST /v1/webhooks/billing on s, without bearer auth.
// Call it before s serves. cfg is validated (after defaults).
func Register(s *api.Server, cfg Config, opts ...Option) error {
	if s == nil {
		return errors.New("billing: nil server")
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	o := options{now: time.Now, source: DefaultSource, maxBody: DefaultMaxBodyBytes}
	for _, f := range opts {
		f(&o)
	}
	if o.now == nil || o.source == "" || o.maxBody <= 0 {
		return errors.New("billing: clock, source and body limit must be set and positive")
	}
	if o.db == nil {
		return errNoDatabase
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	if o.reg == nil {
		o.reg = prometheus.NewRegistry()
	}
	stale := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mailplane_billing_stale_events_total",
		Help: "Stripe subscription events ignored as older than the last one applied for their subscription.",
	})
	stale, err := promreg.Register(o.reg, stale)
	if err != nil {
		return fmt.Errorf("billing: metrics: %w", err)
	}
	// Copy what the caller may still change.
	cfg.Secrets = append([]string(nil), cfg.Secrets...)
	prices := make(map[string]PlanSpec, len(cfg.Prices))
	for k, v := range cfg.Prices {
		prices[k] = v
	}
	cfg.Prices = prices
	w := &webhook{cfg: cfg, opt: o, srv: s, log: o.logger, stale: stale}
	return s.HandleLimited(Route, http.HandlerFunc(w.serve), false,
		api.RouteLimits{Class: api.ClassBilling, MaxBody: o.maxBody, Classify: w.screen})
}

// Stripe's event and subscription objects, as much as is read. Unknown
// fields are ignored: Stripe adds fields without notice.
type stripeEvent struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Created int64  `json:"created"`
	Data    *struct {
		Object json.RawMessage `json:"object"`
	} `json:"data"`
}

type subscription struct {
	ID       string            `json:"id"`
	Object   string            `json:"object"`
	Status   string            `json:"status"`
	Metadata map[string]string `json:"metadata"`
	Items    struct {
		Data []subscriptionItem `json:"data"`
	} `json:"items"`
	Plan *stripeRef `json:"plan"` // legacy single-plan subscriptions
}

type subscriptionItem struct {
	Price *stripeRef `json:"price"`
	Plan  *stripeRef `json:"plan"`
}

// stripeRef is a price or plan: its id and its product (an id, or the
// expanded product object).
type stripeRef struct {
	ID      string          `json:"id"`
	Product json.RawMessage `json:"product"`
}

func (r *stripeRef) productID() string {
	if r == nil || len(r.Product) == 0 {
		return ""
	}
	var id string
	if json.Unmarshal(r.Product, &id) == nil {
		return id
	}
	var obj struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(r.Product, &obj) == nil {
		return obj.ID
	}
	return ""
}

type statusClass int

const (
	statusPaying statusClass = iota + 1
	statusNotPaying
	statusEnded
)

var statuses = map[string]statusClass{
	"active": statusPaying, "trialing": statusPaying, "past_due": statusPaying,
	"incomplete": statusNotPaying, "paused": statusNotPaying,
	"canceled": statusEnded, "unpaid": statusEnded, "incomplete_expired": statusEnded,
}

func (w *webhook) serve(rw http.ResponseWriter, r *http.Request) {
	body, err := api.ReadBody(rw, r, w.opt.maxBody)
	if err != nil {
		api.WriteDomainError(rw, err)
		return
	}
	now := w.opt.now()

	hs := r.Header.Values(SignatureHeader)
	if len(hs) > 1 {
		err = domain.Errorf(CodeInvalidSignature, "the %s header must be given once", SignatureHeader)
	} else {
		err = Verify(body, r.Header.Get(SignatureHeader), w.cfg.Secrets, now, w.cfg.Tolerance)
	}
	if err != nil {
		w.log.Debug("billing: webhook refused", "code", domain.ErrorCode(err), "remote", r.RemoteAddr)
		api.WriteDomainError(rw, err)
		return
	}

	var ev stripeEvent
	if perr := decode(body, "", &ev); perr != nil {
		api.WriteProblems(rw, http.StatusBadRequest, "the event is not usable; nothing was produced", domain.Problems{*perr})
		return
	}
	if ps := ev.check(now); len(ps) > 0 {
		api.WriteProblems(rw, http.StatusBadRequest, "the event is not usable; nothing was produced", ps)
		return
	}
	switch ev.Type {
	case EventSubscriptionCreated, EventSubscriptionUpdated, EventSubscriptionDeleted:
	default:
		api.WriteJSON(rw, http.StatusOK, IgnoredResponse{
			Status: "ignored", EventID: ev.ID, EventType: ev.Type,
			Message: "only customer.subscription.created, .updated and .deleted are handled",
		})
		return
	}

	pc, subID, code, ps := w.planChange(ev)
	if len(ps) > 0 {
		status, msg := http.StatusBadRequest, "the event is not usable; nothing was produced"
		if code == CodeUnknownPrice {
			status, msg = http.StatusUnprocessableEntity,
				"no price of the subscription is mapped to a plan; nothing was produced"
			w.log.Warn("billing: subscription with no mapped price; add it to "+EnvPrices,
				"stripe_event", ev.ID, "org_id", pc.OrgID, "problems", len(ps))
		}
		api.WriteProblems(rw, status, msg, ps)
		return
	}

	publish := func(out http.ResponseWriter, changes []orgChange) {
		events := make([]domain.Event, len(changes))
		for i, c := range changes {
			events[i] = w.planEvent(ev, c)
			w.log.Info("billing: plan change", "stripe_event", ev.ID, "stripe_type", ev.Type, "subscription", subID,
				"org_id", c.orgID, "plan", c.plan.plan, "dedicated_workers", c.plan.dedicated, "released", c.released)
		}
		w.srv.Publish(out, r, events...)
	}
	buf := newBufferedResponse()
	g := grant{plan: pc.Plan, dedicated: pc.DedicatedWorkers}
	res, err := apply(r.Context(), w.opt.db, ev, subID, pc.OrgID, g, now, publish, buf)
	switch {
	case err != nil:
		w.log.Warn("billing: webhook not applied", "stripe_event", ev.ID, "err", err)
		rw.Header().Set("Retry-After", "1")
		api.WriteDomainError(rw, domain.Errorf(domain.CodeUnavailable, "the subscription's order could not be checked or recorded; nothing is applied until Stripe retries"))
	case res.stale:
		w.stale.Inc()
		w.log.Warn("billing: stale Stripe event ignored", "stripe_event", ev.ID, "stripe_type", ev.Type,
			"subscription", subID, "created", ev.Created, "applied_event", res.applied.eventID, "applied_created", res.applied.created)
		api.WriteJSON(rw, http.StatusOK, IgnoredResponse{
			Status: "ignored", EventID: ev.ID, EventType: ev.Type,
			Message: "older than the event last applied for this subscription (" + res.applied.eventID + "); recorded, not applied",
		})
	case !res.produced:
		api.WriteJSON(rw, http.StatusOK, IgnoredResponse{
			Status: "unchanged", EventID: ev.ID, EventType: ev.Type,
			Message: "applied to the subscription; the org's plan, derived from all of its subscriptions, is unchanged, so nothing was produced",
		})
	default:
		buf.sendTo(rw)
	}
}

// check reports what makes an event's envelope unusable: its id, type
// and created time (at the server's clock now).
func (ev *stripeEvent) check(now time.Time) domain.Problems {
	var ps domain.Problems
	if ev.ID == "" {
		ps.Add("id", domain.CodeRequired, "is required")
	} else if !validStripeID(ev.ID) {
		ps.Add("id", domain.CodeInvalid, "is not a Stripe event id")
	}
	if ev.Type == "" {
		ps.Add("type", domain.CodeRequired, "is required")
	}
	if ev.Created <= 0 {
		// Events are applied in created order per subscription.
		ps.Add("created", domain.CodeRequired, "is required")
	} else if domain.TooFarAhead(time.Unix(ev.Created, 0), now) {
		// It would become its subscription's high-water mark, and every
		// later event would be ignored as older.
		ps.Add("created", domain.CodeTimeInFuture, "is more than %s ahead of the server's clock", domain.MaxFutureSkew)
	}
	return ps
}

// planEvent is the org.plan_changed of c, produced for the Stripe event
// ev. Its id is derived from ev's id and c's time (EventID), so producing
// the same change again after a failed commit dedupes downstream; the
// change of the org a subscription left gets an id of its own.
func (w *webhook) planEvent(ev stripeEvent, c orgChange) domain.Event {
	id := EventID(ev.ID, c.at.Unix())
	if c.released {
		id = derivedEventID("mailplane.billing.stripe.released.v1\x00"+ev.ID+"\x00"+c.orgID, c.at.Unix())
	}
	return domain.Event{
		ID:      id,
		Type:    domain.TypeOrgPlanChanged,
		Source:  w.opt.source,
		Time:    c.at,
		Subject: c.orgID,
		Data: &domain.OrgPlanChanged{
			OrgID: c.orgID, Plan: c.plan.plan, DedicatedWorkers: c.plan.dedicated,
			Paid: c.plan.plan != domain.PlanFree, Source: "stripe:" + ev.ID,
		},
	}
}

// planChange maps a subscription event to what the subscription grants its
// org (the org itself may hold more: plan.go). Problems carry
// field paths in the Stripe event; code is the problems' top-level code.
func (w *webhook) planChange(ev stripeEvent) (*domain.OrgPlanChanged, string, domain.Code, domain.Problems) {
	pc, sub, code, ps := w.planChangeOf(ev)
	return pc, sub.ID, code, ps
}

func (w *webhook) planChangeOf(ev stripeEvent) (*domain.OrgPlanChanged, subscription, domain.Code, domain.Problems) {
	var ps domain.Problems
	var sub subscription
	if ev.Data == nil || len(bytes.TrimSpace(ev.Data.Object)) == 0 || string(bytes.TrimSpace(ev.Data.Object)) == "null" {
		ps.Add("data.object", domain.CodeRequired, "is required")
		return &domain.OrgPlanChanged{}, sub, domain.CodeRequired, ps
	}
	if p := decode(ev.Data.Object, "data.object", &sub); p != nil {
		return &domain.OrgPlanChanged{}, sub, p.Code, domain.Problems{*p}
	}
	if sub.Object != "subscription" {
		ps.Add("data.object.object", domain.CodeInvalid, "must be subscription")
	}
	switch {
	case sub.ID == "":
		ps.Add("data.object.id", domain.CodeRequired, "is required")
	case !validStripeID(sub.ID):
		ps.Add("data.object.id", domain.CodeInvalid, "is not a Stripe subscription id")
	}
	metaField := "data.object.metadata." + w.cfg.OrgMetadataKey
	orgID := strings.ToLower(strings.TrimSpace(sub.Metadata[w.cfg.OrgMetadataKey]))
	switch {
	case orgID == "":
		ps.Add(metaField, domain.CodeRequired, "the subscription's metadata must name the org")
	case !domain.IsUUID(orgID):
		ps.Add(metaField, domain.CodeInvalid, "must be the org's UUID")
	}
	class := statusEnded
	if ev.Type != EventSubscriptionDeleted {
		c, ok := statuses[sub.Status]
		switch {
		case sub.Status == "":
			ps.Add("data.object.status", domain.CodeRequired, "is required")
		case !ok:
			ps.Add("data.object.status", domain.CodeInvalid, "unknown subscription status %q", sub.Status)
		}
		class = c
	}
	pc := &domain.OrgPlanChanged{OrgID: orgID, Plan: domain.PlanFree, Source: "stripe:" + ev.ID}
	if len(ps) > 0 {
		return pc, sub, ps.Code(), ps
	}
	if class != statusPaying {
		return pc, sub, "", nil // free, unpaid, no dedicated workers
	}
	spec, ups := w.resolve(sub)
	if len(ups) > 0 {
		return pc, sub, CodeUnknownPrice, ups
	}
	pc.Plan, pc.DedicatedWorkers, pc.Paid = spec.Plan, spec.DedicatedWorkers, spec.Plan != domain.PlanFree
	if vps := pc.Validate(); len(vps) > 0 {
		// Only the sum of several dedicated items can get here.
		return pc, sub, vps.Code(), vps.Prefixed("data.object.items")
	}
	return pc, sub, "", nil
}

var planRank = map[domain.Plan]int{domain.PlanFree: 0, domain.PlanPremium: 1, domain.PlanDedicated: 2}

// resolve maps the subscription's items to one plan: the highest plan any
// item maps to, with the dedicated workers of every dedicated item added
// up. Items whose price maps to nothing are ignored when another maps
// (add-ons that do not change the plan); when none maps, every item is an
// unknown_price problem.
func (w *webhook) resolve(sub subscription) (PlanSpec, domain.Problems) {
	type ref struct {
		field string
		ids   []string
	}
	var refs []ref
	for i, it := range sub.Items.Data {
		f := fmt.Sprintf("data.object.items.data.%d", i)
		refs = append(refs, ref{f, nonEmpty(idOf(it.Price), idOf(it.Plan), it.Price.productID(), it.Plan.productID())})
	}
	if len(refs) == 0 && sub.Plan != nil {
		refs = append(refs, ref{"data.object.plan", nonEmpty(sub.Plan.ID, sub.Plan.productID())})
	}
	best, mapped, dedicated := PlanSpec{}, false, 0
	var ps domain.Problems
	for _, r := range refs {
		spec, ok := PlanSpec{}, false
		for _, id := range r.ids {
			if spec, ok = w.cfg.Prices[id]; ok {
				break
			}
		}
		if !ok {
			msg := "the subscription item has no price"
			if len(r.ids) > 0 {
				msg = "none of " + strings.Join(r.ids, ", ") + " is in the price map"
			}
			ps.Add(r.field, CodeUnknownPrice, "%s", msg)
			continue
		}
		if !mapped || planRank[spec.Plan] > planRank[best.Plan] {
			best = spec
		}
		mapped = true
		dedicated += spec.DedicatedWorkers
	}
	if len(refs) == 0 {
		ps.Add("data.object.items", CodeUnknownPrice, "the subscription has no items")
	}
	if !mapped {
		return PlanSpec{}, ps
	}
	if best.Plan == domain.PlanDedicated {
		best.DedicatedWorkers = dedicated
	}
	return best, nil
}

func idOf(r *stripeRef) string {
	if r == nil {
		return ""
	}
	return r.ID
}

func nonEmpty(ids ...string) []string {
	var out []string
	for _, id := range ids {
		if id != "" && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// validStripeID: Stripe ids are short runs of [A-Za-z0-9_]; the bound keeps
// "stripe:<id>" within org.plan_changed's source limit.
func validStripeID(id string) bool {
	if len(id) > 190 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// EventID derives the CloudEvent id of the org.plan_changed produced for a
// Stripe event: a UUIDv7 whose time is the change's time (in seconds, the
// Stripe event's created time unless the org's previous change is later;
// 0 when absent) and whose other bits come from SHA-256 of the Stripe
// event id. The same Stripe event, retried, gets the same id.
func EventID(stripeEventID string, created int64) string {
	return derivedEventID("mailplane.billing.stripe.v1\x00"+stripeEventID, created)
}

func derivedEventID(name string, created int64) string {
	h := sha256.Sum256([]byte(name))
	var u uuid.UUID
	ms := uint64(0)
	if created > 0 {
		ms = uint64(created) * 1000
	}
	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], ms&(1<<48-1))
	copy(u[0:6], ts[2:])
	copy(u[6:], h[:10])
	u[6] = 0x70 | u[6]&0x0f // version 7
	u[8] = 0x80 | u[8]&0x3f // RFC 9562 variant
	return u.String()
}

// decode unmarshals leniently (unknown fields allowed) and reports a
// syntax error as malformed_json, a type error as invalid_type at its path.
func decode(raw []byte, prefix string, v any) *domain.Problem {
	err := json.Unmarshal(raw, v)
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		f := te.Field
		if prefix != "" {
			f = strings.TrimSuffix(prefix+"."+f, ".")
		}
		return &domain.Problem{Field: f, Code: domain.CodeInvalidType, Message: "must be " + jsonType(te.Type) + ", not " + te.Value}
	}
	return &domain.Problem{Field: prefix, Code: domain.CodeMalformedJSON, Message: "not valid JSON"}
}

func jsonType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Bool:
		return "a boolean"
	case reflect.Map, reflect.Struct, reflect.Pointer:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return t.Kind().String()
}
