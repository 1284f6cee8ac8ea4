// Package topics is the single place that names mailplane's Kafka topics
// (with partitions, retention and cleanup policy), applies them to a cluster,
// and encodes and decodes domain events as CloudEvents in Kafka binary mode.
package topics

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/mailplane/mailplane/domain"
)

// Topic names. Names are mailplane.<area>.<what>.v<n>.
const (
	MailboxEvents = "mailplane.mailbox.events.v1"
	// MailboxObservations holds evidence about mailboxes' health
	// (warmup_observed), keyed by mailbox id. It is apart from
	// mailbox.events so the high-volume evidence does not flow through the
	// consumers of the mailbox lifecycle (placement, mailbox.state).
	MailboxObservations = "mailplane.mailbox.observations.v1"
	OrgEvents           = "mailplane.org.events.v1"
	UserEvents          = "mailplane.user.events.v1"
	WorkerEvents        = "mailplane.worker.events.v1"
	PlacementDecisions  = "mailplane.placement.decisions.v1"
	MailboxState        = "mailplane.mailbox.state.v1"
	// MailboxStateDedupe is the changelog of the mailbox.state processor's
	// de-duplication: the ids of the mailbox events it applied within its
	// window, partition p holding those read from mailbox.events partition
	// p. Internal to the processor; nobody else reads or writes it.
	MailboxStateDedupe = "mailplane.mailbox.state-dedupe.v1"
	SyncTier           = "mailplane.sync.tier.v1"
	SyncAudit          = "mailplane.sync.audit.v1"
	DLQ                = "mailplane.dlq.v1"
	// OpsAudit is the operator audit (domain.OpsAction), keyed by actor.
	OpsAudit = "mailplane.ops.audit.v1"
)

// Cleanup policies.
const (
	CleanupDelete  = "delete"
	CleanupCompact = "compact"
	// CleanupCompactDelete compacts and also deletes by retention.
	CleanupCompactDelete = "compact,delete"
)

// Spec describes one topic.
type Spec struct {
	Name       string
	Partitions int32
	// RetentionMs is retention.ms; -1 keeps records forever.
	RetentionMs int64
	Cleanup     string
	// Purpose is a one-line description for operators.
	Purpose string
}

// Configs returns the topic-level configs mailplane manages.
func (s Spec) Configs() map[string]string {
	return map[string]string{
		"cleanup.policy": s.Cleanup,
		"retention.ms":   strconv.FormatInt(s.RetentionMs, 10),
	}
}

// Config sizes the catalog and names its namespace.
type Config struct {
	// StatePartitions is the partition count of mailbox.state and sync.tier,
	// the units of sync ownership; it bounds the number of sync workers.
	StatePartitions int32
	// Namespace prefixes every topic name (see Namespace).
	Namespace Namespace
}

// DefaultStatePartitions is the default partition count of mailbox.state.
const DefaultStatePartitions = 256

// MailboxEventsPartitions is the partition count of mailbox.events, and of
// mailbox.state-dedupe, which mirrors it partition for partition.
const MailboxEventsPartitions = 16

const (
	forever = -1
	week    = 7 * 24 * 3600 * 1000
	month   = 30 * 24 * 3600 * 1000
	// observationsRetention is 100 days.
	observationsRetention = 100 * 24 * 3600 * 1000
	year                  = 365 * 24 * 3600 * 1000
)

// Catalog returns every topic mailplane uses, named within cfg.Namespace.
func Catalog(cfg Config) []Spec {
	specs := catalog(cfg)
	for i := range specs {
		specs[i].Name = cfg.Namespace.Topic(specs[i].Name)
	}
	return specs
}

