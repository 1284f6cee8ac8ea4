package projections

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

// Registry is the projection of the registry of facts: the tables
// mailboxes, orgs, users and workers (migration 0002), from the seven domain
// event types. Every timestamp it writes is an event's ce_time.
type Registry struct{}

// NewRegistry returns the registry projection.
func NewRegistry() *Registry { return &Registry{} }

// RegistryName is the registry projection's name.
const RegistryName = "registry"

// Name implements Projection.
func (*Registry) Name() string { return RegistryName }

// Topics implements Projection: the four domain topics.
func (*Registry) Topics() []string { return topics.DomainTopics() }

// A staging table per registry table, created once per session and emptied
// at every commit, so a batch costs no catalog churn. LIKE copies the column
// types.
const (
	stageMailboxes = `CREATE TEMP TABLE IF NOT EXISTS registry_stage_mailboxes (LIKE mailboxes) ON COMMIT DELETE ROWS`
	stageOrgs      = `CREATE TEMP TABLE IF NOT EXISTS registry_stage_orgs (LIKE orgs) ON COMMIT DELETE ROWS`
	stageUsers     = `CREATE TEMP TABLE IF NOT EXISTS registry_stage_users (LIKE users) ON COMMIT DELETE ROWS`
	stageWorkers   = `CREATE TEMP TABLE IF NOT EXISTS registry_stage_workers (LIKE workers) ON COMMIT DELETE ROWS`
)

// target is one of the registry's tables and the statements that reach it.
type target struct {
	table, stage string
	create       string   // creates stage
	existing     string   // which of the keys in $1 have rows
	merge        string   // stage into table
	columns      []string // the key first
	types        []colType
	// COPY statements into table and stage.
	copyTable, copyStage string
}

func newTarget(table, stage, create, existing, merge string, columns []string, types []colType) *target {
	if len(types) != len(columns) {
		panic("registry: " + table + ": a type per column")
	}
	return &target{table, stage, create, existing, merge, columns, types,
		copySQL(table, columns), copySQL(stage, columns)}
}

var (
	mailboxesTarget = newTarget("mailboxes", "registry_stage_mailboxes", stageMailboxes,
		`SELECT mailbox_id FROM mailboxes WHERE mailbox_id = ANY($1)`, mergeMailboxesSQL, mailboxColumns, mailboxTypes)
	orgsTarget = newTarget("orgs", "registry_stage_orgs", stageOrgs,
		`SELECT org_id FROM orgs WHERE org_id = ANY($1)`, mergeOrgsSQL, orgColumns, orgTypes)
	usersTarget = newTarget("users", "registry_stage_users", stageUsers,
		`SELECT user_id FROM users WHERE user_id = ANY($1)`, mergeUsersSQL, userColumns, userTypes)
	workersTarget = newTarget("workers", "registry_stage_workers", stageWorkers,
		`SELECT worker_id FROM workers WHERE worker_id = ANY($1)`, mergeWorkersSQL, workerColumns, workerTypes)
)

var mailboxColumns = []string{
	"mailbox_id", "org_id", "user_id", "address", "provider", "warmup_enabled",
	"imap_host", "imap_port", "imap_tls", "imap_username", "sealed_credentials",
	"health_state", "health_score", "health_reason", "health_until",
	"removed_at", "removal_reason", "added_at", "updated_at", "last_event_id",
}

