// Package query is the fleet's read model: what is known of one mailbox,
// one org and the sending workers, gathered from the projections in
// Postgres. Each answer is read in one read-only repeatable-read
// transaction (one snapshot), so a page never mixes two moments; only a
// mailbox's sync tier, which the sync fleet keeps in Kafka (sync.tier),
// is read from the broker beside it. The JSON
// query API (GET /v1/mailboxes/{id}, /v1/orgs/{id}, /v1/workers, mounted
// by Register) and the ops console (internal/console) both read through
// it, so they show the same facts.
//
// It owns no table: placement facts come through postgres.Store (the
// one reader of the placement tables), the rest from the registry,
// health and sync tables as their writers leave them
// (docs/architecture.md §2).
package query

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/topics"
)

// ErrNotFound says no projection knows the id asked for.
var ErrNotFound = domain.Errorf(domain.CodeNotFound, "no projection knows that id")

// DB begins transactions; *pgxpool.Pool is one.
type DB interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Reader reads the fleet's facts.
type Reader struct {
	db              DB
	statePartitions int
	now             func() time.Time
	tiers           *kafka.Config
	log             *slog.Logger
}

// Option configures a Reader.
type Option func(*Reader)

// WithSyncTiers reads each mailbox's sync tier from the sync.tier topic
// through kcfg (the tier is the sync fleet's, kept in Kafka, not Postgres).
// Without it the tier is not read.
func WithSyncTiers(kcfg kafka.Config) Option { return func(r *Reader) { r.tiers = &kcfg } }

// WithLogger sets where a failed tier read is logged (default: discard).
func WithLogger(l *slog.Logger) Option { return func(r *Reader) { r.log = l } }

// WithClock sets the clock the sync lag is measured with.
func WithClock(now func() time.Time) Option { return func(r *Reader) { r.now = now } }

// NewReader reads through db (whose search_path selects the schema).
// statePartitions is mailbox.state's partition count, which tells the
// sync partition (and so the owner) of a mailbox.
func NewReader(db DB, statePartitions int, opts ...Option) *Reader {
	r := &Reader{db: db, statePartitions: statePartitions, now: time.Now, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(r)
	}
	return r
}

// MaxOrgMailboxes bounds the mailboxes an org's answer lists.
const MaxOrgMailboxes = 500

// PendingShown is how many pending placements the workers' answer lists.
const PendingShown = 50

// CheckID refuses an id that is not a canonical lower-case UUID, which
// also refuses control characters and overlong input before any query.
func CheckID(what, id string) error {
	if !domain.IsUUID(id) {
		return domain.Errorf(domain.CodeInvalid, "%s id must be a lower-case UUID", what)
	}
	return nil
}

