package cli_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/cli"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/opsaudit"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/topics"
)

// auditTrail reads the operator audit, oldest first.
func auditTrail(t *testing.T, kcfg kafka.Config) []opsaudit.Record {
	t.Helper()
	recs, err := opsaudit.Recent(t.Context(), kcfg, 1000)
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(recs)
	return recs
}

// auditOf is the operator audit's records of one action, oldest first.
func auditOf(t *testing.T, kcfg kafka.Config, action domain.OpsActionName) []opsaudit.Record {
	t.Helper()
	var out []opsaudit.Record
	for _, r := range auditTrail(t, kcfg) {
		if r.Action == action {
			out = append(out, r)
		}
	}
	return out
}

type wantAudit struct {
	action  domain.OpsActionName
	outcome domain.OpsOutcome
	code    string
}

func checkAudit(t *testing.T, got []opsaudit.Record, kind domain.OpsActorKind, actor string, want ...wantAudit) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d audit records, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Action != w.action || g.Outcome != w.outcome || g.Code != w.code || g.ActorKind != kind || g.Source != "mailplane/cli" ||
			(actor != "" && g.Actor != actor) || (actor == "" && !strings.Contains(g.Actor, "@")) {
			t.Errorf("audit record %d: %+v, want %+v by %s %q", i, g.OpsAction, w, kind, actor)
		}
	}
}

// TestCLIActionsAudited: each CLI operator action writes exactly one
// audit record, refused ones included, by the OS user when the command
// has no SASL user: a swap without a verify, a redrive of no consumer, a
// reseal without keys and one with a key, a cleanup (dry run, then
// refused without --yes).
func TestCLIActionsAudited(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 4)
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	b := []string{"--brokers", kcfg.Brokers[0], "--kafka-namespace", string(kcfg.Namespace)}
	with := func(args ...string) []string { return append(args, b...) }
	if err := cli.Rebuild(ctx, with("registry", "--swap")); cli.ExitCode(err) != cli.ExitUsage {
		t.Fatalf("swap without a verify: %v", err)
	}
	if err := cli.DLQ(ctx, with("redrive", "--consumer", "nobody", "--yes")); cli.ExitCode(err) != cli.ExitUsage {
		t.Fatalf("redrive of no consumer: %v", err)
	}
	if err := cli.Credentials(ctx, with("reseal", "--seal-keys", "", "--data-dir", t.TempDir())); err == nil {
		t.Fatal("reseal without keys")
	}
	// With a key: nothing to reseal on an empty log, done.
	key := "k2:" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	if err := cli.Credentials(ctx, with("reseal", "--seal-keys", key, "--data-dir", t.TempDir())); err != nil {
		t.Fatalf("reseal: %v", err)
	}
	if err := cli.Rebuild(ctx, with("cleanup", "--dry-run", "--database-url", db.URL)); err != nil {
		t.Fatalf("cleanup --dry-run: %v", err)
	}
	if err := cli.Rebuild(ctx, with("cleanup", "--database-url", db.URL)); cli.ExitCode(err) != cli.ExitUsage {
		t.Fatalf("cleanup without --yes: %v", err)
	}
	got := auditTrail(t, kcfg)
	checkAudit(t, got, domain.OpsActorOSUser, "",
		wantAudit{domain.OpsRebuildSwap, domain.OpsRefused, "usage"},
		wantAudit{domain.OpsDLQRedrive, domain.OpsRefused, "invalid"},
		wantAudit{domain.OpsCredentialsReseal, domain.OpsRefused, "invalid"},
		wantAudit{domain.OpsCredentialsReseal, domain.OpsOK, ""},
		wantAudit{domain.OpsRebuildCleanup, domain.OpsOK, ""},
		wantAudit{domain.OpsRebuildCleanup, domain.OpsRefused, "usage"},
	)
	if p := got[0].Params; p == nil || p.Target != "registry" {
		t.Errorf("swap parameters %+v", p)
	}
	if p := got[1].Params; p == nil || p.Target != "nobody" {
		t.Errorf("redrive parameters %+v", p)
	}
	if p := got[3].Params; p == nil || p.Target != "k2" || strings.Contains(got[3].Detail+p.Target, key[3:]) {
		t.Errorf("reseal parameters %+v (the active key's id only)", p)
	}
	if p := got[4].Params; p == nil || !p.DryRun || p.Filter != "keep=0 older_than=0s" {
		t.Errorf("cleanup parameters %+v", p)
	}
}

// TestACLsApplyAudited: `acls apply` is recorded by the Kafka SASL user it
// acted as, with the principals it granted (never the password); a
// refused apply too.
func TestACLsApplyAudited(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(kafka.SASLScramSHA512, "ops", "ops-pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	kcfg := kafka.Config{Brokers: c.ListenAddrs(), SASL: kafka.SASL{Mechanism: kafka.SASLScramSHA512, User: "ops", Password: "ops-pw"}}
	adm, err := kafka.NewClient(kcfg, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := topics.Apply(t.Context(), adm, topics.Catalog(topics.Config{StatePartitions: 4})); err != nil {
		t.Fatal(err)
	}
	args := []string{"apply", "--brokers", strings.Join(c.ListenAddrs(), ","), "--kafka-sasl-mechanism", kafka.SASLScramSHA512,
		"--kafka-sasl-user", "ops", "--kafka-sasl-password", "ops-pw"}
	var out bytes.Buffer
	if err := cli.ACLs(t.Context(), append(args, "--principals", "sync=mp-sync,analyst=analytics"), &out); err != nil {
		t.Fatalf("acls apply: %v", err)
	}
	if err := cli.ACLs(t.Context(), append(args, "--principals", "root=admin"), io.Discard); err == nil {
		t.Fatal("an unknown role was applied")
	}
	// A plan changes nothing and is not an action.
	if err := cli.ACLs(t.Context(), []string{"plan", "--principals", "api=mp-api"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	got := auditTrail(t, kcfg)
	checkAudit(t, got, domain.OpsActorKafkaPrincipal, "ops",
		wantAudit{domain.OpsACLApply, domain.OpsOK, ""},
		wantAudit{domain.OpsACLApply, domain.OpsRefused, "invalid"},
	)
	plan := topics.ACLPlan("", map[topics.Role]string{topics.RoleSync: "mp-sync", topics.RoleAnalyst: "analytics"})
	if p := got[0].Params; p == nil || p.Target != "sync=mp-sync,analyst=analytics" || p.Count != int64(len(plan)) {
		t.Errorf("apply parameters %+v", p)
	}
	for _, r := range got {
		if strings.Contains(r.Detail, "ops-pw") || (r.Params != nil && strings.Contains(r.Params.Target, "ops-pw")) {
			t.Errorf("the password is in the audit: %+v", r)
		}
	}
}