// A group of columns the batch did not touch arrives as NULLs and keeps the
// stored values: added_at flags the identity group, health_state the health
// group; the removal group is touched by a removal or by an add (which
// clears it).
const mergeMailboxesSQL = `INSERT INTO mailboxes AS m (` + `
    mailbox_id, org_id, user_id, address, provider, warmup_enabled,
    imap_host, imap_port, imap_tls, imap_username, sealed_credentials,
    health_state, health_score, health_reason, health_until,
    removed_at, removal_reason, added_at, updated_at, last_event_id)
SELECT mailbox_id, org_id, user_id, address, provider, warmup_enabled,
    imap_host, imap_port, imap_tls, imap_username, sealed_credentials,
    health_state, health_score, health_reason, health_until,
    removed_at, removal_reason, added_at, updated_at, last_event_id
FROM registry_stage_mailboxes
ON CONFLICT (mailbox_id) DO UPDATE SET
    org_id             = CASE WHEN EXCLUDED.added_at IS NOT NULL THEN EXCLUDED.org_id ELSE m.org_id END,
    user_id            = CASE WHEN EXCLUDED.added_at IS NOT NULL THEN EXCLUDED.user_id ELSE m.user_id END,
    address            = CASE WHEN EXCLUDED.added_at IS NOT NULL THEN EXCLUDED.address ELSE m.address END,
    provider           = CASE WHEN EXCLUDED.added_at IS NOT NULL THEN EXCLUDED.provider ELSE m.provider END,
    warmup_enabled     = CASE WHEN EXCLUDED.added_at IS NOT NULL THEN EXCLUDED.warmup_enabled ELSE m.warmup_enabled END,
    imap_host          = CASE WHEN EXCLUDED.added_at IS NOT NULL THEN EXCLUDED.imap_host ELSE m.imap_host END,
    imap_port          = CASE WHEN EXCLUDED.added_at IS NOT NULL THEN EXCLUDED.imap_port ELSE m.imap_port END,
    imap_tls           = CASE WHEN EXCLUDED.added_at IS NOT NULL THEN EXCLUDED.imap_tls ELSE m.imap_tls END,
    imap_username      = CASE WHEN EXCLUDED.added_at IS NOT NULL THEN EXCLUDED.imap_username ELSE m.imap_username END,
    sealed_credentials = CASE WHEN EXCLUDED.added_at IS NOT NULL THEN EXCLUDED.sealed_credentials ELSE m.sealed_credentials END,
    added_at           = COALESCE(EXCLUDED.added_at, m.added_at),
    health_state       = COALESCE(EXCLUDED.health_state, m.health_state),
    health_score       = CASE WHEN EXCLUDED.health_state IS NOT NULL THEN EXCLUDED.health_score ELSE m.health_score END,
    health_reason      = CASE WHEN EXCLUDED.health_state IS NOT NULL THEN EXCLUDED.health_reason ELSE m.health_reason END,
    health_until       = CASE WHEN EXCLUDED.health_state IS NOT NULL THEN EXCLUDED.health_until ELSE m.health_until END,
    removed_at         = CASE WHEN EXCLUDED.added_at IS NOT NULL OR EXCLUDED.removed_at IS NOT NULL
                              THEN EXCLUDED.removed_at ELSE m.removed_at END,
    removal_reason     = CASE WHEN EXCLUDED.added_at IS NOT NULL OR EXCLUDED.removed_at IS NOT NULL
                              THEN EXCLUDED.removal_reason ELSE m.removal_reason END,
    updated_at         = EXCLUDED.updated_at,
    last_event_id      = EXCLUDED.last_event_id`

var orgColumns = []string{"org_id", "plan", "dedicated_workers", "paid", "source", "updated_at"}

const mergeOrgsSQL = `INSERT INTO orgs AS o (org_id, plan, dedicated_workers, paid, source, updated_at)
SELECT org_id, plan, dedicated_workers, paid, source, updated_at FROM registry_stage_orgs
ON CONFLICT (org_id) DO UPDATE SET
    plan = EXCLUDED.plan, dedicated_workers = EXCLUDED.dedicated_workers,
    paid = EXCLUDED.paid, source = EXCLUDED.source, updated_at = EXCLUDED.updated_at`

var userColumns = []string{"user_id", "last_active_at", "last_source"}

// The latest activity wins, so events arriving out of time order (two
// producers, clock skew) still leave the true last activity; on a tie the
// later event wins, as in the fold.
const mergeUsersSQL = `INSERT INTO users AS u (user_id, last_active_at, last_source)
SELECT user_id, last_active_at, last_source FROM registry_stage_users
ON CONFLICT (user_id) DO UPDATE SET
    last_source    = CASE WHEN EXCLUDED.last_active_at >= u.last_active_at THEN EXCLUDED.last_source ELSE u.last_source END,
    last_active_at = GREATEST(u.last_active_at, EXCLUDED.last_active_at)`