// read runs fn in one read-only repeatable-read transaction.
func (r *Reader) read(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := r.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("query: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	return fn(tx)
}

// inTx lets postgres.Store read inside our transaction: its "begin" is
// a savepoint of tx, which shares tx's snapshot.
type inTx struct{ tx pgx.Tx }

func (s inTx) BeginTx(ctx context.Context, _ pgx.TxOptions) (pgx.Tx, error) { return s.tx.Begin(ctx) }

// Mailbox is everything known of one mailbox.
type Mailbox struct {
	ID       string           `json:"mailbox_id"`
	Registry *MailboxRegistry `json:"registry"`
	// Placement is its band, worker and decision history.
	Placement postgres.MailboxStory `json:"placement"`
	Health    *Health               `json:"health"`
	// HealthDecision is the last health decision and why (nil: none).
	HealthDecision *HealthDecision `json:"health_decision"`
	Sync           Sync            `json:"sync"`
}

// HealthDecision is a mailbox's last mailbox.health_scored as the
// registry folded it: the state, until when, the evidence it was decided
// from, and the sentence a support agent can give the customer
// (domain.ExplainHealth).
type HealthDecision struct {
	State string     `json:"state"`
	Until *time.Time `json:"until"`
	// Evidence is nil for a decision written before decisions carried it.
	Evidence *DecisionEvidence `json:"evidence"`
	Sentence string            `json:"sentence"`
}

// DecisionEvidence is the decision's evidence with the window's total.
type DecisionEvidence struct {
	domain.HealthEvidence
	Total int64 `json:"total"`
}

// MailboxRegistry is the registry's row of a mailbox (never its
// credentials).
type MailboxRegistry struct {
	OrgID          string     `json:"org_id"`
	UserID         string     `json:"user_id"`
	Address        string     `json:"address"`
	Provider       string     `json:"provider"`
	WarmupEnabled  bool       `json:"warmup_enabled"`
	AddedAt        *time.Time `json:"added_at"`
	RemovedAt      *time.Time `json:"removed_at"`
	RemovalReason  string     `json:"removal_reason"`
	DisabledAt     *time.Time `json:"disabled_at"`
	DisabledReason string     `json:"disabled_reason"`
	UpdatedAt      time.Time  `json:"updated_at"`
}

// Health is the health scorer's row of a mailbox.
type Health struct {
	State        string     `json:"state"`
	Score        float64    `json:"score"`
	Until        *time.Time `json:"until"`
	Probation    bool       `json:"probation"`
	Observations int64      `json:"observations"`
	LastEval     time.Time  `json:"last_eval"`
	ChangedAt    *time.Time `json:"changed_at"`
	// Evidence is the warmup mail that landed, per hour, oldest first,
	// within the scoring window.
	Evidence []EvidenceHour `json:"evidence"`
}

// EvidenceHour is the warmup mail of one hour.
type EvidenceHour struct {
	Hour  time.Time `json:"hour"`
	Inbox int64     `json:"inbox"`
	Junk  int64     `json:"junk"`
}

// Sync is where a mailbox's sync stands.
type Sync struct {
	// Partition is its mailbox.state partition; Owner the sync worker
	// holding it (empty when none has) since OwnerSince, at Epoch.
	Partition  int32      `json:"partition"`
	Owner      string     `json:"owner"`
	Epoch      int64      `json:"epoch"`
	OwnerSince *time.Time `json:"owner_since"`
	// LastSyncAt is the newest folder sync; LagSeconds the time since.
	LastSyncAt *time.Time `json:"last_sync_at"`
	LagSeconds *float64   `json:"lag_seconds"`
	Folders    []Folder   `json:"folders"`
	// Login outcomes: AuthFailingSince is set while logins are refused.
	LastLoginAt        *time.Time `json:"last_login_at"`
	AuthFailingSince   *time.Time `json:"auth_failing_since"`
	LastAuthError      string     `json:"last_auth_error"`
	DisableRequestedAt *time.Time `json:"disable_requested_at"`
	// Tier is the mailbox's sync tier as its owner last decided it (nil
	// when none has, or when it was not read); TierUnavailable says the
	// broker did not answer.
	Tier            *SyncTier `json:"tier"`
	TierUnavailable bool      `json:"tier_unavailable"`
}

// SyncTier is a mailbox's sync tier (hot, warm or cold) and why.
type SyncTier struct {
	Tier      string    `json:"tier"`
	Reason    string    `json:"reason"`
	Owner     string    `json:"owner"`
	Epoch     int64     `json:"epoch"`
	ChangedAt time.Time `json:"changed_at"`
}

// Folder is one synced folder's cursor.
type Folder struct {
	Folder   string    `json:"folder"`
	Role     string    `json:"role"`
	LastUID  int64     `json:"last_uid"`
	SyncedAt time.Time `json:"synced_at"`
}

const (
	sqlMailboxRegistry = `SELECT COALESCE(org_id::text, ''), COALESCE(user_id::text, ''), COALESCE(address, ''), COALESCE(provider, ''),
    COALESCE(warmup_enabled, false), added_at, removed_at, COALESCE(removal_reason, ''), disabled_at, COALESCE(disabled_reason, ''), updated_at
FROM mailboxes WHERE mailbox_id = $1`
	sqlMailboxHealth = `SELECT state, score, until, probation, observations, last_eval, changed_at, bucket_hours, bucket_inbox, bucket_junk
FROM mailbox_health WHERE mailbox_id = $1`
	sqlHealthDecision = `SELECT health_state, health_until, health_evidence FROM mailboxes
WHERE mailbox_id = $1 AND health_state IS NOT NULL`
	sqlSyncOwner = `SELECT owner, epoch, acquired_at FROM sync_partitions WHERE partition = $1`
	sqlFolders   = `SELECT folder, role, last_uid, synced_at FROM imap_folder_cursors WHERE mailbox_id = $1 ORDER BY folder`
	sqlLogin     = `SELECT last_login_at, auth_failing_since, COALESCE(last_auth_error, ''), disable_requested_at
FROM imap_mailbox_status WHERE mailbox_id = $1`
)

// Mailbox reads one mailbox; ErrNotFound when no projection knows it.
func (r *Reader) Mailbox(ctx context.Context, id string) (Mailbox, error) {
	if err := CheckID("mailbox", id); err != nil {
		return Mailbox{}, err
	}
	m := Mailbox{ID: id, Sync: Sync{Folders: []Folder{}}}
	err := r.read(ctx, func(tx pgx.Tx) error {
		var reg MailboxRegistry
		err := tx.QueryRow(ctx, sqlMailboxRegistry, id).Scan(&reg.OrgID, &reg.UserID, &reg.Address, &reg.Provider,
			&reg.WarmupEnabled, &reg.AddedAt, &reg.RemovedAt, &reg.RemovalReason, &reg.DisabledAt, &reg.DisabledReason, &reg.UpdatedAt)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return fmt.Errorf("query: mailbox registry: %w", err)
		default:
			m.Registry = &reg
		}
		if m.Placement, err = postgres.NewStore(inTx{tx}).Mailbox(ctx, id); err != nil {
			return err
		}
		if m.Health, err = readHealth(ctx, tx, id); err != nil {
			return err
		}
		if m.HealthDecision, err = readHealthDecision(ctx, tx, id); err != nil {
			return err
		}
		return r.readSync(ctx, tx, id, &m.Sync)
	})
	if err != nil {
		return Mailbox{}, err
	}
	if m.Placement.History == nil {
		m.Placement.History = []postgres.HistoryRow{}
	}
	if m.Registry == nil && !m.Placement.Placed && len(m.Placement.History) == 0 && m.Health == nil {
		return Mailbox{}, ErrNotFound
	}
	if r.tiers != nil {
		m.Sync.Tier, err = r.readTier(ctx, id)
		if err != nil {
			r.log.Warn("reading a mailbox's sync tier failed", "err", err)
			m.Sync.TierUnavailable = true
		}
	}
	return m, nil
}

