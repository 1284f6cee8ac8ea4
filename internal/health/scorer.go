// Package health scores mailboxes' sending health from observed warmup
// placement. Scorer is a projection of mailplane.mailbox.observations.v1:
// it folds each warmup_observed into the sending mailbox's mailbox_health
// row with domain.HealthPolicy and, in the same transaction, queues a
// mailbox.health_scored event in the outbox whenever the state changes (the
// placement engine consumes it and moves the mailbox when its risk band
// changes). Ticker evaluates rows whose penalty ended or whose evidence left
// the window, on the wall clock, with no new evidence.
//
// The projection's Apply is a function of the events and the rows (its
// clock is each observation's ce_time, its event ids derive from the
// observation's), so a replay computes the same rows and the same events.
// A rebuild must not publish them again: it runs the scorer
// WithoutPublishing (internal/rebuild), which queues nothing.
package health

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/topics"
)

// Name is the scorer projection's name.
const Name = "health"

// Source is the ce_source of the events the scorer emits.
const Source = "mailplane/health-scorer"

// Scorer is the health projection.
type Scorer struct {
	policy    domain.HealthPolicy
	emitted   func(ev domain.Event)
	now       func() time.Time
	noPublish bool
}

// ScorerOption configures a Scorer.
type ScorerOption func(*Scorer)

// WithEmitted calls fn for every event the scorer queued, after the
// transaction's statements ran (metrics, tests). The transaction may still
// roll back.
func WithEmitted(fn func(domain.Event)) ScorerOption { return func(s *Scorer) { s.emitted = fn } }

// WithScorerClock sets the clock bounding observations' record timestamps
// (default time.Now): a record stamped ahead of it is scored at its
// reading, so one record written straight to the topic with a far-future
// stamp cannot move a mailbox's scoring clock, and the end of the penalty
// it earns, years ahead.
func WithScorerClock(now func() time.Time) ScorerOption { return func(s *Scorer) { s.now = now } }

// WithoutPublishing folds the rows and queues no event: a rebuild of the
// projection from the log (mailplane rebuild health) computes the rows the
// live scorer did without publishing history again.
func WithoutPublishing() ScorerOption { return func(s *Scorer) { s.noPublish = true } }

