// Package producer is the typed Go client for publishing mailplane domain
// events. Other programs import it: each event type has a publish function
// that validates (and seals credentials) before anything is produced, and
// returns where the event landed once every in-sync replica has it.
package producer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/promreg"
	"github.com/mailplane/mailplane/topics"
)

// Sealer seals secrets; *sealing.Keyring is one.
type Sealer interface {
	Seal(plain, aad []byte) (domain.SealedSecret, error)
}

// SchemaValidator checks an event's data JSON against the event type's
// published JSON Schema (eventschema.Validator is one).
type SchemaValidator interface {
	Validate(eventType string, data []byte) domain.Problems
}

// Receipt says where an event landed.
type Receipt struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

// Client publishes domain events.
type Client struct {
	kc      *kgo.Client
	sealer  Sealer
	schema  SchemaValidator
	source  string
	ns      topics.Namespace
	now     func() time.Time
	latency prometheus.Observer
}

// Option configures a Client.
type Option func(*Client)

// WithSealer seals plain-text mailbox credentials before producing. Without
// one, events carrying plain credentials are refused (plaintext_secret).
func WithSealer(s Sealer) Option { return func(c *Client) { c.sealer = s } }

// WithSchema also validates each event's data against its JSON Schema, the
// contract with consumers, after Go validation: a second opinion. It is off
// by default: the domain's Go validation is the authority, and the schemas
// are held to agree with it by tests (internal/eventschema), so it refuses
// nothing the Go validation lets through, at about the cost of the rest of
// Prepare (BENCHMARKS.md, "Ingest").
func WithSchema(v SchemaValidator) Option { return func(c *Client) { c.schema = v } }

// WithNamespace publishes into the topics of namespace ns (the
// deployment's MAILPLANE_KAFKA_NAMESPACE; default none).
func WithNamespace(ns topics.Namespace) Option { return func(c *Client) { c.ns = ns } }

// WithSource sets ce_source for events that do not set one.
func WithSource(s string) Option { return func(c *Client) { c.source = s } }

// WithClock injects the clock used for event times, the ingest check of
// event times (domain.Event.ValidateAt) and the record timestamps. The
// record timestamp is the time rules run on (domain.TrustedTime), so it is
// always this clock's, never the event's claimed time.
func WithClock(now func() time.Time) Option { return func(c *Client) { c.now = now } }

// WithRegisterer registers the client's metrics on reg.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(c *Client) {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mailplane_produce_seconds",
			Help:    "Time from produce call to acknowledgement by all in-sync replicas, per request.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		})
		c.latency = promreg.MustRegister(reg, h)
	}
}

// New returns a Client producing through kc, which should be built with
// kafka.ProducerOptions (idempotent, acks=all).
func New(kc *kgo.Client, opts ...Option) *Client {
	c := &Client{kc: kc, source: "mailplane/go-client", now: time.Now}
	for _, o := range opts {
		o(c)
	}
	return c
}

// NewEventID returns a new UUIDv7 event id.
func NewEventID() string { return domain.NewEventID() }

// NewEvent wraps data in an event with a fresh id, the client's source and
// the current time.
func (c *Client) NewEvent(d domain.Data) domain.Event {
	return domain.Event{
		ID: NewEventID(), Type: d.EventType(), Source: c.source,
		Time: c.now().UTC(), Subject: d.AggregateID(), Data: d,
	}
}

// Prepare seals and validates events and encodes them as records. It is
// all-or-nothing: on any problem it returns a *BatchError listing every
// problem of every event, and no records. Unlike Publish it passes sealed
// credentials through: it is for callers that sealed them.
func (c *Client) Prepare(events []domain.Event) ([]*kgo.Record, error) {
	recs := make([]*kgo.Record, len(events))
	var be BatchError
	for i := range events {
		e := &events[i]
		if ps := domain.SealData(e.Data, c.seal()); len(ps) > 0 {
			be.add(i, ps.Prefixed("data"))
			continue
		}
		if e.Subject == "" && e.Data != nil {
			e.Subject = e.Data.AggregateID()
		}
		chk, ps := e.Check(c.now())
		if len(ps) == 0 {
			recs[i], ps = c.encode(chk)
		}
		if len(ps) > 0 {
			be.add(i, ps)
		}
	}
	if len(be.Events) > 0 {
		return nil, &be
	}
	return recs, nil
}

// PrepareChecked is Prepare for events the domain has validated already
// (the ingest API's, parsed with domain.ParseChecked): it encodes them
// (and runs the schema validator, if the client has one) without
// validating them a second time. Nothing else makes a domain.Checked, so
// an event built by a Go caller goes through Prepare and its check.
func (c *Client) PrepareChecked(events []domain.Checked) ([]*kgo.Record, error) {
	recs := make([]*kgo.Record, len(events))
	var be BatchError
	for i, chk := range events {
		// Idempotent on checked data (sealed already): it only repeats
		// the endpoint rule Prepare applies with this client's sealer.
		if ps := domain.SealData(chk.Event().Data, c.seal()); len(ps) > 0 {
			be.add(i, ps.Prefixed("data"))
			continue
		}
		var ps domain.Problems
		if recs[i], ps = c.encode(chk); len(ps) > 0 {
			be.add(i, ps)
		}
	}
	if len(be.Events) > 0 {
		return nil, &be
	}
	return recs, nil
}

func (c *Client) seal() domain.SealFunc {
	if c.sealer == nil {
		return nil
	}
	return c.sealer.Seal
}