// tierTimeout bounds the read of one sync.tier partition.
const tierTimeout = 5 * time.Second

// readTier reads the mailbox's sync.tier partition (co-partitioned with
// mailbox.state) to its end, folding its records as the sync fleet does
// (mailsync.FoldTierRecord).
func (r *Reader) readTier(ctx context.Context, id string) (*SyncTier, error) {
	tiers := map[string]domain.SyncTierRecord{}
	_, err := kafka.ReadToEnd(ctx, *r.tiers, kafka.ReadSpec{
		Topics:     []string{r.tiers.Topic(topics.SyncTier)},
		Partitions: func(_ string, n int) []int32 { return []int32{StatePartition(id, n)} },
		ClientID:   "query-tier",
		Timeout:    tierTimeout,
	}, func(rec *kgo.Record) error {
		if string(rec.Key) == id {
			_ = mailsync.FoldTierRecord(tiers, rec) // a record that does not decode is skipped, as sync does
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("query: sync tier: %w", err)
	}
	t, ok := tiers[id]
	if !ok {
		return nil, nil
	}
	return &SyncTier{Tier: string(t.Tier), Reason: t.Reason, Owner: t.Owner, Epoch: t.Epoch, ChangedAt: t.ChangedAt}, nil
}

func readHealth(ctx context.Context, tx pgx.Tx, id string) (*Health, error) {
	var h Health
	var hours []int64
	var inbox, junk []int32
	err := tx.QueryRow(ctx, sqlMailboxHealth, id).Scan(&h.State, &h.Score, &h.Until, &h.Probation, &h.Observations,
		&h.LastEval, &h.ChangedAt, &hours, &inbox, &junk)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("query: mailbox health: %w", err)
	}
	h.Evidence = make([]EvidenceHour, 0, len(hours))
	for i, hr := range hours {
		if i >= len(inbox) || i >= len(junk) {
			break // the table's CHECK keeps them parallel
		}
		h.Evidence = append(h.Evidence, EvidenceHour{Hour: time.Unix(hr*3600, 0).UTC(), Inbox: int64(inbox[i]), Junk: int64(junk[i])})
	}
	return &h, nil
}

func readHealthDecision(ctx context.Context, tx pgx.Tx, id string) (*HealthDecision, error) {
	var (
		d        HealthDecision
		evidence []byte
	)
	err := tx.QueryRow(ctx, sqlHealthDecision, id).Scan(&d.State, &d.Until, &evidence)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("query: health decision: %w", err)
	}
	var e *domain.HealthEvidence
	if evidence != nil {
		e = new(domain.HealthEvidence)
		if err := json.Unmarshal(evidence, e); err != nil {
			return nil, fmt.Errorf("query: health decision evidence: %w", err)
		}
		d.Evidence = &DecisionEvidence{HealthEvidence: *e, Total: e.Total()}
	}
	d.Sentence = domain.ExplainHealth(domain.HealthState(d.State), d.Until, e)
	return &d, nil
}

