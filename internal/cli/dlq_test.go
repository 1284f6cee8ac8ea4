package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/cli"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/topics"
)

type redriveOut struct {
	RedriveID string         `json:"redrive_id"`
	DryRun    bool           `json:"dry_run"`
	Summary   map[string]int `json:"summary"`
	Items     []struct {
		Offset         int64  `json:"dlq_offset"`
		Outcome        string `json:"outcome"`
		Code           string `json:"code"`
		Reason         string `json:"reason"`
		RedrivenOffset *int64 `json:"redriven_offset"`
	} `json:"items"`
}

// TestDLQRedriveCommand runs `mailplane dlq redrive` and `dlq list` as an
// operator does: what it prints as JSON, its exit codes, that it needs
// --yes without a terminal, that a second run skips what the first
// redrove, and what it refuses.
func TestDLQRedriveCommand(t *testing.T) {
	t.Parallel()
	bin := mailplanetest.Build(t)
	kcfg := kafkatest.Config(t, 4)
	brokers := kcfg.Brokers
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	src := func(offset int64, value string) *kgo.Record {
		return &kgo.Record{Topic: kcfg.Topic(topics.MailboxEvents), Partition: 1, Offset: offset,
			Key: []byte("0190a5b2-4c5e-7b1a-9c3d-00000000e001"), Value: []byte(value),
			Headers: []kgo.RecordHeader{{Key: topics.HeaderType, Value: []byte(domain.TypeMailboxRemoved)}}}
	}
	good := dlq.NewRecord(kcfg.Namespace, src(3, `{"mailbox_id":"0190a5b2-4c5e-7b1a-9c3d-00000000e001","reason":"x"}`),
		dlq.Failure{Consumer: "registry", Code: domain.CodeInvalid, Err: "check violation", Attempts: 3})
	secret := dlq.NewRecord(kcfg.Namespace, src(4, `{"mailbox_id":"0190a5b2-4c5e-7b1a-9c3d-00000000e001","credentials":{"password":"p"}}`),
		dlq.Failure{Consumer: "registry", Code: domain.CodePlaintextSecret, Err: "plain-text secret", Attempts: 1})
	if err := kc.ProduceSync(ctx, good, secret).FirstErr(); err != nil {
		t.Fatal(err)
	}

	run := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, append(args, "--brokers", strings.Join(brokers, ","), "--kafka-namespace", string(kcfg.Namespace))...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "MAILPLANE_DATABASE_URL=" + db.URL}
		cmd.Stdin = strings.NewReader("y\n") // not a terminal: never read as a yes
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
	decode := func(stdout string) redriveOut {
		t.Helper()
		var r redriveOut
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatalf("%v:\n%s", err, stdout)
		}
		return r
	}
	redriven := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM dlq_redrives`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Without --yes and without a terminal: the plan, exit 2, nothing done.
	stdout, stderr, code := run("dlq", "redrive", "--consumer", "registry", "--format", "json")
	plan := decode(stdout)
	if code != cli.ExitUsage || !strings.Contains(stderr, "--yes") || !plan.DryRun ||
		plan.Summary["would_redrive"] != 1 || plan.Summary["refused"] != 1 || redriven() != 0 {
		t.Fatalf("no --yes: exit %d, %+v, stderr %s, %d recorded", code, plan, stderr, redriven())
	}

	// --yes: one redriven, the withheld one refused: exit 5.
	stdout, stderr, code = run("dlq", "redrive", "--consumer", "registry", "--yes", "--format", "json")
	rep := decode(stdout)
	if code != cli.ExitPartial || rep.RedriveID == "" || rep.Summary["redriven"] != 1 || rep.Summary["refused"] != 1 {
		t.Fatalf("--yes: exit %d, %+v, stderr %s", code, rep, stderr)
	}
	var landed int64 = -1
	for _, it := range rep.Items {
		switch it.Outcome {
		case "redriven":
			if it.RedrivenOffset == nil {
				t.Fatalf("redriven item without its offset: %+v", it)
			}
			landed = *it.RedrivenOffset
		case "refused":
			if it.Code != string(domain.CodeValueWithheld) || !strings.Contains(it.Reason, "re-publish") {
				t.Fatalf("refusal %+v", it)
			}
		}
	}
	got := kafkatest.Fetch(t, brokers, kcfg.Topic(topics.MailboxEvents), 1, landed)
	if !bytes.Equal(got.Value, good.Value) || !bytes.Equal(got.Key, good.Key) {
		t.Fatalf("redriven record %q %q", got.Key, got.Value)
	}

	// Again, for its code only: skipped, exit 0.
	stdout, stderr, code = run("dlq", "redrive", "--consumer", "registry", "--code", "invalid", "--yes", "--format", "json")
	rep = decode(stdout)
	if code != cli.ExitOK || rep.Summary["skipped"] != 1 || rep.Summary["redriven"] != 0 || rep.Items[0].Code != string(domain.CodeAlreadyRedriven) {
		t.Fatalf("second run: exit %d, %+v, stderr %s", code, rep, stderr)
	}
	if redriven() != 1 {
		t.Fatalf("%d redrives recorded; want 1", redriven())
	}

	// The text table of a dry run: each dead letter's outcome and why, and
	// the summary; exit 5, as the redrive would (one is refused).
	stdout, _, code = run("dlq", "redrive", "--consumer", "registry", "--dry-run")
	t.Logf("dlq redrive --dry-run:\n%s", stdout)
	for _, want := range []string{"OUTCOME", "skipped", "already_redriven: redriven by cli", "value_withheld", "would_redrive 0, skipped 1, refused 1"} {
		if code != cli.ExitPartial || !strings.Contains(stdout, want) {
			t.Errorf("dry run: exit %d, no %q in\n%s", code, want, stdout)
		}
	}

	// dlq list shows it.
	stdout, stderr, code = run("dlq", "list", "--format", "json")
	var entries []struct {
		Offset   int64 `json:"offset"`
		Redriven *struct {
			Redriven bool   `json:"redriven"`
			State    string `json:"state"`
			Offset   *int64 `json:"offset"`
			Actor    string `json:"actor"`
		} `json:"redriven"`
	}
	if err := json.Unmarshal([]byte(stdout), &entries); err != nil || code != 0 || len(entries) != 2 {
		t.Fatalf("dlq list: exit %d, %v, %s %s", code, err, stdout, stderr)
	}
	if r := entries[0].Redriven; r == nil || !r.Redriven || r.State != "done" || r.Offset == nil || *r.Offset != landed || !strings.HasPrefix(r.Actor, "cli") {
		t.Fatalf("dlq list, redriven entry: %+v", r)
	}
	if r := entries[1].Redriven; r == nil || r.Redriven {
		t.Fatalf("dlq list, withheld entry: %+v", r)
	}
	stdout, _, code = run("dlq", "list")
	t.Logf("dlq list:\n%s", stdout)
	if code != 0 || !strings.Contains(stdout, "REDRIVEN") || !strings.Contains(stdout, "withheld (plaintext_secret)") {
		t.Fatalf("dlq list table: exit %d\n%s", code, stdout)
	}

	// Refused before anything is read: the engine, hostile names, no consumer.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--consumer", "placement-engine", "--yes"}, "not_redrivable"},
		{[]string{"--consumer", "registry\x1b[2J", "--yes"}, "forbidden_character"},
		{[]string{"--consumer", "registry", "--code", "invalid\nDROP", "--yes"}, "invalid"},
		{[]string{"--yes"}, "required"},
		{[]string{"--consumer", "registry", "--from-offset", "5", "--to-offset", "2"}, "out_of_range"},
	} {
		_, stderr, code := run(append([]string{"dlq", "redrive"}, c.args...)...)
		if code != cli.ExitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: exit %d, stderr %s; want exit %d and %s", c.args, code, stderr, cli.ExitUsage, c.want)
		}
	}
	if redriven() != 1 {
		t.Fatalf("refused runs recorded redrives: %d", redriven())
	}

	// Each redrive run is one record of the operator audit, by the OS
	// user, refused ones included (a dry run that would refuse one says
	// so too); the hostile consumer name is recorded cleaned.
	recs := auditOf(t, kcfg, domain.OpsDLQRedrive)
	checkAudit(t, recs, domain.OpsActorOSUser, "",
		wantAudit{domain.OpsDLQRedrive, domain.OpsRefused, "not_confirmed"},
		wantAudit{domain.OpsDLQRedrive, domain.OpsFailed, "partial"},
		wantAudit{domain.OpsDLQRedrive, domain.OpsOK, ""},
		wantAudit{domain.OpsDLQRedrive, domain.OpsRefused, "partial"},
		wantAudit{domain.OpsDLQRedrive, domain.OpsRefused, "not_redrivable"},
		wantAudit{domain.OpsDLQRedrive, domain.OpsRefused, "forbidden_character"},
		wantAudit{domain.OpsDLQRedrive, domain.OpsRefused, "invalid"},
		wantAudit{domain.OpsDLQRedrive, domain.OpsRefused, "required"},
		wantAudit{domain.OpsDLQRedrive, domain.OpsRefused, "out_of_range"})
	if len(recs) == 9 {
		if p := recs[1].Params; p == nil || p.Target != "registry" || p.Count != 1 || p.DryRun {
			t.Errorf("the redrive's parameters: %+v", p)
		}
		if p := recs[2].Params; p == nil || p.Filter != "code=invalid" || p.Count != 0 {
			t.Errorf("the second redrive's parameters: %+v", p)
		}
		if p := recs[3].Params; p == nil || !p.DryRun {
			t.Errorf("the dry run's parameters: %+v", p)
		}
		if p := recs[5].Params; p == nil || p.Target != "registry\uFFFD[2J" {
			t.Errorf("the hostile name recorded as %+v", p)
		}
	}
}
