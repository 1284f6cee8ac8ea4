package domain

import "slices"

// Ownership (docs/architecture.md §9, "who may publish what"): every
// mailbox and org belongs to the tenant that registered it. A tenant is a
// caller's configured source in the tokens file (Caller.Source), not the
// path below it an event may name: "/product-api" owns what it registered
// as "/product-api/sessions" too. The first mailbox.added of a mailbox
// claims it and, when its org has no owner yet, the org; a mailbox.removed
// that reached the log releases the mailbox (never the org); an operator
// moves either with an owner_transferred event. These are the rules; the
// claims live in Postgres (internal/ownership), written at ingest before
// anything is produced.

// Ownership transfers: internal types, published only by callers holding
// both their publish:<type> scope and ops.
const (
	TypeMailboxOwnerTransferred = "mailplane.mailbox.owner_transferred.v1"
	TypeOrgOwnerTransferred     = "mailplane.org.owner_transferred.v1"
)

// MaxOwnerLen bounds an owner (a tokens-file source).
const MaxOwnerLen = 256

// MailboxOwnerTransferred gives a mailbox to another tenant. Only an
// operator publishes it; the mailbox's org is not moved with it.
type MailboxOwnerTransferred struct {
	MailboxID string `json:"mailbox_id"`
	// Owner is the new owner: a tenant, i.e. a caller's source as the
	// tokens file has it.
	Owner string `json:"owner"`
	// Comment says why, for the audit trail the log is.
	Comment string `json:"comment"`
}

func (*MailboxOwnerTransferred) EventType() string     { return TypeMailboxOwnerTransferred }
func (m *MailboxOwnerTransferred) AggregateID() string { return m.MailboxID }

// Validate checks the event.
func (m *MailboxOwnerTransferred) Validate() Problems {
	var ps Problems
	checkUUID(&ps, "mailbox_id", m.MailboxID)
	checkSource(&ps, "owner", m.Owner)
	checkText(&ps, "comment", m.Comment, true, 500)
	return ps
}

// OrgOwnerTransferred gives an org to another tenant. Only an operator
// publishes it; the org's mailboxes keep their owners.
type OrgOwnerTransferred struct {
	OrgID   string `json:"org_id"`
	Owner   string `json:"owner"`
	Comment string `json:"comment"`
}

func (*OrgOwnerTransferred) EventType() string     { return TypeOrgOwnerTransferred }
func (o *OrgOwnerTransferred) AggregateID() string { return o.OrgID }

// Validate checks the event.
func (o *OrgOwnerTransferred) Validate() Problems {
	var ps Problems
	checkUUID(&ps, "org_id", o.OrgID)
	checkSource(&ps, "owner", o.Owner)
	checkText(&ps, "comment", o.Comment, true, 500)
	return ps
}

// opsOnlyTypes are published only together with ops, whatever other
// scopes a caller holds: plans are billing's, owners the operator's.
var opsOnlyTypes = []string{TypeOrgPlanChanged, TypeMailboxOwnerTransferred, TypeOrgOwnerTransferred}

// IsOpsOnlyType reports whether publishing t needs ops besides its
// publish:<type> scope.
func IsOpsOnlyType(t string) bool { return slices.Contains(opsOnlyTypes, t) }

// Tenant is the owner the caller acts as: its configured source ("" for
// a caller without one, such as a worker credential, which owns nothing).
func (c *Caller) Tenant() string {
	if c == nil {
		return ""
	}
	return c.Source
}

// MayActOn reports whether the caller may change or remove what owner
// owns: its own tenant's, anything unowned (owner ""), anything with ops.
func (c *Caller) MayActOn(owner string) bool {
	if c == nil {
		return false
	}
	return owner == "" || c.Has(ScopeOps) || (c.Source != "" && owner == c.Source)
}

// OwnedKind is what a claim is on.
type OwnedKind string

// Owned kinds.
const (
	OwnedMailbox OwnedKind = "mailbox"
	OwnedOrg     OwnedKind = "org"
)

// OwnershipEffect is what one event does to ownership: the mailbox or org
// it acts on, and how.
type OwnershipEffect struct {
	Kind OwnedKind
	ID   string
	// Claims: the event registers the thing (mailbox.added, for its mailbox
	// and its org): an unowned one becomes the caller's.
	Claims bool
	// Releases: once on the log, the mailbox is no longer anyone's
	// (mailbox.removed).
	Releases bool
	// TransferTo: the thing becomes this tenant's (owner_transferred).
	TransferTo string
}

// OwnershipEffects returns what data does to ownership, in order (a
// mailbox.added: its mailbox, then its org): the lifecycle a producer
// drives (register, re-register with other credentials, endpoint or
// org, remove) and the operator's transfers. The internal mailbox types
// (health_scored, disabled, warmup_observed) have none: each needs its
// own publish scope, which an operator grants to fleet-wide systems (a
// warmup sweep, delivery reports) that speak about every tenant's
// mailboxes. user.active, worker events and org.plan_changed (ops and
// billing only) have none either.
func OwnershipEffects(data Data) []OwnershipEffect {
	switch d := data.(type) {
	case *MailboxAdded:
		return []OwnershipEffect{{Kind: OwnedMailbox, ID: d.MailboxID, Claims: true}, {Kind: OwnedOrg, ID: d.OrgID, Claims: true}}
	case *MailboxRemoved:
		return []OwnershipEffect{{Kind: OwnedMailbox, ID: d.MailboxID, Releases: true}}
	case *MailboxOwnerTransferred:
		return []OwnershipEffect{{Kind: OwnedMailbox, ID: d.MailboxID, TransferTo: d.Owner}}
	case *OrgOwnerTransferred:
		return []OwnershipEffect{{Kind: OwnedOrg, ID: d.OrgID, TransferTo: d.Owner}}
	}
	return nil
}

// TenantOf maps an event's source to the tenant that may speak as it: the
// longest of tenants whose caller may speak as src (Caller.MaySpeakAs).
// ok is false when no tenant may: the source is then its own owner, which
// no caller matches, so only an operator acts on what it registered. The
// claim backfill uses it on the log's sources.
func TenantOf(src string, tenants []string) (string, bool) {
	best := ""
	for _, t := range tenants {
		if len(t) > len(best) && (&Caller{Source: t}).MaySpeakAs(src) {
			best = t
		}
	}
	return best, best != ""
}