func (r *Reader) readSync(ctx context.Context, tx pgx.Tx, id string, s *Sync) error {
	s.Partition = StatePartition(id, r.statePartitions)
	var since time.Time
	err := tx.QueryRow(ctx, sqlSyncOwner, s.Partition).Scan(&s.Owner, &s.Epoch, &since)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("query: sync owner: %w", err)
	default:
		s.OwnerSince = &since
	}
	rows, _ := tx.Query(ctx, sqlFolders, id)
	var f Folder
	if _, err := pgx.ForEachRow(rows, []any{&f.Folder, &f.Role, &f.LastUID, &f.SyncedAt}, func() error {
		s.Folders = append(s.Folders, f)
		if s.LastSyncAt == nil || f.SyncedAt.After(*s.LastSyncAt) {
			t := f.SyncedAt
			s.LastSyncAt = &t
		}
		return nil
	}); err != nil {
		return fmt.Errorf("query: folders: %w", err)
	}
	if s.LastSyncAt != nil {
		lag := max(0, r.now().Sub(*s.LastSyncAt).Seconds())
		s.LagSeconds = &lag
	}
	err = tx.QueryRow(ctx, sqlLogin, id).Scan(&s.LastLoginAt, &s.AuthFailingSince, &s.LastAuthError, &s.DisableRequestedAt)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("query: login status: %w", err)
	}
	return nil
}

// StatePartition is the mailbox.state partition of a mailbox among n, as
// the mailbox.state processor's producer places it (murmur2 of the key).
func StatePartition(mailboxID string, n int) int32 {
	if n <= 0 {
		return 0
	}
	place := kgo.StickyKeyPartitioner(nil).ForTopic(topics.MailboxState)
	return int32(place.Partition(&kgo.Record{Key: []byte(mailboxID)}, n))
}

// Org is what is known of one org.
type Org struct {
	ID string `json:"org_id"`
	// Plan is the registry's row (nil before any org event); Class the
	// placement engine's view of it.
	Plan  *OrgPlan `json:"plan"`
	Class string   `json:"class"`
	// DedicatedBound counts the dedicated workers serving the org.
	DedicatedBound int64 `json:"dedicated_bound"`
	// Mailboxes counts its mailboxes in the registry (removed ones
	// excluded), by health state in Health ("unscored" for none yet).
	Mailboxes int64            `json:"mailboxes"`
	Disabled  int64            `json:"disabled"`
	Health    map[string]int64 `json:"health"`
	// List holds at most MaxOrgMailboxes of them, by id; Truncated says
	// more exist.
	List      []OrgMailbox `json:"list"`
	Truncated bool         `json:"truncated"`
}

// OrgPlan is the registry's row of an org.
type OrgPlan struct {
	Plan             string    `json:"plan"`
	DedicatedWorkers int64     `json:"dedicated_workers"`
	Paid             bool      `json:"paid"`
	Source           string    `json:"source"`
	UpdatedAt        time.Time `json:"updated_at"`
}

// OrgMailbox is one mailbox of an org.
type OrgMailbox struct {
	ID             string `json:"mailbox_id"`
	Address        string `json:"address"`
	HealthState    string `json:"health_state"`
	Band           string `json:"band"`
	WorkerID       string `json:"worker_id"`
	DisabledReason string `json:"disabled_reason"`
}

