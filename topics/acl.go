package topics

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
)

// Role is a mailplane process role (or a reader) that gets its own broker
// principal in production, so each may touch only what it needs: only
// mailplane's roles write domain topics, and analysts read the audit
// topics and nothing else (SECURITY.md).
type Role string

// Roles with broker access. Ops (topics apply, rebuild, dlq, publish,
// credentials reseal) run as a Redpanda superuser and need no plan.
const (
	RoleAPI     Role = "api"     // ingest, worker API, billing webhook
	RoleEngine  Role = "engine"  // the placement engine
	RoleState   Role = "state"   // the mailbox.state processor
	RoleProject Role = "project" // projectors, health scorer, their outbox relay
	RoleSync    Role = "sync"    // sync workers and their outbox relay
	RoleAnalyst Role = "analyst" // any Kafka client reading the audit topics
)

// Roles lists every role of the plan, in a fixed order.
func Roles() []Role {
	return []Role{RoleAPI, RoleEngine, RoleState, RoleProject, RoleSync, RoleAnalyst}
}

// Resource kinds of a Grant, as rpk names them.
const (
	ResourceTopic         = "topic"
	ResourceGroup         = "group"
	ResourceTransactional = "transactional-id"
	ResourceCluster       = "cluster"
)

// ACL operations used by the plan, as rpk names them.
const (
	OpRead            = "read"
	OpWrite           = "write"
	OpDescribe        = "describe"
	OpIdempotentWrite = "idempotent_write"
)

// Consumer group and transactional id names the plan grants. They are the
// defaults of the packages that use them; a deployment overriding one
// (another group for a second sync fleet) extends the plan by hand.
const (
	GroupPlacementEngine = "mailplane-placement-engine"
	GroupMailboxState    = "mailplane-mailbox-state"
	GroupSync            = "mailplane-sync"
	// GroupProjectorPrefix prefixes every projector's group (one per
	// projection).
	GroupProjectorPrefix = "mailplane-projector-"
	// TxnPlacementEngine is the engines' shared transactional id (the
	// fence between an active engine and a zombie).
	TxnPlacementEngine = "mailplane-placement-engine"
	// TxnMailboxStatePrefix prefixes the mailbox.state processors' ids.
	TxnMailboxStatePrefix = "mailplane-mailbox-state"
	// TxnOutboxPrefix prefixes the outbox relays' ids.
	TxnOutboxPrefix = "mailplane-outbox-"
	// GroupAnalystPrefix is the group prefix analysts' consumers use.
	GroupAnalystPrefix = "analytics-"
)

// IngestTopics are the topics producers publish to through the API: the
// domain topics and the observations, the source of truth, written only by
// mailplane's roles.
func IngestTopics() []string { return append(DomainTopics(), MailboxObservations) }

// AuditTopics are the topics analysts may read: the placement decision log
// (which is also the placement audit), the sync audit and the operator
// audit. Domain topics
// carry sealed credentials and personal data; the DLQ carries copies of
// them; neither is for analysts.
func AuditTopics() []string { return []string{PlacementDecisions, SyncAudit, OpsAudit} }

// outboxTopics are where an outbox relay publishes what the projectors and
// sync workers decided in Postgres transactions: health scores, disables and
// credential rotations (mailbox topic), warmup observations, sync tiers and
// audit.
func outboxTopics() []string {
	return []string{MailboxEvents, MailboxObservations, SyncTier, SyncAudit}
}

// Grant is one ACL binding of the plan: Principal may do Operations on the
// named resources (by prefix when Prefixed).
type Grant struct {
	Principal  string   `json:"principal"` // "User:<name>"
	Resource   string   `json:"resource"`  // ResourceTopic, ResourceGroup, ResourceTransactional or ResourceCluster
	Names      []string `json:"names"`
	Prefixed   bool     `json:"prefixed"`
	Operations []string `json:"operations"`
}