var workerColumns = []string{
	"worker_id", "tier", "egress", "address", "stopping", "last_heartbeat_at",
	"sample_window_seconds", "sends", "hard_bounces", "complaints", "sampled_at",
}

// last_heartbeat_at flags the heartbeat group, sampled_at the sample group.
const mergeWorkersSQL = `INSERT INTO workers AS w (worker_id, tier, egress, address, stopping, last_heartbeat_at,
    sample_window_seconds, sends, hard_bounces, complaints, sampled_at)
SELECT worker_id, tier, egress, address, stopping, last_heartbeat_at,
    sample_window_seconds, sends, hard_bounces, complaints, sampled_at
FROM registry_stage_workers
ON CONFLICT (worker_id) DO UPDATE SET
    tier                  = CASE WHEN EXCLUDED.last_heartbeat_at IS NOT NULL THEN EXCLUDED.tier ELSE w.tier END,
    egress                = CASE WHEN EXCLUDED.last_heartbeat_at IS NOT NULL THEN EXCLUDED.egress ELSE w.egress END,
    address               = CASE WHEN EXCLUDED.last_heartbeat_at IS NOT NULL THEN EXCLUDED.address ELSE w.address END,
    stopping              = CASE WHEN EXCLUDED.last_heartbeat_at IS NOT NULL THEN EXCLUDED.stopping ELSE w.stopping END,
    last_heartbeat_at     = COALESCE(EXCLUDED.last_heartbeat_at, w.last_heartbeat_at),
    sample_window_seconds = CASE WHEN EXCLUDED.sampled_at IS NOT NULL THEN EXCLUDED.sample_window_seconds ELSE w.sample_window_seconds END,
    sends                 = CASE WHEN EXCLUDED.sampled_at IS NOT NULL THEN EXCLUDED.sends ELSE w.sends END,
    hard_bounces          = CASE WHEN EXCLUDED.sampled_at IS NOT NULL THEN EXCLUDED.hard_bounces ELSE w.hard_bounces END,
    complaints            = CASE WHEN EXCLUDED.sampled_at IS NOT NULL THEN EXCLUDED.complaints ELSE w.complaints END,
    sampled_at            = COALESCE(EXCLUDED.sampled_at, w.sampled_at)`

// Apply implements Projection: fold the batch per key into one row per
// key, then COPY the rows of new keys straight into their tables and the
// rest into staging tables, merged with one statement per table.
//
// New keys skip the merge because the merge would insert their rows as
// they are, at about twice the cost of COPY. Telling new from existing keys
// is safe within the transaction: a key lives in one partition, and the
// projector holds that partition's offset row locked until it commits, so
// no other transaction of a projector inserts it meanwhile.
func (r *Registry) Apply(ctx context.Context, tx pgx.Tx, events []domain.Event) error {
	ws := registryWrites(foldRegistry(events))
	if len(ws) == 0 {
		return nil
	}
	if err := sortByExisting(ctx, tx, ws); err != nil {
		return err
	}
	return writeRows(ctx, tx, ws)
}

// write is what a batch writes to one table.
type write struct {
	t     *target
	ids   []string
	build func() ([][]any, error)
	rows  [][]any // from build; rows[i][0] is the key, ids[i]
	// fresh rows have keys the table lacks, stale ones keys it has.
	fresh, stale [][]any
}

func registryWrites(ch registryChanges) []*write {
	var ws []*write
	if cs := ch.Mailboxes; len(cs) > 0 {
		ws = append(ws, &write{t: mailboxesTarget, ids: ids(cs, func(c *mailboxChange) string { return c.MailboxID }),
			build: func() ([][]any, error) { return mailboxRows(cs) }})
	}
	if cs := ch.Orgs; len(cs) > 0 {
		ws = append(ws, &write{t: orgsTarget, ids: ids(cs, func(c *orgChange) string { return c.OrgID }),
			build: func() ([][]any, error) { return orgRows(cs) }})
	}
	if cs := ch.Users; len(cs) > 0 {
		ws = append(ws, &write{t: usersTarget, ids: ids(cs, func(c *userChange) string { return c.UserID }),
			build: func() ([][]any, error) { return userRows(cs) }})
	}
	if cs := ch.Workers; len(cs) > 0 {
		ws = append(ws, &write{t: workersTarget, ids: ids(cs, func(c *workerChange) string { return c.WorkerID }),
			build: func() ([][]any, error) { return workerRows(cs) }})
	}
	return ws
}