// encode turns a checked event into its record, and runs the schema
// validator on the data as it will be produced, when the client has one.
func (c *Client) encode(chk domain.Checked) (*kgo.Record, domain.Problems) {
	e := chk.Event()
	// Checked already; EncodeTo skips Encode's second validation.
	topic, err := topics.ForType(e.Type)
	var r *kgo.Record
	if err == nil {
		r, err = topics.EncodeTo(c.ns.Topic(topic), e)
	}
	if err != nil {
		return nil, domain.Problems{{Code: domain.ErrorCode(err), Message: err.Error()}}
	}
	if c.schema != nil {
		if ps := c.schema.Validate(e.Type, r.Value); len(ps) > 0 {
			return nil, ps
		}
	}
	return r, nil
}

// Publish validates every event and, only if all are valid, produces them
// and waits for acks=all. Receipts are in the order of events. If producing
// fails part-way, some events may have landed: retrying with the same event
// ids is safe, because projections recognise ids they have applied.
func (c *Client) Publish(ctx context.Context, events ...domain.Event) ([]Receipt, error) {
	if c.sealer != nil {
		// A client that seals is a producer's: it never passes on sealed
		// credentials it was handed (a copy from the log).
		var be BatchError
		for i, e := range events {
			if ps := domain.RefuseSealed(e.Data); len(ps) > 0 {
				be.add(i, ps.Prefixed("data"))
			}
		}
		if len(be.Events) > 0 {
			return nil, &be
		}
	}
	recs, err := c.Prepare(events)
	if err != nil {
		return nil, err
	}
	return c.ProduceRecords(ctx, events, recs)
}

// ProduceRecords produces records prepared by Prepare for events, stamped
// with the client's clock.
func (c *Client) ProduceRecords(ctx context.Context, events []domain.Event, recs []*kgo.Record) ([]Receipt, error) {
	start := time.Now()
	// kgo fills each record in place; results arrive in completion order,
	// so receipts are read from the records, not from the results.
	// The record timestamp is when mailplane received the events: rules
	// downstream run on it, not on the events' own times.
	at := c.now()
	for _, r := range recs {
		r.Offset = -1
		r.Timestamp = at
	}
	res := c.kc.ProduceSync(ctx, recs...)
	if c.latency != nil {
		c.latency.Observe(time.Since(start).Seconds())
	}
	firstErr := res.FirstErr()
	out := make([]Receipt, len(recs))
	for i, r := range recs {
		out[i] = Receipt{ID: events[i].ID, Type: events[i].Type, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}
	}
	if firstErr != nil {
		return out, &domain.Error{Code: domain.CodeUnavailable, Message: fmt.Sprintf("produce: %v", firstErr)}
	}
	return out, nil
}

// BatchError lists the problems of every invalid event in a batch.
type BatchError struct {
	Events []EventProblems
}

// EventProblems are the problems of the event at Index.
type EventProblems struct {
	Index    int
	Problems domain.Problems
}

func (b *BatchError) add(i int, ps domain.Problems) {
	b.Events = append(b.Events, EventProblems{Index: i, Problems: ps})
}

func (b *BatchError) Error() string {
	if len(b.Events) == 1 {
		return fmt.Sprintf("invalid event %d: %s", b.Events[0].Index, b.Events[0].Problems)
	}
	return fmt.Sprintf("%d invalid events; first, event %d: %s", len(b.Events), b.Events[0].Index, b.Events[0].Problems)
}

func (c *Client) publishOne(ctx context.Context, d domain.Data) (Receipt, error) {
	rs, err := c.Publish(ctx, c.NewEvent(d))
	if err != nil {
		var be *BatchError
		if errors.As(err, &be) {
			return Receipt{}, be.Events[0].Problems.Err()
		}
		return Receipt{}, err
	}
	return rs[0], nil
}

// PublishMailboxAdded publishes mailbox.added; plain credentials are sealed.
func (c *Client) PublishMailboxAdded(ctx context.Context, d domain.MailboxAdded) (Receipt, error) {
	return c.publishOne(ctx, &d)
}

// PublishMailboxRemoved publishes mailbox.removed.
func (c *Client) PublishMailboxRemoved(ctx context.Context, d domain.MailboxRemoved) (Receipt, error) {
	return c.publishOne(ctx, &d)
}

// PublishMailboxHealthScored publishes mailbox.health_scored.
func (c *Client) PublishMailboxHealthScored(ctx context.Context, d domain.MailboxHealthScored) (Receipt, error) {
	return c.publishOne(ctx, &d)
}

// PublishMailboxDisabled publishes mailbox.disabled.
func (c *Client) PublishMailboxDisabled(ctx context.Context, d domain.MailboxDisabled) (Receipt, error) {
	return c.publishOne(ctx, &d)
}

// PublishWarmupObserved publishes mailbox.warmup_observed, keyed by the
// sending mailbox, to topics.MailboxObservations (not mailbox.events).
func (c *Client) PublishWarmupObserved(ctx context.Context, d domain.WarmupObserved) (Receipt, error) {
	return c.publishOne(ctx, &d)
}

// PublishOrgPlanChanged publishes org.plan_changed.
func (c *Client) PublishOrgPlanChanged(ctx context.Context, d domain.OrgPlanChanged) (Receipt, error) {
	return c.publishOne(ctx, &d)
}

// PublishUserActive publishes user.active.
func (c *Client) PublishUserActive(ctx context.Context, d domain.UserActive) (Receipt, error) {
	return c.publishOne(ctx, &d)
}

// PublishWorkerHeartbeat publishes worker.heartbeat (dedicated is refused
// with tier_not_allowed).
func (c *Client) PublishWorkerHeartbeat(ctx context.Context, d domain.WorkerHeartbeat) (Receipt, error) {
	return c.publishOne(ctx, &d)
}

// PublishWorkerHealthSampled publishes worker.health_sampled.
func (c *Client) PublishWorkerHealthSampled(ctx context.Context, d domain.WorkerHealthSampled) (Receipt, error) {
	return c.publishOne(ctx, &d)
}