// NewScorer returns the scorer with policy.
func NewScorer(policy domain.HealthPolicy, opts ...ScorerOption) (*Scorer, error) {
	if err := policy.Validate(); err != nil {
		return nil, err
	}
	s := &Scorer{policy: policy, now: time.Now}
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// Name implements projections.Projection.
func (*Scorer) Name() string { return Name }

// Topics implements projections.Projection.
func (*Scorer) Topics() []string { return []string{topics.MailboxObservations} }

// Apply implements projections.Projection.
func (s *Scorer) Apply(ctx context.Context, tx pgx.Tx, in []projections.Record) error {
	events := projections.Events(in)
	var ids []string
	seen := map[string]bool{}
	for _, e := range events {
		if _, ok := e.Data.(*domain.WarmupObserved); ok && !seen[e.Subject] {
			seen[e.Subject] = true
			ids = append(ids, e.Subject)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	recs, err := load(ctx, tx, ids, false)
	if err != nil {
		return err
	}
	var (
		out     []*kgo.Record
		emitted []domain.Event
		counts  = map[string]int64{}
		changed = map[string]time.Time{}
	)
	for _, e := range events {
		o, ok := e.Data.(*domain.WarmupObserved)
		if !ok {
			continue
		}
		r := recs[o.MailboxID]
		if r == nil {
			r = &domain.HealthRecord{MailboxID: o.MailboxID}
			recs[o.MailboxID] = r
		}
		next, scored := s.policy.Observe(*r, o, s.observedAt(e))
		*r = next
		counts[o.MailboxID]++
		if scored != nil {
			ev := domain.Event{ID: domain.DerivedID(r.LastEval, "mailplane.health.scored-id.v1", e.Key()), Type: domain.TypeMailboxHealthScored,
				Source: Source, Time: r.LastEval, Subject: o.MailboxID, Data: scored}
			rec, err := topics.Encode(ev)
			if err != nil {
				return fmt.Errorf("health: encode: %w", err)
			}
			out = append(out, rec)
			emitted = append(emitted, ev)
			changed[o.MailboxID] = r.LastEval
		}
	}
	if err := save(ctx, tx, s.policy, recs, ids, counts, changed); err != nil {
		return err
	}
	if s.noPublish {
		return nil
	}
	if err := outbox.Add(ctx, tx, out...); err != nil {
		return err
	}
	if s.emitted != nil {
		for _, ev := range emitted {
			s.emitted(ev)
		}
	}
	return nil
}

const loadSQL = `SELECT mailbox_id::text, state, until, penalty_seconds, probation, score,
       bucket_hours, bucket_inbox, bucket_junk, last_eval
FROM mailbox_health WHERE mailbox_id = ANY($1::uuid[]) ORDER BY mailbox_id`

// load reads and locks the rows of ids (skipping locked ones when skip).
func load(ctx context.Context, tx pgx.Tx, ids []string, skip bool) (map[string]*domain.HealthRecord, error) {
	q := loadSQL + " FOR UPDATE"
	if skip {
		q += " SKIP LOCKED"
	}
	rows, err := tx.Query(ctx, q, ids)
	if err != nil {
		return nil, fmt.Errorf("health: load: %w", err)
	}
	return scanRecords(rows)
}

func scanRecords(rows pgx.Rows) (map[string]*domain.HealthRecord, error) {
	out := map[string]*domain.HealthRecord{}
	var (
		id, state   string
		until       *time.Time
		penalty     int64
		probation   bool
		score       float64
		hours       []int64
		inbox, junk []int32
		lastEval    time.Time
	)
	_, err := pgx.ForEachRow(rows, []any{&id, &state, &until, &penalty, &probation, &score, &hours, &inbox, &junk, &lastEval}, func() error {
		r := &domain.HealthRecord{MailboxID: id, State: domain.HealthState(state), PenaltyFor: time.Duration(penalty) * time.Second,
			Probation: probation, Score: score, LastEval: lastEval.UTC()}
		if until != nil {
			r.Until = until.UTC()
		}
		if len(hours) != len(inbox) || len(hours) != len(junk) {
			return fmt.Errorf("health: mailbox %s: bucket arrays differ in length", id)
		}
		for i := range hours {
			r.Buckets = append(r.Buckets, domain.HealthBucket{Hour: hours[i], Inbox: inbox[i], Junk: junk[i]})
		}
		out[id] = r
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("health: load: %w", err)
	}
	return out, nil
}

// saveSQL upserts the rows (one statement; bucket arrays travel as text
// since Postgres cannot unnest arrays of arrays of differing lengths).
const saveSQL = `INSERT INTO mailbox_health AS h (mailbox_id, state, until, penalty_seconds, probation, score,
    bucket_hours, bucket_inbox, bucket_junk, observations, last_eval, next_check, changed_at)
SELECT u.id, u.state, u.until, u.penalty, u.probation, u.score,
       u.hours::bigint[], u.inbox::integer[], u.junk::integer[], u.added, u.last_eval, u.next_check, u.changed_at
FROM unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::bigint[], $5::boolean[], $6::float8[],
            $7::text[], $8::text[], $9::text[], $10::bigint[], $11::timestamptz[], $12::timestamptz[], $13::timestamptz[])
     AS u(id, state, until, penalty, probation, score, hours, inbox, junk, added, last_eval, next_check, changed_at)
ON CONFLICT (mailbox_id) DO UPDATE SET
    state = EXCLUDED.state, until = EXCLUDED.until, penalty_seconds = EXCLUDED.penalty_seconds,
    probation = EXCLUDED.probation, score = EXCLUDED.score, bucket_hours = EXCLUDED.bucket_hours,
    bucket_inbox = EXCLUDED.bucket_inbox, bucket_junk = EXCLUDED.bucket_junk,
    observations = h.observations + EXCLUDED.observations, last_eval = EXCLUDED.last_eval,
    next_check = EXCLUDED.next_check, changed_at = COALESCE(EXCLUDED.changed_at, h.changed_at)`

// save writes the records of ids. added counts new observations per
// mailbox; changed holds the time of each state change.
func save(ctx context.Context, tx pgx.Tx, p domain.HealthPolicy, recs map[string]*domain.HealthRecord, ids []string,
	added map[string]int64, changed map[string]time.Time) error {
	n := len(ids)
	var (
		states             = make([]string, n)
		untils             = make([]*time.Time, n)
		penalties          = make([]int64, n)
		probations         = make([]bool, n)
		scores             = make([]float64, n)
		hours, inbox, junk = make([]string, n), make([]string, n), make([]string, n)
		adds               = make([]int64, n)
		lastEvals          = make([]time.Time, n)
		nexts              = make([]*time.Time, n)
		changes            = make([]*time.Time, n)
	)
	for i, id := range ids {
		r := recs[id]
		states[i] = string(r.CurrentState())
		if !r.Until.IsZero() {
			u := r.Until
			untils[i] = &u
		}
		penalties[i] = int64(r.PenaltyFor / time.Second)
		probations[i] = r.Probation
		scores[i] = r.Score
		hours[i], inbox[i], junk[i] = bucketArrays(r.Buckets)
		adds[i] = added[id]
		lastEvals[i] = r.LastEval
		if nc := p.NextCheck(*r); !nc.IsZero() {
			nexts[i] = &nc
		}
		if c, ok := changed[id]; ok {
			changes[i] = &c
		}
	}
	_, err := tx.Exec(ctx, saveSQL, ids, states, untils, penalties, probations, scores, hours, inbox, junk, adds, lastEvals, nexts, changes)
	if err != nil {
		return fmt.Errorf("health: save: %w", err)
	}
	return nil
}

// bucketArrays renders the buckets as three Postgres array literals.
func bucketArrays(bs []domain.HealthBucket) (hours, inbox, junk string) {
	h, in, j := []byte{'{'}, []byte{'{'}, []byte{'{'}
	for i, b := range bs {
		if i > 0 {
			h, in, j = append(h, ','), append(in, ','), append(j, ',')
		}
		h = fmt.Appendf(h, "%d", b.Hour)
		in = fmt.Appendf(in, "%d", b.Inbox)
		j = fmt.Appendf(j, "%d", b.Junk)
	}
	return string(append(h, '}')), string(append(in, '}')), string(append(j, '}'))
}

// observedAt is the scorer's clock for an observation: the time mailplane
// received it (its record timestamp: the sync runner's outbox relay, or the
// ingest API), not the time its producer claims; the claim, and landed_at,
// can only be earlier (Observe bounds landed_at by it). A stamp ahead of
// the scorer's clock counts as the clock's reading (domain.TrustedTime):
// only a writer straight to the topic makes one, and replaying such a
// record later scores it at that later reading. Events not read from a
// record (none in production) fall back to their own time.
func (s *Scorer) observedAt(e domain.Event) time.Time {
	if e.Logged.IsZero() {
		return e.Time
	}
	return domain.TrustedTime(e.Logged, s.now())
}