// sortByExisting builds the rows of ws and sorts them into fresh and stale.
// It asks which keys exist first, in one round trip for every table, and
// builds the rows while the query runs.
func sortByExisting(ctx context.Context, tx pgx.Tx, ws []*write) error {
	b := &pgx.Batch{}
	for _, w := range ws {
		keys := make([]pgtype.UUID, len(w.ids))
		for i, id := range w.ids {
			k, err := pgUUID(id)
			if err != nil {
				return err
			}
			keys[i] = k
		}
		b.Queue(w.t.existing, keys)
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	for _, w := range ws {
		var err error
		if w.rows, err = w.build(); err != nil {
			return err
		}
	}
	for _, w := range ws {
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("registry: existing %s: %w", w.t.table, err)
		}
		existing := map[[16]byte]bool{}
		var key [16]byte
		if _, err := pgx.ForEachRow(rows, []any{&key}, func() error { existing[key] = true; return nil }); err != nil {
			return fmt.Errorf("registry: existing %s: %w", w.t.table, err)
		}
		for _, row := range w.rows {
			if existing[row[0].(pgtype.UUID).Bytes] {
				w.stale = append(w.stale, row)
			} else {
				w.fresh = append(w.fresh, row)
			}
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("registry: existing keys: %w", err)
	}
	return nil
}

// writeRows COPYs fresh rows into their tables and stale ones into the
// staging tables, which it creates if need be, then merges those.
func writeRows(ctx context.Context, tx pgx.Tx, ws []*write) error {
	var creates []string
	for _, w := range ws {
		if len(w.stale) > 0 {
			creates = append(creates, w.t.create)
		}
	}
	if len(creates) > 0 {
		// One round trip for every staging table needed (simple protocol:
		// no arguments, several statements).
		if _, err := tx.Exec(ctx, strings.Join(creates, ";\n")); err != nil {
			return fmt.Errorf("registry: staging tables: %w", err)
		}
	}
	for _, w := range ws {
		if len(w.fresh) > 0 {
			if err := copyRows(ctx, tx, w.t.copyTable, w.t.types, w.fresh); err != nil {
				if isUniqueViolation(err) {
					// A key inserted under us after all (say a topic's
					// partitions were added and the key moved): not the
					// events' fault, so not wrapped as a data error.
					// Retried, the row takes the merge.
					return fmt.Errorf("registry: copy into %s: a key appeared under this transaction: %s", w.t.table, err.Error())
				}
				return fmt.Errorf("registry: copy into %s: %w", w.t.table, err)
			}
		}
		if len(w.stale) > 0 {
			if err := copyRows(ctx, tx, w.t.copyStage, w.t.types, w.stale); err != nil {
				return fmt.Errorf("registry: copy into %s: %w", w.t.stage, err)
			}
		}
	}
	if len(creates) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	var merged []*write
	for _, w := range ws {
		if len(w.stale) > 0 {
			b.Queue(w.t.merge)
			merged = append(merged, w)
		}
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	for _, w := range merged {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("registry: merge into %s: %w", w.t.table, err)
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("registry: merge: %w", err)
	}
	return nil
}

// ids returns the keys of a table's changes.
func ids[C any](cs []C, key func(C) string) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = key(c)
	}
	return out
}

// pgUUID converts an id Decode has already validated; a failure here is the
// record's fault, hence permanent.
func pgUUID(s string) (pgtype.UUID, error) {
	u, err := uuid.Parse(s)
	if err != nil {
		return pgtype.UUID{}, Permanent(domain.CodeInvalid, fmt.Errorf("registry: id %q is not a UUID", s))
	}
	return pgtype.UUID{Bytes: u, Valid: true}, nil
}

