package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/cli"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/opsaudit"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// TestProjectorSeekMovesWhatConsoleCannot: the registry projector's
// position lives in Postgres. Resetting its Kafka group's offsets (what
// Console's "reset offsets" does) moves nothing; `mailplane projector seek
// --end` on a stopped projector skips the records there for good, and it
// reads on after them; `projector positions` shows where each partition
// stands. The placement projection is never moved.
func TestProjectorSeekMovesWhatConsoleCannot(t *testing.T) {
	t.Parallel()
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
	pc := producer.New(kc, producer.WithSource("test/seek"), producer.WithNamespace(kcfg.Namespace))
	const org = "0190a5b2-4c5e-7b1a-9c3d-00000000c0c0"
	publish := func(plan domain.Plan) producer.Receipt {
		t.Helper()
		r, err := pc.PublishOrgPlanChanged(ctx, domain.OrgPlanChanged{OrgID: org, Plan: plan, Source: "test"})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	run := func() (stop func()) {
		p, err := projections.New(kcfg, db.Pool, projections.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		return func() {
			p.Close()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	plan := func() string {
		var s string
		if err := db.Pool.QueryRow(ctx, `SELECT plan FROM orgs WHERE org_id = $1`, org).Scan(&s); err != nil {
			return err.Error()
		}
		return s
	}
	waitPlan := func(want domain.Plan) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); plan() != string(want); {
			if time.Now().After(deadline) {
				t.Fatalf("plan %q, want %q", plan(), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	cliArgs := func(args ...string) []string {
		return append(args, "--brokers", brokers[0], "--kafka-namespace", string(kcfg.Namespace), "--database-url", db.URL)
	}

	stop := run()
	first := publish(domain.PlanFree)
	waitPlan(domain.PlanFree)
	stop()

	// Console's reset moves the group's offsets, not the projector.
	adm := kadm.NewClient(kc)
	var reset kadm.Offsets
	reset.AddOffset(kcfg.Topic(topics.OrgEvents), first.Partition, first.Offset+5, -1)
	if _, err := adm.CommitOffsets(ctx, kcfg.Group(projections.GroupName("registry")), reset); err != nil {
		t.Fatal(err)
	}
	skipped := publish(domain.PlanPremium)
	var out bytes.Buffer
	err = cli.Projector(ctx, cliArgs("seek", "--projector", "registry", "--topic", kcfg.Topic(topics.OrgEvents),
		"--partition", fmt.Sprint(skipped.Partition), "--end"), &out)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("registry %s/%d: %d -> %d\n", kcfg.Topic(topics.OrgEvents), skipped.Partition, first.Offset+1, skipped.Offset+1); out.String() != want {
		t.Fatalf("seek printed %q, want %q", out.String(), want)
	}

	stop = run()
	defer stop()
	publish(domain.PlanDedicated)
	waitPlan(domain.PlanDedicated)
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM applied_events WHERE projector = 'registry' AND event_id = $1`, skipped.ID).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the skipped event was applied (%d, %v)", n, err)
	}

	out.Reset()
	if err := cli.Projector(ctx, cliArgs("positions", "--projector", "registry"), &out); err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(fmt.Sprintf(`(?m)^registry +%s +%d +%d +%d +0 +`, regexp.QuoteMeta(kcfg.Topic(topics.OrgEvents)), skipped.Partition, skipped.Offset+2, skipped.Offset+2))
	if !row.MatchString(out.String()) {
		t.Errorf("positions:\n%s\nwant a row matching %s", out.String(), row)
	}

	out.Reset()
	if err := cli.Projector(ctx, cliArgs("positions", "--projector", "registry", "--format", "json"), &out); err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Projector, Topic string
		Partition        int32
		Position         int64
		End, Behind      *int64
	}
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("positions --format json: %v\n%s", err, out.String())
	}
	found := false
	for _, r := range rows {
		if r.Topic == kcfg.Topic(topics.OrgEvents) && r.Partition == skipped.Partition {
			found = r.Position == skipped.Offset+2 && r.End != nil && *r.End == skipped.Offset+2 && r.Behind != nil && *r.Behind == 0
		}
	}
	if !found {
		t.Errorf("positions --format json has no caught-up row for %s/%d:\n%s", kcfg.Topic(topics.OrgEvents), skipped.Partition, out.String())
	}

	// Hostile or mistaken seeks are refused and move nothing.
	for _, bad := range [][]string{
		{"seek", "--projector", "sync", "--topic", kcfg.Topic(topics.MailboxState), "--partition", "0", "--offset", "0"},
		{"seek", "--projector", "registry", "--topic", kcfg.Topic(topics.MailboxObservations), "--partition", "0", "--offset", "0"},
		{"seek", "--projector", "registry", "--topic", kcfg.Topic(topics.OrgEvents), "--partition", "99", "--offset", "0"},
		{"seek", "--projector", "registry", "--topic", kcfg.Topic(topics.OrgEvents), "--partition", fmt.Sprint(skipped.Partition), "--offset", fmt.Sprint(skipped.Offset + 100)},
		{"seek", "--projector", "registry", "--topic", kcfg.Topic(topics.OrgEvents), "--partition", "0", "--offset", "0", "--end"},
		{"seek", "--projector", "registry", "--topic", kcfg.Topic(topics.OrgEvents), "--partition", "0"},
	} {
		if err := cli.Projector(ctx, cliArgs(bad...), io.Discard); err == nil {
			t.Errorf("%v was accepted", bad)
		}
	}
	if pos, err := projections.Positions(ctx, db.Pool, ""); err != nil || slices.ContainsFunc(pos, func(p projections.Position) bool {
		return p.Projector != "registry" || p.Topic == kcfg.Topic(topics.MailboxObservations)
	}) {
		t.Errorf("a refused seek planted a position: %+v %v", pos, err)
	}

	err = cli.Projector(ctx, cliArgs("seek", "--projector", "placement", "--topic", kcfg.Topic(topics.PlacementDecisions), "--partition", "0", "--offset", "3"), &out)
	if !errors.Is(err, projections.ErrNotSeekable) {
		t.Errorf("seeking the placement projection: %v, want ErrNotSeekable", err)
	}

	// Each seek, refused ones included, is one record of the operator
	// audit, by the OS user (no SASL here), with what it asked.
	recs, err := opsaudit.Recent(ctx, kcfg, 100)
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(recs)
	wantCodes := []string{"", "not_seekable", "not_seekable", "not_found", "out_of_range", "usage", "usage", "not_seekable"}
	if len(recs) != len(wantCodes) {
		t.Fatalf("%d audit records, want one per seek (%d): %+v", len(recs), len(wantCodes), recs)
	}
	for i, r := range recs {
		want := domain.OpsRefused
		if i == 0 {
			want = domain.OpsOK
		}
		if r.Action != domain.OpsProjectorSeek || r.Outcome != want || r.Code != wantCodes[i] || r.ActorKind != domain.OpsActorOSUser ||
			!strings.Contains(r.Actor, "@") || r.Source != "mailplane/cli" || r.Params == nil {
			t.Errorf("audit record %d: %+v %+v, want %s %q", i, r.OpsAction, r.Params, want, wantCodes[i])
		}
	}
	if p := recs[0].Params; p.Target != "registry" || p.Filter != fmt.Sprintf("%s/%d", kcfg.Topic(topics.OrgEvents), skipped.Partition) || p.To != fmt.Sprint(skipped.Offset+1) {
		t.Errorf("the seek's parameters: %+v", p)
	}
}
