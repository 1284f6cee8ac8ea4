package dlq

// Redrive hands dead letters back to the consumer that gave up on them,
// after the cause was fixed (docs/runbook.md, "Redrive dead letters").
//
// The original record (key, value and CloudEvents headers; the dead-letter
// headers dropped) is appended again to its source topic and partition,
// with redrive headers naming the consumer it is for. It goes through that
// consumer's normal code path, and so through its dedupe by event key: an
// event applied once stays applied once. Every other consumer of the topic
// skips it (ForOtherConsumer), so nothing else applies it again.
//
// Each redriven dead letter is recorded in Postgres (dlq_redrives): one
// already redriven is skipped unless Selection.Again. The row is written
// pending before the produce and done after it; a redrive that dies in
// between leaves pending rows that the next one completes, producing the
// record only if its redrive id is not found in the source partition.
// Redrives take turns on an advisory lock, so a pending row is never
// completed while its own redrive is still producing.

import (
	"bytes"
	"context"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/promreg"
	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

// Header names of a redriven record. Every one starts with
// RedriveHeaderPrefix; analysts reading a source topic see them on the
// records a redrive appended.
const (
	RedriveHeaderPrefix = "mailplane_redrive_"
	// HeaderRedriveConsumer names the one consumer that applies the record.
	HeaderRedriveConsumer = "mailplane_redrive_consumer"
	// HeaderRedriveID is the redrive's id (a UUID), as recorded.
	HeaderRedriveID = "mailplane_redrive_id"
	// HeaderRedriveDLQPartition and HeaderRedriveDLQOffset locate the dead
	// letter the record was redriven from.
	HeaderRedriveDLQPartition = "mailplane_redrive_dlq_partition"
	HeaderRedriveDLQOffset    = "mailplane_redrive_dlq_offset"
	// HeaderRedriveSourceOffset is the offset of the original record in
	// the same partition.
	HeaderRedriveSourceOffset = "mailplane_redrive_source_offset"
)

// ForOtherConsumer reports whether r was redriven from the DLQ for a
// consumer other than consumer. Every consumer of a topic a redrive writes
// to skips such a record (moving its offset past it), so that only the
// consumer that dead-lettered it applies it again. This is the one place of
// that rule.
func ForOtherConsumer(r *kgo.Record, consumer string) bool {
	for _, h := range r.Headers {
		if h.Key == HeaderRedriveConsumer {
			return string(h.Value) != consumer
		}
	}
	return false
}

// redrivable are the consumers whose dead letters may be redriven. A
// redrive writes only to the topics its consumer reads (internal/sla's
// table). Each dedupes by event key, so a record redriven twice is applied
// once within their dedupe windows: the projectors (applied_events,
// internal/projections/dedupe.go), the mailbox.state processor
// (internal/mailboxstate/dedupe.go).
var redrivable = map[string]bool{
	string(sla.Registry):     true,
	string(sla.Health):       true,
	string(sla.MailboxState): true,
}

// consumerTopics returns the topics consumer reads (catalog names).
func consumerTopics(consumer string) []string {
	c, err := sla.Lookup(sla.Name(consumer))
	if err != nil {
		return nil
	}
	return c.Topics
}

// notRedrivable are the consumers that write dead letters but whose dead
// letters are never redriven, and why.
var notRedrivable = map[string]string{
	string(sla.PlacementEngine): "the placement engine's dead letters are inputs it could not decode, which every consumer of the topic " +
		"refused alike; a redriven input would be decided at the redrive's place in the log, after the inputs that followed it, " +
		"which is not the decision the log meant. Publish a corrected event instead (mailplane publish)",
}

// RedrivableConsumers returns the consumers whose dead letters Redrive
// hands back, sorted.
func RedrivableConsumers() []string {
	out := make([]string, 0, len(redrivable))
	for c := range redrivable {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// Selection picks the dead letters of one consumer to redrive.
type Selection struct {
	// Consumer is required: redrive hands dead letters back to one
	// consumer at a time.
	Consumer string
	// Code, when set, keeps the dead letters of that error code only.
	Code domain.Code
	// FromOffset and ToOffset, when set, bound the dead letters' offsets in
	// the DLQ topic, inclusive ("DLQ OFFSET" of dlq list). The zero
	// Selection of a consumer picks all its dead letters.
	FromOffset, ToOffset *int64
	// Again redrives dead letters redriven before, under the new redrive's
	// id. The consumer still applies an event once (its dedupe).
	Again bool
	// OutOfOrder redrives dead letters whose key has later records in the
	// source partition (refused otherwise: redriven, the event is applied
	// after them, and may undo what they did).
	OutOfOrder bool
	// DryRun reports what would be redriven and writes nothing.
	DryRun bool
}

var codeRE = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)

// Check reports what is wrong with s, with a stable code.
func (s Selection) Check() error {
	switch {
	case s.Consumer == "":
		return domain.Errorf(domain.CodeRequired, "a consumer is required (one of %s)", strings.Join(RedrivableConsumers(), ", "))
	case !domain.IsCleanText(s.Consumer) || len(s.Consumer) > 64:
		return domain.Errorf(domain.CodeForbiddenCharacter, "the consumer must be clean text of at most 64 bytes")
	}
	if why, ok := notRedrivable[s.Consumer]; ok {
		return domain.Errorf(domain.CodeNotRedrivable, "%s: %s", s.Consumer, why)
	}
	if !redrivable[s.Consumer] {
		return domain.Errorf(domain.CodeInvalid, "unknown consumer %q: dead letters are redriven to %s", s.Consumer, strings.Join(RedrivableConsumers(), ", "))
	}
	if s.Code != "" && !codeRE.MatchString(string(s.Code)) {
		return domain.Errorf(domain.CodeInvalid, "an error code is 1-64 of [a-z0-9_]")
	}
	if s.FromOffset != nil && *s.FromOffset < 0 || s.ToOffset != nil && *s.ToOffset < 0 {
		return domain.Errorf(domain.CodeOutOfRange, "offsets are not negative")
	}
	if s.FromOffset != nil && s.ToOffset != nil && *s.FromOffset > *s.ToOffset {
		return domain.Errorf(domain.CodeOutOfRange, "the offset range %d to %d is empty", *s.FromOffset, *s.ToOffset)
	}
	return nil
}

func (s Selection) matches(e Entry) bool {
	return e.Consumer == s.Consumer &&
		(s.Code == "" || e.ErrorCode == s.Code) &&
		(s.FromOffset == nil || e.Offset >= *s.FromOffset) &&
		(s.ToOffset == nil || e.Offset <= *s.ToOffset)
}

// refusal returns why e cannot be redriven to its consumer in namespace ns
// (nil: it can).
func refusal(ns topics.Namespace, e Entry) *domain.Error {
	switch {
	case e.ValueWithheld != "":
		return domain.Errorf(domain.CodeValueWithheld, "the DLQ withheld this value (%s): there is nothing to hand back; "+
			"re-publish the event (mailplane publish, or the producer again with the same event id)", e.ValueWithheld)
	case MayHoldSecret(e.Value):
		// Written by something other than NewRecord: never copy a
		// secret into the log.
		return domain.Errorf(domain.CodeValueWithheld, "the value may hold a plain-text secret; re-publish the event instead")
	case len(e.Value) == 0 || len(e.Key) == 0:
		return domain.Errorf(domain.CodeNotRedrivable, "the dead letter has no key or no value")
	case !redrivable[e.Consumer] || !slices.Contains(ns.Topics(consumerTopics(e.Consumer)...), e.SourceTopic):
		return domain.Errorf(domain.CodeNotRedrivable, "the source topic %q is not one %s reads", e.SourceTopic, e.Consumer)
	case e.SourcePartition < 0 || e.SourceOffset < 0:
		return domain.Errorf(domain.CodeNotRedrivable, "the dead letter names no source partition and offset")
	}
	return nil
}

// RedriveRecord returns the record that hands e back to its consumer: the
// original key, value and headers (without dead-letter or earlier redrive
// headers) for e's source topic and partition, with the redrive headers.
func RedriveRecord(e Entry, redriveID string) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, len(e.Headers)+5)
	for _, h := range e.Headers {
		if strings.HasPrefix(h.Key, HeaderPrefix) || strings.HasPrefix(h.Key, RedriveHeaderPrefix) {
			continue
		}
		hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: bytes.Clone(h.Value)})
	}
	add := func(k, v string) { hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	add(HeaderRedriveConsumer, e.Consumer)
	add(HeaderRedriveID, redriveID)
	add(HeaderRedriveDLQPartition, strconv.FormatInt(int64(e.Partition), 10))
	add(HeaderRedriveDLQOffset, strconv.FormatInt(e.Offset, 10))
	add(HeaderRedriveSourceOffset, strconv.FormatInt(e.SourceOffset, 10))
	return &kgo.Record{
		Topic:     e.SourceTopic,
		Partition: e.SourcePartition,
		Key:       bytes.Clone(e.Key),
		Value:     bytes.Clone(e.Value),
		Headers:   hs,
	}
}