func mailboxRows(cs []*mailboxChange) ([][]any, error) {
	rows := make([][]any, 0, len(cs))
	for _, c := range cs {
		id, err := pgUUID(c.MailboxID)
		if err != nil {
			return nil, err
		}
		eventID, err := pgUUID(c.LastEventID)
		if err != nil {
			return nil, err
		}
		row := make([]any, len(mailboxColumns))
		row[0] = id
		if a := c.Added; a != nil {
			org, err := pgUUID(a.OrgID)
			if err != nil {
				return nil, err
			}
			user, err := pgUUID(a.UserID)
			if err != nil {
				return nil, err
			}
			var sealed []byte
			if a.SealedCredentials != nil {
				if sealed, err = sealedJSON(a.SealedCredentials); err != nil {
					return nil, fmt.Errorf("registry: marshal sealed credentials: %w", err)
				}
			}
			row[1], row[2], row[3], row[4], row[5] = org, user, a.Address, string(a.Provider), a.WarmupEnabled
			row[6], row[7], row[8], row[9] = a.IMAP.Host, int32(a.IMAP.Port), string(a.IMAP.TLS), a.IMAP.Username
			if sealed != nil {
				row[10] = sealed
			}
			row[17] = c.AddedAt
		}
		if h := c.Health; h != nil {
			row[11], row[12], row[13] = string(h.State), h.Score, h.Reason
			if h.Until != nil {
				row[14] = h.Until.UTC()
			}
		}
		if c.RemovedAt != nil {
			row[15], row[16] = *c.RemovedAt, *c.RemovalReason
		}
		row[18], row[19] = c.UpdatedAt, eventID
		rows = append(rows, row)
	}
	return rows, nil
}

func orgRows(cs []*orgChange) ([][]any, error) {
	rows := make([][]any, 0, len(cs))
	for _, c := range cs {
		id, err := pgUUID(c.OrgID)
		if err != nil {
			return nil, err
		}
		p := c.Plan
		rows = append(rows, []any{id, string(p.Plan), int32(p.DedicatedWorkers), p.Paid, p.Source, c.At})
	}
	return rows, nil
}

func userRows(cs []*userChange) ([][]any, error) {
	rows := make([][]any, 0, len(cs))
	for _, c := range cs {
		id, err := pgUUID(c.UserID)
		if err != nil {
			return nil, err
		}
		rows = append(rows, []any{id, c.ActiveAt, string(c.Source)})
	}
	return rows, nil
}

func workerRows(cs []*workerChange) ([][]any, error) {
	rows := make([][]any, 0, len(cs))
	for _, c := range cs {
		id, err := pgUUID(c.WorkerID)
		if err != nil {
			return nil, err
		}
		row := make([]any, len(workerColumns))
		row[0] = id
		if h := c.Heartbeat; h != nil {
			row[1], row[2], row[3], row[4], row[5] = string(h.EffectiveTier()), string(h.Egress), h.Address, h.Stopping, c.HeartbeatAt
		}
		if s := c.Sample; s != nil {
			row[6], row[7], row[8], row[9], row[10] = s.WindowSeconds, s.Sends, s.HardBounces, s.Complaints, c.SampledAt
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// sealedJSON is json.Marshal(s), byte for byte, written directly when no
// field needs escaping (Validate allows only such fields), which it does
// for every mailbox row.
func sealedJSON(s *domain.SealedSecret) ([]byte, error) {
	if !plainJSON(s.KeyID) || !plainJSON(s.Alg) || !plainJSON(s.Nonce) || !plainJSON(s.Ciphertext) {
		return json.Marshal(s)
	}
	b := make([]byte, 0, len(`{"key_id":"","alg":"","nonce":"","ciphertext":""}`)+
		len(s.KeyID)+len(s.Alg)+len(s.Nonce)+len(s.Ciphertext))
	b = append(b, `{"key_id":"`...)
	b = append(b, s.KeyID...)
	b = append(b, `","alg":"`...)
	b = append(b, s.Alg...)
	b = append(b, `","nonce":"`...)
	b = append(b, s.Nonce...)
	b = append(b, `","ciphertext":"`...)
	b = append(b, s.Ciphertext...)
	b = append(b, `"}`...)
	return b, nil
}

// plainJSON reports whether encoding/json writes s between quotes as it is.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}
