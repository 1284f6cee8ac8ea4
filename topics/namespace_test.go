package topics_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/topics"
)

func TestNamespaceNames(t *testing.T) {
	t.Parallel()
	ns := topics.Namespace("staging-2")
	if got := ns.Topic(topics.MailboxEvents); got != "staging-2.mailplane.mailbox.events.v1" {
		t.Errorf("Topic = %q", got)
	}
	if got := ns.Group("mailplane-sync"); got != "staging-2.mailplane-sync" {
		t.Errorf("Group = %q", got)
	}
	if got := ns.TransactionalID("mailplane-outbox-sync"); got != "staging-2.mailplane-outbox-sync" {
		t.Errorf("TransactionalID = %q", got)
	}
	if base, ok := ns.Base(ns.Topic(topics.SyncAudit)); !ok || base != topics.SyncAudit {
		t.Errorf("Base(Topic(x)) = %q, %v", base, ok)
	}
	for _, other := range []string{topics.SyncAudit, "staging.mailplane.sync.audit.v1", "staging-20.mailplane.sync.audit.v1"} {
		if _, ok := ns.Base(other); ok {
			t.Errorf("Base(%q) claims a topic of another namespace", other)
		}
	}
	var none topics.Namespace
	if none.Topic(topics.DLQ) != topics.DLQ || none.Group("g") != "g" || none.TransactionalID("x") != "x" {
		t.Error("the empty namespace changes names")
	}
	// The catalog in a namespace is the catalog, renamed.
	plain, named := topics.Catalog(topics.Config{StatePartitions: 8}), topics.Catalog(topics.Config{StatePartitions: 8, Namespace: ns})
	if len(plain) != len(named) {
		t.Fatalf("%d topics in the namespace, %d without", len(named), len(plain))
	}
	for i := range plain {
		want := plain[i]
		want.Name = ns.Topic(want.Name)
		if named[i] != want {
			t.Errorf("%+v in the namespace, want %+v", named[i], want)
		}
		if !topics.IsCatalogName(plain[i].Name) || topics.IsCatalogName(named[i].Name) {
			t.Errorf("IsCatalogName wrong for %s / %s", plain[i].Name, named[i].Name)
		}
	}
}

// TestNamespaceRefused: configuration is hostile input too; a name that
// could make two namespaces' names collide, or break Kafka's topic name
// rules, is refused.
func TestNamespaceRefused(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"", "staging", "t0a1b2c3", "ci-42", strings.Repeat("a", topics.MaxNamespaceLen)} {
		if _, err := topics.ParseNamespace(ok); err != nil {
			t.Errorf("ParseNamespace(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"Staging", "a.b", "-x", "a_b", "a b", "ä", "a\x00", "a/b", strings.Repeat("a", topics.MaxNamespaceLen+1)} {
		if _, err := topics.ParseNamespace(bad); err == nil {
			t.Errorf("ParseNamespace(%q) accepted", bad)
		}
	}
}

// TestACLPlanNamespaces: two deployments share a broker enforcing ACLs,
// each with its own principals and the plan of its namespace. Neither can
// write or read the other's topics, nor join the other's groups.
func TestACLPlanNamespaces(t *testing.T) {
	t.Parallel()
	staging := topics.Namespace("staging")
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(kafka.SASLScramSHA256, "ops", "ops-pw")}
	users := []string{"prod-api", "prod-analyst", "staging-api", "staging-analyst"}
	for _, u := range users {
		opts = append(opts, kfake.User(kafka.SASLScramSHA256, u, "pw-"+u))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ops, err := kafka.NewClient(roleConfig(brokers, "ops", "ops-pw"), kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer ops.Close()
	for _, ns := range []topics.Namespace{"", staging} {
		if rep, err := topics.Apply(ctx, ops, topics.Catalog(topics.Config{StatePartitions: 2, Namespace: ns})); err != nil || rep.Err() != nil {
			t.Fatalf("topics apply in %s: %v %v", ns, err, rep.Err())
		}
	}
	prodPlan := topics.ACLPlan("", map[topics.Role]string{topics.RoleAPI: "prod-api", topics.RoleAnalyst: "prod-analyst"})
	stagingPlan := topics.ACLPlan(staging, map[topics.Role]string{topics.RoleAPI: "staging-api", topics.RoleAnalyst: "staging-analyst"})
	for _, g := range stagingPlan {
		for _, n := range g.Names {
			if g.Resource != topics.ResourceCluster && !strings.HasPrefix(n, "staging.") {
				t.Errorf("staging's plan grants %s %q outside its namespace", g.Resource, n)
			}
		}
	}
	if err := topics.ApplyACLs(ctx, kadm.NewClient(ops), slices.Concat(prodPlan, stagingPlan)); err != nil {
		t.Fatal(err)
	}
	user := func(u string) kafka.Config { return roleConfig(brokers, u, "pw-"+u) }

	for _, tc := range []struct {
		user, topic string
		ok          bool
	}{
		{"staging-api", staging.Topic(topics.MailboxEvents), true},
		{"staging-api", topics.MailboxEvents, false},
		{"prod-api", topics.MailboxEvents, true},
		{"prod-api", staging.Topic(topics.MailboxEvents), false},
	} {
		err := produce(ctx, t, user(tc.user), tc.topic)
		if tc.ok && err != nil || !tc.ok && !denied(err) {
			t.Errorf("%s producing to %s: %v (want allowed: %v)", tc.user, tc.topic, err, tc.ok)
		}
	}
	for _, ns := range []topics.Namespace{"", staging} {
		if err := produce(ctx, t, roleConfig(brokers, "ops", "ops-pw"), ns.Topic(topics.PlacementDecisions)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		user, topic, group string
		ok                 bool
	}{
		{"staging-analyst", staging.Topic(topics.PlacementDecisions), staging.Group(topics.GroupAnalystPrefix + "a"), true},
		{"staging-analyst", topics.PlacementDecisions, topics.GroupAnalystPrefix + "a", false},
		{"staging-analyst", staging.Topic(topics.PlacementDecisions), topics.GroupAnalystPrefix + "a", false},
		{"prod-analyst", topics.PlacementDecisions, topics.GroupAnalystPrefix + "a", true},
		{"prod-analyst", staging.Topic(topics.PlacementDecisions), staging.Group(topics.GroupAnalystPrefix + "a"), false},
	} {
		rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
		err := consumeOne(rctx, user(tc.user), tc.topic, tc.group)
		rcancel()
		if tc.ok && err != nil || !tc.ok && !denied(err) {
			t.Errorf("%s reading %s in group %s: %v (want allowed: %v)", tc.user, tc.topic, tc.group, err, tc.ok)
		}
	}
}
