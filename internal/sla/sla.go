// Package sla declares every Kafka consumer of mailplane with its service
// tier, in one table, and measures each against its tier's objectives: how
// far behind every partition is (records, and seconds since the oldest
// record not yet applied was appended) and how long a record takes from
// its append to its effect.
//
// The tiers are the queue-scaling seed's (docs/architecture.md, "Consumer
// tiers"): realtime under a second, interactive under five seconds, bulk
// in minutes, background in hours. The objectives are exported as metrics
// too, so the alert rules (deploy/prometheus/alerts.yml) compare each
// consumer with its own tier without repeating a number.
package sla

import (
	"fmt"
	"slices"
	"time"

	"github.com/mailplane/mailplane/topics"
)

// Tier is a consumer's service tier.
type Tier string

// The tiers, fastest first.
const (
	Realtime    Tier = "realtime"
	Interactive Tier = "interactive"
	Bulk        Tier = "bulk"
	Background  Tier = "background"
)

// Objective is what a tier promises.
type Objective struct {
	// Latency bounds the p95 time from a record's append to its effect.
	Latency time.Duration
	// Behind bounds how long the oldest record not yet applied may wait:
	// a partition over it for five minutes alerts.
	Behind time.Duration
	// Backlog bounds the records a partition may have waiting: over it
	// for ten minutes alerts (the seed's queue depth threshold).
	Backlog int64
}

var objectives = map[Tier]Objective{
	Realtime:    {Latency: time.Second, Behind: 10 * time.Second, Backlog: 1_000},
	Interactive: {Latency: 5 * time.Second, Behind: time.Minute, Backlog: 10_000},
	Bulk:        {Latency: 5 * time.Minute, Behind: 15 * time.Minute, Backlog: 1_000_000},
	Background:  {Latency: time.Hour, Behind: 2 * time.Hour, Backlog: 1_000_000},
}

// Objective returns the tier's objective.
func (t Tier) Objective() Objective { return objectives[t] }

// Tiers returns the tiers, fastest first.
func Tiers() []Tier { return []Tier{Realtime, Interactive, Bulk, Background} }

// Name names a consumer: its metric label and its entry in the table.
type Name string

// The consumers. Each process reports only the ones it runs.
const (
	// SyncActivity is every sync worker's reader of the user topic: a
	// user.active makes the user's mailboxes hot.
	SyncActivity Name = "sync-activity"
	// Sync is the sync group on mailbox.state: a mailbox's state record
	// starts, changes or stops its runner on the worker owning it.
	Sync Name = "sync"
	// MailboxState is the mailbox.state processor: a mailbox event
	// becomes the mailbox's state record.
	MailboxState Name = "mailbox-state"
	// PlacementEngine is the placement engine: an input event becomes its
	// placement decisions.
	PlacementEngine Name = "placement-engine"
	// PlacementProjection applies decisions to the tables the assignments
	// API serves.
	PlacementProjection Name = "placement-projection"
	// Registry projects the mailbox, org, user and worker registry.
	Registry Name = "registry"
	// Health scores warmup observations into health states.
	Health Name = "health"
)

// Consumer is one entry of the table.
type Consumer struct {
	Name Name
	Tier Tier
	// Topics are what it consumes.
	Topics []string
	// Effect says when a record counts as applied: where its latency ends.
	Effect string
}

// consumers is the one place a consumer's tier is declared.
var consumers = []Consumer{
	{SyncActivity, Realtime, []string{topics.UserEvents}, "the user's mailboxes owned by the worker are hot"},
	{Sync, Interactive, []string{topics.MailboxState}, "the owning worker started, changed or stopped the mailbox's runner"},
	{MailboxState, Interactive, []string{topics.MailboxEvents}, "the mailbox's state record is committed"},
	{PlacementEngine, Interactive, topics.DomainTopics(), "the transaction holding its decisions is committed"},
	{PlacementProjection, Interactive, []string{topics.PlacementDecisions}, "the assignments API serves the decision"},
	{Registry, Bulk, topics.DomainTopics(), "the registry rows are committed"},
	{Health, Background, []string{topics.MailboxObservations}, "the health scorer's transaction is committed"},
}

// Consumers returns the table.
func Consumers() []Consumer {
	out := slices.Clone(consumers)
	for i := range out {
		out[i].Topics = slices.Clone(out[i].Topics)
	}
	return out
}

// Lookup returns the consumer named n.
func Lookup(n Name) (Consumer, error) {
	for _, c := range consumers {
		if c.Name == n {
			return c, nil
		}
	}
	return Consumer{}, fmt.Errorf("sla: no consumer %q in the table", n)
}