func catalog(cfg Config) []Spec {
	sp := cfg.StatePartitions
	if sp <= 0 {
		sp = DefaultStatePartitions
	}
	return []Spec{
		{MailboxEvents, MailboxEventsPartitions, forever, CleanupDelete, "mailbox domain events (source of truth), keyed by mailbox id"},
		// Kept for longer than the longest health penalty (90 days) plus
		// the scoring window and probation, so replaying it rebuilds the
		// health scorer's state; older evidence no longer counts.
		{MailboxObservations, MailboxEventsPartitions, observationsRetention, CleanupDelete, "warmup placement observations (health evidence), keyed by the sending mailbox id"},
		{OrgEvents, 4, forever, CleanupDelete, "org domain events (source of truth), keyed by org id"},
		{UserEvents, 16, forever, CleanupDelete, "user domain events (source of truth), keyed by user id"},
		{WorkerEvents, 8, forever, CleanupDelete, "worker domain events (source of truth), keyed by worker id"},
		{PlacementDecisions, 1, forever, CleanupDelete, "placement decision log and audit; total order; written only by the engine"},
		{MailboxState, sp, forever, CleanupCompact, "one record per live mailbox for sync; tombstone on removal"},
		// The processor tombstones each id once it leaves its window
		// (default 7 days), so compaction keeps the topic at one window of
		// ids; retention is the backstop for ids nobody tombstones (a
		// retired group). It must exceed the window plus the processor's
		// longest lag: ids of events folded more than a month ago are gone.
		{MailboxStateDedupe, MailboxEventsPartitions, month, CleanupCompactDelete, "event ids applied by the mailbox.state processor within its dedupe window, partition p for mailbox.events partition p; internal"},
		{SyncTier, sp, forever, CleanupCompact, "sync tier per mailbox, co-partitioned with mailbox.state"},
		{SyncAudit, 8, month, CleanupDelete, "sync ownership and tier changes, sync failures"},
		{OpsAudit, 4, year, CleanupDelete, "operator audit: who did which operator action, with its parameters and outcome; keyed by actor"},
		{DLQ, 1, forever, CleanupDelete, "dead letters with source topic, partition, offset, consumer, error, attempts"},
	}
}

// Lookup returns the spec of a topic in the catalog (name as Catalog
// names it, within cfg.Namespace).
func Lookup(cfg Config, name string) (Spec, bool) {
	for _, s := range Catalog(cfg) {
		if s.Name == name {
			return s, true
		}
	}
	return Spec{}, false
}

// ForAggregate returns the domain topic of an aggregate.
func ForAggregate(a domain.Aggregate) (string, error) {
	switch a {
	case domain.AggregateMailbox:
		return MailboxEvents, nil
	case domain.AggregateOrg:
		return OrgEvents, nil
	case domain.AggregateUser:
		return UserEvents, nil
	case domain.AggregateWorker:
		return WorkerEvents, nil
	}
	return "", fmt.Errorf("no topic for aggregate %q", a)
}

// ForType returns the domain topic events of eventType go to.
func ForType(eventType string) (string, error) {
	if eventType == domain.TypeWarmupObserved {
		return MailboxObservations, nil
	}
	a, ok := domain.AggregateOf(eventType)
	if !ok {
		return "", domain.Errorf(domain.CodeUnknownType, "unknown event type %q", eventType)
	}
	return ForAggregate(a)
}

// DomainTopics lists the aggregates' event topics, which placement and the
// registry consume. MailboxObservations also holds a domain event type
// (warmup_observed) but is consumed only by the health scorer.
func DomainTopics() []string {
	return []string{MailboxEvents, OrgEvents, UserEvents, WorkerEvents}
}

// IsCatalogName reports whether name is one of the catalog's topic names
// (outside any namespace).
func IsCatalogName(name string) bool { return catalogNames[name] }

// catalogNames is the catalog's names, built once: outbox.Add asks for
// every record it queues.
var catalogNames = func() map[string]bool {
	m := map[string]bool{}
	for _, s := range catalog(Config{}) {
		m[s.Name] = true
	}
	return m
}()

// RecordTypes returns the ce_types of the records on topic (a catalog
// name), sorted; package
// domain holds each one's Go type and schema (domain.NewRecord,
// domain.Schema, domain/schemas/derived). It is nil for the topics whose
// records are not in the catalog: the DLQ keeps other topics' records as
// they were, and mailbox.state-dedupe is internal to its processor.
func RecordTypes(topic string) []string {
	var ts []string
	switch topic {
	case MailboxEvents, MailboxObservations, OrgEvents, UserEvents, WorkerEvents:
		for _, t := range domain.EventTypes() {
			if to, err := ForType(t); err == nil && to == topic {
				ts = append(ts, t)
			}
		}
	case PlacementDecisions:
		ts = domain.PlacementDecisionTypes()
	case MailboxState:
		ts = []string{domain.TypeMailboxStateRecord}
	case SyncTier:
		ts = []string{domain.TypeSyncTierRecord}
	case OpsAudit:
		ts = []string{domain.TypeOpsAction}
	case SyncAudit:
		ts = []string{
			domain.TypeSyncOwnershipAcquired, domain.TypeSyncOwnershipLost, domain.TypeSyncOwnershipSuspended,
			domain.TypeSyncTierChanged, domain.TypeSyncFailed,
		}
	}
	slices.Sort(ts)
	return ts
}
