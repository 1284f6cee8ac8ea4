// Package devfleet is what `mailplane dev` runs so that a newcomer sees
// placement, sync and the health loop work with no external system: an
// in-process IMAP server holding sample mailboxes (Server), and a small
// simulated fleet (Simulator) that registers those mailboxes and their
// orgs, keeps simulated sending workers alive with heartbeats, and delivers
// warmup mail between the sample mailboxes, into INBOX or Junk according to
// each sender's spam profile.
//
// Nothing here is for production: the IMAP server speaks plain IMAP (TLS
// mode none) and refuses to listen anywhere but on a loopback address, and
// every sample mailbox's password is DevPassword.
package devfleet

import (
	"time"

	"github.com/mailplane/mailplane/domain"
)

// DevPassword is the IMAP password of every sample mailbox.
const DevPassword = "dev-password"

// DefaultAddr is where the IMAP server listens unless told otherwise.
const DefaultAddr = "127.0.0.1:1143"

// Org is a sample org.
type Org struct {
	ID   string
	Name string
	Plan domain.Plan
}

// Mailbox is a sample mailbox: a user on the IMAP server and a mailbox
// registered with mailplane.
type Mailbox struct {
	ID      string
	OrgID   string
	UserID  string
	Address string // also the IMAP user name
	Name    string // display name in From headers
	// JunkRate is the share of the warmup mail this mailbox sends that
	// lands in the recipient's Junk folder.
	JunkRate float64
}

// Worker is a simulated sending worker.
type Worker struct {
	ID      string
	Tier    domain.Tier
	Egress  domain.Egress
	Address string
}

// The ids of ada@example.com, her org and her user are those of the
// examples in examples/events, so the README's walkthrough and the fleet
// talk about the same mailbox.
const (
	PremiumOrgID = "0190a5b2-4c5e-7b1a-9c3d-00000000a001"
	FreeOrgID    = "0190a5b2-4c5e-7b1a-9c3d-00000000a002"
	AdaUserID    = "0190a5b2-4c5e-7b1a-9c3d-00000000b001"
	GraceUserID  = "0190a5b2-4c5e-7b1a-9c3d-00000000b002"
	// AdaMailboxID is ada@example.com's mailbox id.
	AdaMailboxID = "0190a5b2-4c5e-7b1a-9c3d-00000000c001"
	// SpammyMailboxID is spammy@example.com's mailbox id: most of its
	// warmup mail lands in Junk.
	SpammyMailboxID = "0190a5b2-4c5e-7b1a-9c3d-00000000c002"
)

// Orgs returns the sample orgs: one premium, one free.
func Orgs() []Org {
	return []Org{
		{ID: PremiumOrgID, Name: "Analytical Engines", Plan: domain.PlanPremium},
		{ID: FreeOrgID, Name: "Hopper Labs", Plan: domain.PlanFree},
	}
}

// Mailboxes returns the sample mailboxes, ada@example.com first. Two
// belong to the premium org (ada and spammy), four to the free one.
func Mailboxes() []Mailbox {
	return []Mailbox{
		{ID: AdaMailboxID, OrgID: PremiumOrgID, UserID: AdaUserID, Address: "ada@example.com", Name: "Ada Lovelace", JunkRate: 0.05},
		{ID: SpammyMailboxID, OrgID: PremiumOrgID, UserID: AdaUserID, Address: "spammy@example.com", Name: "Spammy Offers", JunkRate: 0.60},
		{ID: "0190a5b2-4c5e-7b1a-9c3d-00000000c003", OrgID: FreeOrgID, UserID: GraceUserID, Address: "grace@example.com", Name: "Grace Hopper", JunkRate: 0},
		{ID: "0190a5b2-4c5e-7b1a-9c3d-00000000c004", OrgID: FreeOrgID, UserID: GraceUserID, Address: "alan@example.com", Name: "Alan Turing", JunkRate: 0.05},
		{ID: "0190a5b2-4c5e-7b1a-9c3d-00000000c005", OrgID: FreeOrgID, UserID: GraceUserID, Address: "edsger@example.com", Name: "Edsger Dijkstra", JunkRate: 0},
		{ID: "0190a5b2-4c5e-7b1a-9c3d-00000000c006", OrgID: FreeOrgID, UserID: GraceUserID, Address: "barbara@example.com", Name: "Barbara Liskov", JunkRate: 0},
	}
}

// Workers returns the simulated sending workers. The premium tier has one
// worker more than the premium org has mailboxes, so an idle clean worker
// is always there to be promoted into a risk pool when spammy@example.com's
// health turns bad (placement refuses, rather than mixes pools, when no
// idle worker exists). The first one is the worker of the examples.
func Workers() []Worker {
	return []Worker{
		{ID: "0190a5b2-4c5e-7b1a-9c3d-00000000d001", Tier: domain.TierSharedPremium, Egress: domain.EgressColdSMTP, Address: "premium-1.devfleet.invalid:25"},
		{ID: "0190a5b2-4c5e-7b1a-9c3d-00000000d002", Tier: domain.TierSharedPremium, Egress: domain.EgressColdSMTP, Address: "premium-2.devfleet.invalid:25"},
		{ID: "0190a5b2-4c5e-7b1a-9c3d-00000000d003", Tier: domain.TierSharedPremium, Egress: domain.EgressWarmupOnly, Address: "premium-3.devfleet.invalid:25"},
		{ID: "0190a5b2-4c5e-7b1a-9c3d-00000000d004", Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Address: "free-1.devfleet.invalid:25"},
		{ID: "0190a5b2-4c5e-7b1a-9c3d-00000000d005", Tier: domain.TierSharedFree, Egress: domain.EgressWarmupOnly, Address: "free-2.devfleet.invalid:25"},
	}
}

// fixedIDEpoch is the timestamp of every fixed event id (the examples'
// time), so ids sort before anything produced live.
var fixedIDEpoch = time.Date(2024, 7, 12, 6, 47, 24, 0, time.UTC)

// FixedEventID derives a stable event id (a UUIDv7) from key: the
// millisecond timestamp is fixed and the 74 "random" bits are the leading
// bits of SHA-256(domain separator, key). The same key yields the same id
// in every run, so a restart's re-publication is recognised by every
// consumer that dedupes by event id.
func FixedEventID(key string) string {
	return domain.DerivedID(fixedIDEpoch, "mailplane.devfleet.event-id.v1", key)
}
