package ownership

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/topics"
)

// BackfillConsumer is the name a redriven record addressed to the
// backfill would carry: none is, so the backfill passes every redriven
// record by (each is a copy of one already read).
const BackfillConsumer = "ownership-backfill"

// Fold replays ownership from the log: the claims the log's facts make,
// by the rules of domain/ownership.go. Each mailbox's events must come in
// log order (one partition's order, which per-key order is); partitions
// may interleave.
//
//   - A mailbox belongs to the tenant of the source of its first
//     mailbox.added since its last mailbox.removed (a re-add by another
//     source, possible before ownership was enforced, changes nothing); a
//     mailbox.owner_transferred gives it to its owner.
//   - An org belongs to the tenant of the source of the earliest
//     mailbox.added naming it (by record timestamp, then partition and
//     offset), unless an org.owner_transferred names it: the last one's
//     owner wins (after a transfer no add changes an org's owner).
//
// A source is mapped to its tenant with domain.TenantOf; a source no
// tenant speaks as stays its own owner (only operators act on those).
type Fold struct {
	tenants   []string
	mailboxes map[string]string // id → owner ("" removed)
	orgFirst  map[string]orgAdd
	orgMoved  map[string]string
	unmapped  map[string]bool
}

type orgAdd struct {
	owner     string
	at        time.Time
	partition int32
	offset    int64
}

func (a orgAdd) before(b orgAdd) bool {
	if !a.at.Equal(b.at) {
		return a.at.Before(b.at)
	}
	if a.partition != b.partition {
		return a.partition < b.partition
	}
	return a.offset < b.offset
}

// NewFold returns an empty fold mapping sources to tenants (the sources
// of the tokens file's callers).
func NewFold(tenants []string) *Fold {
	return &Fold{tenants: slices.Clone(tenants), mailboxes: map[string]string{}, orgFirst: map[string]orgAdd{},
		orgMoved: map[string]string{}, unmapped: map[string]bool{}}
}

// Apply folds one event, appended at (the record timestamp) at
// partition/offset of its topic.
func (f *Fold) Apply(ev domain.Event, at time.Time, partition int32, offset int64) {
	switch d := ev.Data.(type) {
	case *domain.MailboxAdded:
		owner := f.tenant(ev.Source)
		if f.mailboxes[d.MailboxID] == "" {
			f.mailboxes[d.MailboxID] = owner
		}
		add := orgAdd{owner: owner, at: at, partition: partition, offset: offset}
		if first, ok := f.orgFirst[d.OrgID]; !ok || add.before(first) {
			f.orgFirst[d.OrgID] = add
		}
	case *domain.MailboxRemoved:
		f.mailboxes[d.MailboxID] = ""
	case *domain.MailboxOwnerTransferred:
		f.mailboxes[d.MailboxID] = d.Owner
	case *domain.OrgOwnerTransferred:
		f.orgMoved[d.OrgID] = d.Owner
	}
}

func (f *Fold) tenant(src string) string {
	if t, ok := domain.TenantOf(src, f.tenants); ok {
		return t
	}
	f.unmapped[src] = true
	return src
}

// Claims returns the claims the log makes: every live mailbox's and every
// org's owner.
func (f *Fold) Claims() map[Key]string {
	out := map[Key]string{}
	for id, owner := range f.mailboxes {
		if owner != "" {
			out[Key{domain.OwnedMailbox, id}] = owner
		}
	}
	for id, a := range f.orgFirst {
		out[Key{domain.OwnedOrg, id}] = a.owner
	}
	for id, owner := range f.orgMoved {
		out[Key{domain.OwnedOrg, id}] = owner
	}
	return out
}

// Unmapped returns the sources no tenant speaks as, sorted.
func (f *Fold) Unmapped() []string { return slices.Sorted(maps.Keys(f.unmapped)) }

// BackfillReport says what a backfill found and wrote.
type BackfillReport struct {
	Mailboxes int64 // live mailboxes with an owner on the log
	Orgs      int64
	Written   int64 // claims the table lacked, written
	// Unmapped are the sources no tenant speaks as; UnmappedClaims the
	// claims they own.
	Unmapped       []string
	UnmappedClaims int64
	// Undecodable counts records that did not decode (the consumers
	// dead-lettered them: they changed nothing).
	Undecodable int64
}

// Backfill reads the mailbox and org topics from their start to their
// end (as of the start), folds the claims the log makes (Fold) and writes
// those the table lacks: a claim already there, written at ingest since,
// is newer and is kept. It records the backfill, which lets the API
// check ownership (until then it answers 503). Running it again is safe
// and writes only what is missing: run it once the API checks ownership
// (before the new api role takes traffic) and once more after every old
// api process has stopped, for what they registered meanwhile.
func Backfill(ctx context.Context, kcfg kafka.Config, store *Store, tenants []string) (BackfillReport, error) {
	f := NewFold(tenants)
	var rep BackfillReport
	spec := kafka.ReadSpec{Topics: []string{kcfg.Topic(topics.MailboxEvents), kcfg.Topic(topics.OrgEvents)}, ClientID: "ownership-backfill"}
	_, err := kafka.ReadToEnd(ctx, kcfg, spec, func(r *kgo.Record) error {
		if dlq.ForOtherConsumer(r, BackfillConsumer) {
			return nil
		}
		ev, err := topics.Decode(r)
		if err != nil {
			rep.Undecodable++
			return nil
		}
		f.Apply(ev, r.Timestamp, r.Partition, r.Offset)
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("ownership backfill: read the log: %w", err)
	}
	claims := f.Claims()
	rep.Unmapped = f.Unmapped()
	for k, owner := range claims {
		if k.Kind == domain.OwnedMailbox {
			rep.Mailboxes++
		} else {
			rep.Orgs++
		}
		if slices.Contains(rep.Unmapped, owner) {
			rep.UnmappedClaims++
		}
	}
	if rep.Written, err = store.insertMissing(ctx, claims); err != nil {
		return rep, err
	}
	if err := store.recordBackfill(ctx, rep); err != nil {
		return rep, err
	}
	return rep, nil
}