// Outcome is what a redrive did with one dead letter.
type Outcome string

// Outcomes of Item.
const (
	// OutcomeRedriven: appended to its source partition now.
	OutcomeRedriven Outcome = "redriven"
	// OutcomeWouldRedrive: a dry run's redriven.
	OutcomeWouldRedrive Outcome = "would_redrive"
	// OutcomeSkipped: redriven before (code already_redriven).
	OutcomeSkipped Outcome = "skipped"
	// OutcomeRefused: cannot be redriven (the code and reason say why).
	OutcomeRefused Outcome = "refused"
	// OutcomeCompleted: an earlier redrive's pending dead letter, which
	// this one completed (found it appended, or appended it).
	OutcomeCompleted Outcome = "completed"
	// OutcomePending: recorded, but its produce failed; the next redrive
	// completes it.
	OutcomePending Outcome = "pending"
)

// Item is one dead letter of a redrive's report.
type Item struct {
	Entry   Entry
	Outcome Outcome
	// Code and Reason say why a dead letter was skipped or refused.
	Code   domain.Code
	Reason string
	// RedriveID is the redrive that appended it; Offset where, in the
	// entry's source partition (-1: not appended).
	RedriveID string
	Offset    int64
}

// Report is what a redrive did.
type Report struct {
	// RedriveID is this redrive's id ("" for a dry run).
	RedriveID string
	DryRun    bool
	Items     []Item
}

