package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/topics"
)

func plID(kind, i int) string { return fmt.Sprintf("0000000%d-0000-4000-8000-%012x", kind, i) }

// TestRebuildAndShowCommands: a decision log (made by the pure decider,
// written to the broker) and its live projection; `mailplane rebuild
// placement --verify --swap` rebuilds, finds it identical and swaps it in;
// `mailplane placement show` lists pools and workers, and one mailbox's
// history.
func TestRebuildAndShowCommands(t *testing.T) {
	t.Parallel()
	bin := mailplanetest.Build(t)
	kcfg := kafkatest.Config(t, 4)
	brokers := kcfg.Brokers
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}

	// Decisions: a worker dead and forgotten, one dead, two free workers,
	// a premium one, a dedicated org, mailboxes.
	st := placement.NewState(placement.Config{WorkerRetention: 90 * time.Second})
	at := time.Date(2026, 4, 1, 9, 0, 0, 0, time.UTC)
	var ds []domain.PlacementDecision
	apply := func(d domain.Data) {
		at = at.Add(time.Second)
		ds = append(ds, st.Apply(placement.Input{At: at, Event: d})...)
	}
	apply(&domain.WorkerHeartbeat{WorkerID: plID(1, 5), Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Address: "10.0.0.5:25"})
	apply(&domain.WorkerHeartbeat{WorkerID: plID(1, 4), Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Address: "10.0.0.4:25"})
	at = at.Add(60 * time.Second)
	apply(&domain.WorkerHeartbeat{WorkerID: plID(1, 4), Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Address: "10.0.0.4:25"})
	apply(nil) // worker 5 dies
	at = at.Add(60 * time.Second)
	apply(nil) // worker 4 dies, worker 5 is forgotten
	if _, ok := st.Worker(plID(1, 5)); ok {
		t.Fatal("worker 5 not forgotten")
	}
	apply(&domain.WorkerHeartbeat{WorkerID: plID(1, 1), Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Address: "10.0.0.1:25"})
	apply(&domain.WorkerHeartbeat{WorkerID: plID(1, 2), Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Address: "10.0.0.2:25"})
	apply(&domain.WorkerHeartbeat{WorkerID: plID(1, 3), Tier: domain.TierSharedPremium, Egress: domain.EgressOAuthAPI, Address: "10.0.0.3:25"})
	apply(&domain.OrgPlanChanged{OrgID: plID(3, 2), Plan: domain.PlanDedicated, DedicatedWorkers: 2, Paid: true, Source: "evt_1"})
	for i := range 6 {
		apply(&domain.MailboxAdded{MailboxID: plID(2, i), OrgID: plID(3, 1+i%2), UserID: plID(3, 1), Provider: domain.ProviderSMTPIMAP})
	}
	apply(&domain.MailboxHealthScored{MailboxID: plID(2, 0), State: domain.HealthQuarantined, Score: 10, Reason: "sweep"})

	// No delivery timeout: it counts from the record's timestamp, which is
	// the decision's (past) time.
	kc, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	var recs []*kgo.Record
	for i, d := range ds {
		r, err := topics.EncodeDecision(topics.Decision{ID: domain.NewEventID(), Source: "test", Data: d,
			Cause: topics.Cause{ID: topics.CauseTick, Type: topics.CauseTick, Index: 0, Count: 1}})
		if err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
		recs = append(recs, r)
	}
	if err := kc.ProduceSync(ctx, kafkatest.InNamespace(kcfg, recs...)...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	live := make([]postgres.Record, len(recs))
	for i, r := range recs {
		d, err := topics.DecodeDecision(r)
		if err != nil {
			t.Fatal(err)
		}
		live[i] = postgres.Record{Offset: r.Offset, Decision: d}
	}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return postgres.New(kcfg.Namespace).ApplyDecisions(ctx, tx, live, int64(len(live)))
	}); err != nil {
		t.Fatal(err)
	}

	run := func(args ...string) (string, string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "MAILPLANE_DATABASE_URL=" + db.URL, "MAILPLANE_BROKERS=" + strings.Join(brokers, ","),
			"MAILPLANE_KAFKA_NAMESPACE=" + string(kcfg.Namespace)}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}

	rb := db.Schema + "_placement_1"
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+rb+" CASCADE") })
	stdout, stderr, code := run("rebuild", "placement", "--verify", "--swap", "--schema", rb)
	t.Logf("rebuild:\n%s%s", stderr, stdout)
	if code != 0 || !strings.Contains(stdout, "identical") || !strings.Contains(stdout, "swapped in") ||
		!strings.Contains(stdout, fmt.Sprintf("%d decisions up to offset %d", len(ds), len(ds))) {
		t.Fatalf("rebuild: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	// stdout is a pipe: no progress.
	if strings.Contains(stderr, "rebuild placement [") {
		t.Errorf("progress drawn while stdout is not a terminal:\n%s", stderr)
	}

	stdout, stderr, code = run("placement", "show")
	if code != 0 {
		t.Fatalf("show: exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{
		fmt.Sprintf("offset %d", len(ds)), "shared_free", "dedicated", plID(1, 1), plID(1, 3), "TIER", "LOAD/CAPACITY", "LAST SEEN",
		plID(1, 4), "dead workers: 1, the oldest last seen 2026-04-01T09:01:03Z", "--placement-worker-retention",
		"pending: 1 refused (no eligible worker), 0 degraded",
		"dedicated org " + plID(3, 2) + " has 1 of its 2 workers (short 1",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("placement show lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, plID(1, 5)) {
		t.Errorf("placement show lists forgotten worker %s:\n%s", plID(1, 5), stdout)
	}
	t.Logf("placement show:\n%s", stdout)
	stdout, _, code = run("placement", "show", "--mailbox", plID(2, 0))
	t.Logf("placement show --mailbox:\n%s", stdout)
	if code != 0 || !strings.Contains(stdout, "assigned") || !strings.Contains(stdout, "band_changed") ||
		!strings.Contains(stdout, "clean → quarantine") {
		t.Errorf("placement show --mailbox: exit %d\n%s", code, stdout)
	}
	if _, stderr, code := run("placement", "show", "--mailbox", "nope"); code != 1 || !strings.Contains(stderr, "not a lower-case UUID") {
		t.Errorf("bad mailbox id: exit %d %s", code, stderr)
	}

	// For scripts: --format json, and exit codes that tell findings
	// (drift 3, a failed verify 4) from failures (1) and usage (2).
	stdout, stderr, code = run("placement", "show", "--format", "json")
	var o postgres.Overview
	if err := json.Unmarshal([]byte(stdout), &o); code != 0 || err != nil || o.NextOffset != int64(len(ds)) || len(o.Pools) == 0 || o.Refused != 1 {
		t.Errorf("placement show --format json: exit %d, %v: %+v\n%s", code, err, o, stderr)
	}
	stdout, _, code = run("placement", "show", "--mailbox", plID(2, 0), "--format", "json")
	var m map[string]any
	if err := json.Unmarshal([]byte(stdout), &m); code != 0 || err != nil || m["placed"] != true || len(m["history"].([]any)) < 2 {
		t.Errorf("placement show --mailbox --format json: exit %d, %v: %s", code, err, stdout)
	}
	if _, _, code := run("placement", "show", "--format", "yaml"); code != 2 {
		t.Errorf("--format yaml: exit %d, want 2 (usage)", code)
	}
	if _, _, code := run("placement", "nope"); code != 2 {
		t.Errorf("placement nope: exit %d, want 2 (usage)", code)
	}
	if _, _, code := run("no-such-command"); code != 2 {
		t.Errorf("unknown command: exit %d, want 2", code)
	}
	// The live projection drifts from its log: verify finds it, exit 4.
	if _, err := db.Pool.Exec(ctx, `UPDATE placement_workers SET load_milli = load_milli + 1000 WHERE worker_id = $1`, plID(1, 1)); err != nil {
		t.Fatal(err)
	}
	rb2 := db.Schema + "_placement_2"
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+rb2+" CASCADE") })
	if stdout, stderr, code := run("rebuild", "placement", "--verify", "--schema", rb2); code != 4 {
		t.Errorf("rebuild --verify of a drifted projection: exit %d, want 4\n%s%s", code, stdout, stderr)
	}
	// The deprecated name still runs the command, and says so.
	if _, stderr, code := run("replay", "placement", "--swap"); code != 2 || !strings.Contains(stderr, "refusing --swap without --verify") ||
		!strings.Contains(stderr, "mailplane replay is deprecated") {
		t.Errorf("replay placement --swap alone: exit %d, want 2 and a deprecation warning\n%s", code, stderr)
	}
	// The swapped-out projection and the drifted verify's rebuild.
	stdout, stderr, code = run("rebuild", "cleanup", "--yes", "--format", "json")
	var cl struct {
		Dropped []struct{ Schema, State string } `json:"dropped"`
	}
	if err := json.Unmarshal([]byte(stdout), &cl); code != 0 || err != nil || len(cl.Dropped) != 2 ||
		cl.Dropped[0].Schema != rb2 || cl.Dropped[1].Schema != rb || cl.Dropped[1].State != "previous" {
		t.Errorf("rebuild cleanup --yes: exit %d, %v: %+v\n%s", code, err, cl, stderr)
	}
	stdout, stderr, code = run("topics", "list", "--format", "json")
	var specs []map[string]any
	if err := json.Unmarshal([]byte(stdout), &specs); code != 0 || err != nil || len(specs) != len(topics.Catalog(topics.Config{})) {
		t.Errorf("topics list --format json: exit %d, %v\n%s%s", code, err, stdout, stderr)
	}
	// The broker's mailbox.state has 4 partitions; a catalog of 8 drifts.
	stdout, stderr, code = run("topics", "apply", "--state-partitions", "8", "--format", "json")
	var rep struct {
		Drift []struct{ Topic, Field string } `json:"drift"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); code != 3 || err != nil || len(rep.Drift) == 0 {
		t.Errorf("topics apply with drift: exit %d (want 3), %v\n%s%s", code, err, stdout, stderr)
	}
	stdout, stderr, code = run("dlq", "list", "--format", "json")
	var dead []map[string]any
	if err := json.Unmarshal([]byte(stdout), &dead); code != 0 || err != nil {
		t.Errorf("dlq list --format json: exit %d, %v\n%s%s", code, err, stdout, stderr)
	}
}