// ACLPlan returns the ACL bindings giving each role in principals (role →
// SASL user name) exactly the access it needs within namespace ns: every
// topic, group and transactional id (and every prefix) is ns's, so a
// principal of one namespace can touch nothing of another's. Roles missing
// from principals get nothing.
func ACLPlan(ns Namespace, principals map[Role]string) []Grant {
	var out []Grant
	for _, role := range Roles() {
		user, ok := principals[role]
		if !ok || user == "" {
			continue
		}
		p := "User:" + user
		topic := func(ops []string, names ...string) {
			out = append(out, Grant{Principal: p, Resource: ResourceTopic, Names: ns.Topics(names...), Operations: ops})
		}
		group := func(prefixed bool, name string) {
			out = append(out, Grant{Principal: p, Resource: ResourceGroup, Names: []string{ns.Group(name)}, Prefixed: prefixed, Operations: []string{OpRead, OpDescribe}})
		}
		txn := func(prefixed bool, id string) {
			out = append(out, Grant{Principal: p, Resource: ResourceTransactional, Names: []string{ns.TransactionalID(id)}, Prefixed: prefixed, Operations: []string{OpWrite, OpDescribe}})
		}
		idempotent := func() {
			out = append(out, Grant{Principal: p, Resource: ResourceCluster, Names: []string{"kafka-cluster"}, Operations: []string{OpIdempotentWrite}})
		}
		read := []string{OpRead, OpDescribe}
		write := []string{OpWrite, OpDescribe}
		switch role {
		case RoleAPI:
			// The API process serves the console and reloads the tokens
			// file: both write the operator audit.
			topic(write, append(IngestTopics(), OpsAudit)...)
			idempotent()
		case RoleEngine:
			topic(read, MailboxEvents, OrgEvents, UserEvents, WorkerEvents, PlacementDecisions)
			topic(write, PlacementDecisions, DLQ)
			group(false, GroupPlacementEngine)
			txn(false, TxnPlacementEngine)
			idempotent()
		case RoleState:
			topic(read, MailboxEvents, MailboxState, MailboxStateDedupe)
			topic(write, MailboxState, MailboxStateDedupe, DLQ)
			group(false, GroupMailboxState)
			txn(true, TxnMailboxStatePrefix)
			idempotent()
		case RoleProject:
			topic(read, MailboxEvents, MailboxObservations, OrgEvents, UserEvents, WorkerEvents, PlacementDecisions)
			topic(write, append(outboxTopics(), DLQ)...)
			group(true, GroupProjectorPrefix)
			txn(true, TxnOutboxPrefix)
			idempotent()
		case RoleSync:
			topic(read, MailboxState, UserEvents, SyncTier)
			topic(write, outboxTopics()...)
			group(false, GroupSync)
			txn(true, TxnOutboxPrefix)
			idempotent()
		case RoleAnalyst:
			topic(read, AuditTopics()...)
			group(true, GroupAnalystPrefix)
		}
	}
	return out
}

// RPK renders the plan as `rpk security acl create` commands, one per line.
func RPK(plan []Grant) string {
	var b strings.Builder
	for _, g := range plan {
		fmt.Fprintf(&b, "rpk security acl create --allow-principal %s --operation %s", g.Principal, strings.Join(g.Operations, ","))
		switch g.Resource {
		case ResourceCluster:
			b.WriteString(" --cluster")
		default:
			fmt.Fprintf(&b, " --%s %s", g.Resource, strings.Join(g.Names, ","))
		}
		if g.Prefixed {
			b.WriteString(" --resource-pattern-type prefixed")
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// ApplyACLs creates the plan's bindings on the cluster (creating an
// existing binding again is a no-op for Kafka and Redpanda). It needs a
// client authenticated as a superuser.
func ApplyACLs(ctx context.Context, adm *kadm.Client, plan []Grant) error {
	for _, g := range plan {
		b := kadm.NewACLs().Allow(g.Principal)
		switch g.Resource {
		case ResourceTopic:
			b.Topics(g.Names...)
		case ResourceGroup:
			b.Groups(g.Names...)
		case ResourceTransactional:
			b.TransactionalIDs(g.Names...)
		case ResourceCluster:
			b.Clusters()
		default:
			return fmt.Errorf("acl: unknown resource %q", g.Resource)
		}
		if g.Prefixed {
			b.ResourcePatternType(kadm.ACLPatternPrefixed)
		} else {
			b.ResourcePatternType(kadm.ACLPatternLiteral)
		}
		ops := make([]kadm.ACLOperation, 0, len(g.Operations))
		for _, o := range g.Operations {
			op, ok := aclOps[o]
			if !ok {
				return fmt.Errorf("acl: unknown operation %q", o)
			}
			ops = append(ops, op)
		}
		b.Operations(ops...)
		res, err := adm.CreateACLs(ctx, b)
		if err != nil {
			return fmt.Errorf("acl %s %s %v: %w", g.Principal, g.Resource, g.Names, err)
		}
		for _, r := range res {
			if r.Err != nil {
				return fmt.Errorf("acl %s %s %s: %w", g.Principal, g.Resource, r.Name, r.Err)
			}
		}
	}
	return nil
}

var aclOps = map[string]kadm.ACLOperation{
	OpRead:            kadm.OpRead,
	OpWrite:           kadm.OpWrite,
	OpDescribe:        kadm.OpDescribe,
	OpIdempotentWrite: kadm.OpIdempotentWrite,
}

// ParsePrincipals parses "role=user[,role=user...]" (e.g.
// "api=mailplane-api,analyst=analytics").
func ParsePrincipals(s string) (map[Role]string, error) {
	out := map[Role]string{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		r, u, ok := strings.Cut(part, "=")
		if !ok || u == "" || !slices.Contains(Roles(), Role(r)) {
			return nil, fmt.Errorf("principal %q: want role=user with role one of %v", part, Roles())
		}
		out[Role(r)] = u
	}
	return out, nil
}