// Count returns how many items had outcome o.
func (r Report) Count(o Outcome) int {
	n := 0
	for _, it := range r.Items {
		if it.Outcome == o {
			n++
		}
	}
	return n
}

// RedriveMetrics are a redriver's counters. Consumers are the redrivable
// ones (a bounded set); codes are bounded to the shape of a code.
type RedriveMetrics struct {
	redriven *prometheus.CounterVec
	refused  *prometheus.CounterVec
}

// NewRedriveMetrics registers the redrive counters on reg.
func NewRedriveMetrics(reg prometheus.Registerer) *RedriveMetrics {
	m := &RedriveMetrics{
		redriven: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_dlq_redriven_total",
			Help: "Dead letters handed back to their consumer by a redrive, by consumer and the dead letter's error code.",
		}, []string{"consumer", "code"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_dlq_redrive_refused_total",
			Help: "Dead letters a redrive refused to hand back (value withheld, not redrivable), by consumer and refusal code.",
		}, []string{"consumer", "code"}),
	}
	m.redriven = promreg.MustRegister(reg, m.redriven)
	m.refused = promreg.MustRegister(reg, m.refused)
	return m
}

func codeLabel(c domain.Code) string {
	if codeRE.MatchString(string(c)) && len(c) <= 40 {
		return string(c)
	}
	return "other"
}

// RedriveOption configures Redrive.
type RedriveOption func(*redriveConfig)

type redriveConfig struct {
	metrics *RedriveMetrics
	log     *slog.Logger
	now     func() time.Time
}

// WithRedriveMetrics counts redriven and refused dead letters on m.
func WithRedriveMetrics(m *RedriveMetrics) RedriveOption {
	return func(c *redriveConfig) { c.metrics = m }
}

// WithRedriveLogger logs what the redrive does (default: discard).
func WithRedriveLogger(l *slog.Logger) RedriveOption { return func(c *redriveConfig) { c.log = l } }

// WithRedriveClock sets the clock of the recorded times.
func WithRedriveClock(now func() time.Time) RedriveOption {
	return func(c *redriveConfig) { c.now = now }
}

// DefaultRedriveTimeout bounds Redrive when ctx has no deadline. Most of
// a redrive's time is reading: the DLQ, and each source partition from its
// dead letters to its end (the out-of-order check).
const DefaultRedriveTimeout = 10 * time.Minute

// Redrive hands the dead letters sel picks back to their consumer, as
// caller, who must hold the ops scope; pool is the database of the
// projections (dlq_redrives). It first completes what an earlier redrive
// left pending. The report lists every dead letter selected (and every
// one completed) with what happened to it; an error means the redrive
// could not run, or some records could not be produced (their items are
// pending, and the next redrive completes them). It holds one connection
// of pool while it runs.
func Redrive(ctx context.Context, cfg kafka.Config, pool *pgxpool.Pool, caller *domain.Caller, sel Selection, opts ...RedriveOption) (Report, error) {
	c := redriveConfig{log: slog.New(slog.DiscardHandler), now: time.Now}
	for _, o := range opts {
		o(&c)
	}
	if !caller.Has(domain.ScopeOps) {
		return Report{}, domain.Errorf(domain.CodeForbidden, "redriving dead letters needs the %s scope", domain.ScopeOps)
	}
	if err := sel.Check(); err != nil {
		return Report{}, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultRedriveTimeout)
		defer cancel()
	}
	r := &redrive{cfg: cfg, pool: pool, caller: caller, sel: sel, c: c}
	return r.run(ctx)
}
