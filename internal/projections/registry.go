package projections

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/applyonce"
	"github.com/mailplane/mailplane/topics"
)

// Registry is the projection of the registry of facts: the tables
// mailboxes, orgs, users and workers (migrations 0002 and 0008), from the domain
// event types. Every timestamp it writes is an event's ce_time. Its Apply
// may run in several transactions at once.
type Registry struct {
	// noGuess counts the batches left that look up the keys of the rows
	// that create them (see Apply).
	noGuess atomic.Int32
}

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
	// COPY statements into table and stage.
	copyTable, copyStage string
}

func newTarget(table, stage, create, existing, merge string, columns []string) *target {
	return &target{table, stage, create, existing, merge, columns,
		copySQL(table, columns), copySQL(stage, columns)}
}

var (
	mailboxesTarget = newTarget("mailboxes", "registry_stage_mailboxes", stageMailboxes,
		`SELECT mailbox_id FROM mailboxes WHERE mailbox_id = ANY($1)`, mergeMailboxesSQL, mailboxColumns)
	orgsTarget = newTarget("orgs", "registry_stage_orgs", stageOrgs,
		`SELECT org_id FROM orgs WHERE org_id = ANY($1)`, mergeOrgsSQL, orgColumns)
	usersTarget = newTarget("users", "registry_stage_users", stageUsers,
		`SELECT user_id FROM users WHERE user_id = ANY($1)`, mergeUsersSQL, userColumns)
	workersTarget = newTarget("workers", "registry_stage_workers", stageWorkers,
		`SELECT worker_id FROM workers WHERE worker_id = ANY($1)`, mergeWorkersSQL, workerColumns)
)

var mailboxColumns = []string{
	"mailbox_id", "org_id", "user_id", "address", "provider", "warmup_enabled",
	"imap_host", "imap_port", "imap_tls", "imap_username", "sealed_credentials",
	"health_state", "health_score", "health_reason", "health_until",
	"removed_at", "removal_reason", "added_at", "updated_at", "last_event_id",
	"disabled_at", "disabled_reason", "health_evidence",
}

