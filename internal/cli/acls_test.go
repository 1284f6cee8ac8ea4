package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/topics"
)

func TestACLsPlanPrintsRPKCommands(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := ACLs(context.Background(), []string{"plan", "--principals", "api=mp-api,analyst=analytics"}, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	want := topics.RPK(topics.ACLPlan("", map[topics.Role]string{topics.RoleAPI: "mp-api", topics.RoleAnalyst: "analytics"}))
	if got != want || !strings.Contains(got, "User:analytics --operation read,describe --topic "+topics.PlacementDecisions) {
		t.Fatalf("acls plan printed:\n%s\nwant:\n%s", got, want)
	}
	out.Reset()
	if err := ACLs(context.Background(), []string{"plan", "--format", "json", "--principals", "api=mp-api,analyst=analytics"}, &out); err != nil {
		t.Fatal(err)
	}
	var parsed aclsJSON
	if err := json.Unmarshal(out.Bytes(), &parsed); err != nil {
		t.Fatalf("acls plan --format json: %v\n%s", err, out.String())
	}
	if plan := topics.ACLPlan("", map[topics.Role]string{topics.RoleAPI: "mp-api", topics.RoleAnalyst: "analytics"}); !reflect.DeepEqual(parsed.Grants, plan) || parsed.Applied {
		t.Fatalf("acls plan --format json: %+v\nwant %+v", parsed, plan)
	}
	if err := ACLs(context.Background(), []string{"plan", "--format", "yaml", "--principals", "api=x"}, &out); ExitCode(err) != ExitUsage {
		t.Errorf("--format yaml: %v, exit %d", err, ExitCode(err))
	}
	for _, bad := range [][]string{{}, {"drop"}, {"plan"}, {"plan", "--principals", "root=x"}} {
		if err := ACLs(context.Background(), bad, &out); err == nil {
			t.Errorf("acls %q accepted", bad)
		}
	}
}

// `mailplane acls apply`, authenticated as a superuser over SCRAM with the
// --kafka-sasl-* settings, creates the plan's bindings on the broker.
func TestACLsApplyAsSuperuser(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(kafka.SASLScramSHA512, "ops", "ops-pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := strings.Join(c.ListenAddrs(), ",")
	var out bytes.Buffer
	args := []string{"apply", "--brokers", brokers, "--kafka-sasl-mechanism", kafka.SASLScramSHA512,
		"--kafka-sasl-user", "ops", "--kafka-sasl-password", "ops-pw", "--principals", "sync=mp-sync,analyst=analytics"}
	if err := ACLs(context.Background(), args, &out); err != nil {
		t.Fatalf("acls apply: %v (%s)", err, out.String())
	}
	plan := topics.ACLPlan("", map[topics.Role]string{topics.RoleSync: "mp-sync", topics.RoleAnalyst: "analytics"})
	if !strings.Contains(out.String(), "ACL bindings applied for 2 principals") {
		t.Fatalf("acls apply printed %q", out.String())
	}
	cl, err := kgo.NewClient(kafka.ConnOptions(kafka.Config{Brokers: c.ListenAddrs(),
		SASL: kafka.SASL{Mechanism: kafka.SASLScramSHA512, User: "ops", Password: "ops-pw"}})...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	described, err := kadm.NewClient(cl).DescribeACLs(ctx, kadm.NewACLs().AnyResource().Allow().AllowHosts().
		Operations(kadm.OpAny).ResourcePatternType(kadm.ACLPatternAny))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range described {
		if d.Err != nil {
			t.Fatal(d.Err)
		}
		n += len(d.Described)
	}
	// A binding is (principal, resource, name, operation): a topic both
	// read and written is described once.
	unique := map[string]bool{}
	for _, g := range plan {
		for _, name := range g.Names {
			for _, op := range g.Operations {
				unique[g.Principal+" "+g.Resource+" "+name+" "+op] = true
			}
		}
	}
	want := len(unique)
	if n != want {
		t.Fatalf("the broker holds %d ACL bindings, the plan makes %d", n, want)
	}
}