const (
	sqlOrgPlan   = `SELECT plan, dedicated_workers, paid, source, updated_at FROM orgs WHERE org_id = $1`
	sqlOrgClass  = `SELECT class FROM placement_org_classes WHERE org_id = $1`
	sqlOrgBound  = `SELECT count(*) FROM placement_workers WHERE dedicated_org = $1 AND tier = 'dedicated' AND NOT releasing`
	sqlOrgCount  = `SELECT count(*), count(*) FILTER (WHERE disabled_at IS NOT NULL) FROM mailboxes WHERE org_id = $1 AND removed_at IS NULL`
	sqlOrgHealth = `SELECT COALESCE(h.state, 'unscored'), count(*) FROM mailboxes m LEFT JOIN mailbox_health h USING (mailbox_id)
WHERE m.org_id = $1 AND m.removed_at IS NULL GROUP BY 1 ORDER BY 1`
	sqlOrgList = `SELECT m.mailbox_id::text, COALESCE(m.address, ''), COALESCE(h.state, ''), COALESCE(p.band, ''),
    COALESCE(p.worker_id::text, ''), COALESCE(m.disabled_reason, '')
FROM mailboxes m
LEFT JOIN mailbox_health h USING (mailbox_id)
LEFT JOIN placement_mailboxes p USING (mailbox_id)
WHERE m.org_id = $1 AND m.removed_at IS NULL
ORDER BY m.mailbox_id LIMIT $2`
	sqlOrgKnown = `SELECT EXISTS (SELECT 1 FROM placement_orgs WHERE org_id = $1)
    OR EXISTS (SELECT 1 FROM placement_mailboxes WHERE org_id = $1)`
)

// Org reads one org; ErrNotFound when no projection knows it.
func (r *Reader) Org(ctx context.Context, id string) (Org, error) {
	if err := CheckID("org", id); err != nil {
		return Org{}, err
	}
	o := Org{ID: id, Health: map[string]int64{}, List: []OrgMailbox{}}
	var known bool // by placement, when the registry has nothing
	err := r.read(ctx, func(tx pgx.Tx) error {
		var p OrgPlan
		err := tx.QueryRow(ctx, sqlOrgPlan, id).Scan(&p.Plan, &p.DedicatedWorkers, &p.Paid, &p.Source, &p.UpdatedAt)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return fmt.Errorf("query: org: %w", err)
		default:
			o.Plan = &p
		}
		if err := tx.QueryRow(ctx, sqlOrgClass, id).Scan(&o.Class); err != nil {
			if !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("query: org class: %w", err)
			}
			o.Class = "free" // an org the engine never recorded is free (0005_placement.sql)
		}
		if err := tx.QueryRow(ctx, sqlOrgBound, id).Scan(&o.DedicatedBound); err != nil {
			return fmt.Errorf("query: org workers: %w", err)
		}
		if err := tx.QueryRow(ctx, sqlOrgCount, id).Scan(&o.Mailboxes, &o.Disabled); err != nil {
			return fmt.Errorf("query: org mailboxes: %w", err)
		}
		rows, _ := tx.Query(ctx, sqlOrgHealth, id)
		var state string
		var n int64
		if _, err := pgx.ForEachRow(rows, []any{&state, &n}, func() error { o.Health[state] = n; return nil }); err != nil {
			return fmt.Errorf("query: org health: %w", err)
		}
		rows, _ = tx.Query(ctx, sqlOrgList, id, MaxOrgMailboxes+1)
		var m OrgMailbox
		if _, err := pgx.ForEachRow(rows, []any{&m.ID, &m.Address, &m.HealthState, &m.Band, &m.WorkerID, &m.DisabledReason}, func() error {
			o.List = append(o.List, m)
			return nil
		}); err != nil {
			return fmt.Errorf("query: org list: %w", err)
		}
		if len(o.List) > MaxOrgMailboxes {
			o.List, o.Truncated = o.List[:MaxOrgMailboxes], true
		}
		return tx.QueryRow(ctx, sqlOrgKnown, id).Scan(&known)
	})
	if err != nil {
		return Org{}, err
	}
	if o.Plan == nil && o.Mailboxes == 0 && !known {
		return Org{}, ErrNotFound
	}
	return o, nil
}

// Workers reads the sending workers by tier and pool with the pools'
// load against capacity and the oldest pending placements: the placement
// projection's overview (postgres.Store.Overview, its own snapshot).
func (r *Reader) Workers(ctx context.Context) (postgres.Overview, error) {
	o, err := postgres.NewStore(r.db).Overview(ctx, true, PendingShown)
	if err != nil {
		return o, err
	}
	// Empty lists, not null, for scripts and the OpenAPI document.
	if o.Pools == nil {
		o.Pools = []postgres.PoolRow{}
	}
	if o.Workers == nil {
		o.Workers = []postgres.WorkerRow{}
	}
	if o.Shortfalls == nil {
		o.Shortfalls = []postgres.Shortfall{}
	}
	if o.Pending == nil {
		o.Pending = []postgres.PendingRow{}
	}
	return o, nil
}