// A group of columns the batch did not touch arrives as NULLs and keeps the
// stored values: added_at flags the identity group, health_state the health
// group; the removal and disabled groups are touched by a removal (a
// disable) or by an add (which clears them).
const mergeMailboxesSQL = `INSERT INTO mailboxes AS m (` + `
    mailbox_id, org_id, user_id, address, provider, warmup_enabled,
    imap_host, imap_port, imap_tls, imap_username, sealed_credentials,
    health_state, health_score, health_reason, health_until,
    removed_at, removal_reason, added_at, updated_at, last_event_id, disabled_at, disabled_reason, health_evidence)
SELECT mailbox_id, org_id, user_id, address, provider, warmup_enabled,
    imap_host, imap_port, imap_tls, imap_username, sealed_credentials,
    health_state, health_score, health_reason, health_until,
    removed_at, removal_reason, added_at, updated_at, last_event_id, disabled_at, disabled_reason, health_evidence
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
    sealed_credentials = CASE WHEN EXCLUDED.added_at IS NOT NULL OR EXCLUDED.sealed_credentials IS NOT NULL
                              THEN EXCLUDED.sealed_credentials ELSE m.sealed_credentials END,
    added_at           = COALESCE(EXCLUDED.added_at, m.added_at),
    health_state       = COALESCE(EXCLUDED.health_state, m.health_state),
    health_score       = CASE WHEN EXCLUDED.health_state IS NOT NULL THEN EXCLUDED.health_score ELSE m.health_score END,
    health_reason      = CASE WHEN EXCLUDED.health_state IS NOT NULL THEN EXCLUDED.health_reason ELSE m.health_reason END,
    health_until       = CASE WHEN EXCLUDED.health_state IS NOT NULL THEN EXCLUDED.health_until ELSE m.health_until END,
    health_evidence    = CASE WHEN EXCLUDED.health_state IS NOT NULL THEN EXCLUDED.health_evidence ELSE m.health_evidence END,
    removed_at         = CASE WHEN EXCLUDED.added_at IS NOT NULL OR EXCLUDED.removed_at IS NOT NULL
                              THEN EXCLUDED.removed_at ELSE m.removed_at END,
    removal_reason     = CASE WHEN EXCLUDED.added_at IS NOT NULL OR EXCLUDED.removed_at IS NOT NULL
                              THEN EXCLUDED.removal_reason ELSE m.removal_reason END,
    disabled_at        = CASE WHEN EXCLUDED.added_at IS NOT NULL OR EXCLUDED.disabled_at IS NOT NULL
                              THEN EXCLUDED.disabled_at ELSE m.disabled_at END,
    disabled_reason    = CASE WHEN EXCLUDED.added_at IS NOT NULL OR EXCLUDED.disabled_at IS NOT NULL
                              THEN EXCLUDED.disabled_reason ELSE m.disabled_reason END,
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
//
// A row that creates its key (a mailbox.added) nearly always has a new key,
// so it is not looked up: such rows are COPYed into their table under a
// savepoint, and the table's primary key catches the rare existing key. The
// COPY is then rolled back to the savepoint, and those rows are looked up
// and written like the others, as are the created rows of the next
// guessBackoff batches. Which way a row goes never changes what is written.
func (r *Registry) Apply(ctx context.Context, tx pgx.Tx, recs []Record) error {
	run, err := r.prepare(recs)
	if err != nil {
		return err
	}
	return run(ctx, tx)
}

// prepare folds recs and builds their rows: the part of Apply that needs
// no database, which a projector does before its transaction begins, so
// that the Go side of one batch overlaps the Postgres side of another
// (WithSerialWrites). Safe to call from several goroutines at once. The
// function it returns does the rest of Apply, in tx, once.
func (r *Registry) prepare(recs []Record) (func(ctx context.Context, tx pgx.Tx) error, error) {
	ws := registryWrites(foldRegistry(Events(recs)))
	for _, w := range ws {
		rows, err := w.build()
		if err != nil {
			return nil, err
		}
		w.rows = rows
	}
	return func(ctx context.Context, tx pgx.Tx) error { return r.writeAll(ctx, tx, ws) }, nil
}

// writeAll writes the prepared rows of ws in tx.
func (r *Registry) writeAll(ctx context.Context, tx pgx.Tx, ws []*write) error {
	if len(ws) == 0 {
		return nil
	}
	guess := r.guessing()
	if err := lookUp(ctx, tx, ws, func(w *write, i int) bool { return !guess || !w.creates(i) }); err != nil {
		return err
	}
	if guess {
		ok, err := copyCreated(ctx, tx, ws)
		if err != nil {
			return err
		}
		if !ok {
			r.missed()
			guess = false
			if err := lookUp(ctx, tx, ws, func(w *write, i int) bool { return w.creates(i) }); err != nil {
				return err
			}
		}
	}
	for _, w := range ws {
		w.stale = make([]bool, w.rows.len())
		for i, key := range w.rows.keys {
			switch {
			case guess && w.creates(i):
				// In the table already.
			case w.existing[key]:
				w.stale[i] = true
				w.nStale++
			default:
				w.nFresh++
			}
		}
		if guess && w.created != nil {
			w.done = w.created
		}
	}
	return writeRows(ctx, tx, ws)
}

// guessBackoff is how many batches look every key up after a created row's
// key turned out to exist.
const guessBackoff = 16

// guessing reports whether this batch's created rows skip the lookup.
func (r *Registry) guessing() bool {
	for {
		n := r.noGuess.Load()
		if n <= 0 {
			return true
		}
		if r.noGuess.CompareAndSwap(n, n-1) {
			return false
		}
	}
}

func (r *Registry) missed() { r.noGuess.Store(guessBackoff) }

// write is what a batch writes to one table.
type write struct {
	t     *target
	ids   []string
	build func() (*tuples, error)
	// created[i] says change i creates its key (nil: none does).
	created []bool
	rows    *tuples // from build: row i is ids[i]'s
	// existing holds the keys looked up that have rows.
	existing map[[16]byte]bool
	// Row i is in the table already if done[i] (done may be nil), else
	// stale if stale[i] (its key has a row: it takes the merge), else
	// fresh (COPYed into the table).
	done, stale    []bool
	nFresh, nStale int
}

func (w *write) creates(i int) bool { return w.created != nil && w.created[i] }

func registryWrites(ch registryChanges) []*write {
	var ws []*write
	if cs := ch.Mailboxes; len(cs) > 0 {
		w := &write{t: mailboxesTarget, ids: ids(cs, func(c *mailboxChange) string { return c.MailboxID }),
			build: func() (*tuples, error) { return mailboxRows(cs) }}
		for i, c := range cs {
			if c.Added != nil {
				if w.created == nil {
					w.created = make([]bool, len(cs))
				}
				w.created[i] = true
			}
		}
		ws = append(ws, w)
	}
	if cs := ch.Orgs; len(cs) > 0 {
		ws = append(ws, &write{t: orgsTarget, ids: ids(cs, func(c *orgChange) string { return c.OrgID }),
			build: func() (*tuples, error) { return orgRows(cs) }})
	}
	if cs := ch.Users; len(cs) > 0 {
		ws = append(ws, &write{t: usersTarget, ids: ids(cs, func(c *userChange) string { return c.UserID }),
			build: func() (*tuples, error) { return userRows(cs) }})
	}
	if cs := ch.Workers; len(cs) > 0 {
		ws = append(ws, &write{t: workersTarget, ids: ids(cs, func(c *workerChange) string { return c.WorkerID }),
			build: func() (*tuples, error) { return workerRows(cs) }})
	}
	return ws
}

// lookUp asks which of the keys that pick selects exist, in one round trip
// for every table.
func lookUp(ctx context.Context, tx pgx.Tx, ws []*write, pick func(w *write, i int) bool) error {
	b := &pgx.Batch{}
	var asked []*write
	for _, w := range ws {
		var keys [][16]byte
		for i, id := range w.ids {
			if !pick(w, i) {
				continue
			}
			k, err := parseID(id)
			if err != nil {
				return err
			}
			keys = append(keys, k)
		}
		if len(keys) > 0 {
			b.Queue(w.t.existing, keys)
			asked = append(asked, w)
		}
	}
	if len(asked) == 0 {
		return nil
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	for _, w := range asked {
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("registry: existing %s: %w", w.t.table, err)
		}
		if w.existing == nil {
			w.existing = map[[16]byte]bool{}
		}
		var key [16]byte
		if _, err := pgx.ForEachRow(rows, []any{&key}, func() error { w.existing[key] = true; return nil }); err != nil {
			return fmt.Errorf("registry: existing %s: %w", w.t.table, err)
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("registry: existing keys: %w", err)
	}
	return nil
}

// createdSavepoint is where copyCreated rolls back to.
const createdSavepoint = "registry_created"

// copyCreated COPYs the created rows of ws into their tables, after a
// savepoint sent with the first COPY (no round trip of its own). It
// returns false, having rolled back to the savepoint, if a key existed.
func copyCreated(ctx context.Context, tx pgx.Tx, ws []*write) (bool, error) {
	prefix := "SAVEPOINT " + createdSavepoint + "; "
	for _, w := range ws {
		if w.created == nil {
			continue
		}
		var data []byte
		if slices.Contains(w.created, false) {
			data = w.rows.data(func(i int) bool { return w.created[i] })
		} else {
			data = w.rows.data(nil)
		}
		err := copyData(ctx, tx, prefix+w.t.copyTable, data)
		prefix = ""
		if err == nil {
			continue
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == w.t.table+"_pkey" {
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+createdSavepoint); err != nil {
				return false, fmt.Errorf("registry: roll back created rows: %w", err)
			}
			return false, nil
		}
		return false, fmt.Errorf("registry: copy into %s: %w", w.t.table, err)
	}
	return true, nil
}

// writeRows COPYs fresh rows into their tables and stale ones into the
// staging tables, which it creates if need be, then merges those.
func writeRows(ctx context.Context, tx pgx.Tx, ws []*write) error {
	var creates []string
	for _, w := range ws {
		if w.nStale > 0 {
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
		if w.nFresh > 0 {
			var data []byte
			if w.nFresh == w.rows.len() {
				data = w.rows.data(nil)
			} else {
				data = w.rows.data(func(i int) bool { return !w.stale[i] && (w.done == nil || !w.done[i]) })
			}
			if err := copyData(ctx, tx, w.t.copyTable, data); err != nil {
				if applyonce.IsUniqueViolation(err) {
					// A key inserted under us after all (say a topic's
					// partitions were added and the key moved): not the
					// events' fault, so not wrapped as a data error.
					// Retried, the row takes the merge.
					return fmt.Errorf("registry: copy into %s: a key appeared under this transaction: %s", w.t.table, err.Error())
				}
				return fmt.Errorf("registry: copy into %s: %w", w.t.table, err)
			}
		}
		if w.nStale > 0 {
			data := w.rows.data(func(i int) bool { return w.stale[i] })
			if err := copyData(ctx, tx, w.t.copyStage, data); err != nil {
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
		if w.nStale > 0 {
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

// parseID parses an id Decode has already validated; a failure here is the
// record's fault, hence permanent.
func parseID(s string) ([16]byte, error) {
	u, err := uuid.Parse(s)
	if err != nil {
		return u, applyonce.Permanent(domain.CodeInvalid, fmt.Errorf("registry: id %q is not a UUID", s))
	}
	return u, nil
}

// mailboxRowSize is about the size of a mailbox row in COPY data.
const mailboxRowSize = 400

func mailboxRows(cs []*mailboxChange) (*tuples, error) {
	t := newTuples(len(cs), mailboxRowSize)
	for _, c := range cs {
		id, err := parseID(c.MailboxID)
		if err != nil {
			return nil, err
		}
		eventID, err := parseID(c.LastEventID)
		if err != nil {
			return nil, err
		}
		t.row(id, len(mailboxColumns))
		b := t.buf
		if a := c.Added; a != nil {
			org, err := parseID(a.OrgID)
			if err != nil {
				return nil, err
			}
			user, err := parseID(a.UserID)
			if err != nil {
				return nil, err
			}
			b = appendUUID(b, org)
			b = appendUUID(b, user)
			b = appendText(b, a.Address)
			b = appendText(b, string(a.Provider))
			b = appendBool(b, a.WarmupEnabled)
			b = appendText(b, a.IMAP.Host)
			b = appendInt4(b, int32(a.IMAP.Port))
			b = appendText(b, string(a.IMAP.TLS))
			b = appendText(b, a.IMAP.Username)
		} else {
			for range 9 {
				b = appendNull(b)
			}
		}
		// A rotation (credentials_rotated) replaces the added credentials;
		// alone, it touches only this column.
		sealed := c.Sealed
		if sealed == nil && c.Added != nil {
			sealed = c.Added.SealedCredentials
		}
		if sealed != nil {
			if b, err = appendSealedJSONB(b, sealed); err != nil {
				return nil, fmt.Errorf("registry: marshal sealed credentials: %w", err)
			}
		} else {
			b = appendNull(b)
		}
		if h := c.Health; h != nil {
			b = appendText(b, string(h.State))
			b = appendFloat8(b, h.Score)
			b = appendText(b, h.Reason)
			if h.Until != nil {
				b = appendTimestamptz(b, *h.Until)
			} else {
				b = appendNull(b)
			}
		} else {
			for range 4 {
				b = appendNull(b)
			}
		}
		if c.RemovedAt != nil {
			b = appendTimestamptz(b, *c.RemovedAt)
			b = appendText(b, *c.RemovalReason)
		} else {
			b = appendNull(b)
			b = appendNull(b)
		}
		if c.Added != nil {
			b = appendTimestamptz(b, c.AddedAt)
		} else {
			b = appendNull(b)
		}
		b = appendTimestamptz(b, c.UpdatedAt)
		b = appendUUID(b, eventID)
		if c.DisabledAt != nil {
			b = appendTimestamptz(b, *c.DisabledAt)
			b = appendText(b, *c.DisabledReason)
		} else {
			b = appendNull(b)
			b = appendNull(b)
		}
		if b, err = appendHealthEvidence(b, c.Health); err != nil {
			return nil, err
		}
		t.buf = b
		t.done()
	}
	return t, nil
}

func orgRows(cs []*orgChange) (*tuples, error) {
	t := newTuples(len(cs), 100)
	for _, c := range cs {
		id, err := parseID(c.OrgID)
		if err != nil {
			return nil, err
		}
		p := c.Plan
		t.row(id, len(orgColumns))
		b := appendText(t.buf, string(p.Plan))
		b = appendInt4(b, int32(p.DedicatedWorkers))
		b = appendBool(b, p.Paid)
		b = appendText(b, p.Source)
		t.buf = appendTimestamptz(b, c.At)
		t.done()
	}
	return t, nil
}

func userRows(cs []*userChange) (*tuples, error) {
	t := newTuples(len(cs), 60)
	for _, c := range cs {
		id, err := parseID(c.UserID)
		if err != nil {
			return nil, err
		}
		t.row(id, len(userColumns))
		b := appendTimestamptz(t.buf, c.ActiveAt)
		t.buf = appendText(b, string(c.Source))
		t.done()
	}
	return t, nil
}

func workerRows(cs []*workerChange) (*tuples, error) {
	t := newTuples(len(cs), 200)
	for _, c := range cs {
		id, err := parseID(c.WorkerID)
		if err != nil {
			return nil, err
		}
		t.row(id, len(workerColumns))
		b := t.buf
		if h := c.Heartbeat; h != nil {
			b = appendText(b, string(h.EffectiveTier()))
			b = appendText(b, string(h.Egress))
			b = appendText(b, h.Address)
			b = appendBool(b, h.Stopping)
			b = appendTimestamptz(b, c.HeartbeatAt)
		} else {
			for range 5 {
				b = appendNull(b)
			}
		}
		if s := c.Sample; s != nil {
			b = appendInt8(b, s.WindowSeconds)
			b = appendInt8(b, s.Sends)
			b = appendInt8(b, s.HardBounces)
			b = appendInt8(b, s.Complaints)
			b = appendTimestamptz(b, c.SampledAt)
		} else {
			for range 5 {
				b = appendNull(b)
			}
		}
		t.buf = b
		t.done()
	}
	return t, nil
}
