package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/health"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/topics"
)

// rebuildJSON is the part of `rebuild <projection> --format json` checked.
type rebuildJSON struct {
	Projection string `json:"projection"`
	Schema     string `json:"schema"`
	LiveSchema string `json:"live_schema"`
	Records    int64  `json:"records"`
	Positions  []struct {
		Topic string `json:"topic"`
		Next  int64  `json:"next_offset"`
	} `json:"positions"`
	Verify *struct {
		Equal  bool `json:"equal"`
		Tables []struct {
			Table       string `json:"table"`
			LiveRows    int64  `json:"live_rows"`
			OnlyLive    int64  `json:"only_live"`
			OnlyRebuilt int64  `json:"only_rebuilt"`
		} `json:"tables"`
	} `json:"verify"`
	Swapped bool `json:"swapped"`
}

type cleanupJSON struct {
	DryRun  bool `json:"dry_run"`
	Dropped []struct {
		Schema, Projection, State string
	} `json:"dropped"`
	Kept []struct{ Schema string } `json:"kept"`
}

func cliID(kind, i int) string { return fmt.Sprintf("0000000%d-0000-4000-8000-%012x", kind, i) }

// rebuildEvents is a stream each projection folds: mailboxes, orgs,
// workers and warmup observations (half the senders landing in junk).
func rebuildEvents(name string) []domain.Event {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var out []domain.Event
	ev := func(i int, d domain.Data) domain.Event {
		return domain.Event{ID: domain.NewEventID(), Type: d.EventType(), Source: "mailplane/test", Time: t0.Add(time.Duration(i) * time.Minute),
			Subject: d.AggregateID(), Data: d}
	}
	for i := range 120 {
		m := cliID(2, i%8)
		switch {
		case name == "health":
			p := domain.PlacedInbox
			if i%8%2 == 1 && i%3 > 0 {
				p = domain.PlacedJunk
			}
			at := t0.Add(time.Duration(i) * time.Minute)
			out = append(out, domain.Event{ID: domain.NewEventID(), Type: domain.TypeWarmupObserved, Source: "test", Time: at, Subject: m,
				Data: &domain.WarmupObserved{MailboxID: m, WarmupID: fmt.Sprintf("w-%d", i), Placement: p, LandedAt: at,
					Source: domain.ObservedBySync, RecipientMailboxID: cliID(2, 99)}})
		case i%4 == 0:
			out = append(out, ev(i, &domain.MailboxAdded{MailboxID: m, OrgID: cliID(3, i%3), UserID: cliID(4, i%5),
				Address: fmt.Sprintf("box%d@example.com", i), Provider: domain.ProviderSMTPIMAP,
				IMAP:              domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit, Username: fmt.Sprintf("user%d", i)},
				SealedCredentials: &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAAAAAAAAAAAAAA", Ciphertext: "c2VhbGVk"}}))
		case i%4 == 1:
			out = append(out, ev(i, &domain.MailboxHealthScored{MailboxID: m, State: domain.HealthWatch, Score: float64(i % 100), Reason: "bounces"}))
		case i%4 == 2:
			out = append(out, ev(i, &domain.OrgPlanChanged{OrgID: cliID(3, i%3), Plan: domain.PlanPremium, DedicatedWorkers: i % 3, Paid: true, Source: fmt.Sprint("billing-", i)}))
		default:
			out = append(out, ev(i, &domain.WorkerHeartbeat{WorkerID: cliID(1, i%4), Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP,
				Address: fmt.Sprintf("10.0.0.%d:25", i%200)}))
		}
	}
	return out
}

// TestRebuildCommands: `mailplane rebuild registry|health` through the
// binary, against a live projector running here: --swap alone is refused
// (exit 2) and creates nothing; --verify --format json finds the rebuild
// identical; a row altered by hand makes --verify exit 4, and --verify
// --swap then swaps nothing; --swap --yes swaps the rebuild in (repairing
// the row); rebuild cleanup needs --dry-run or --yes, keeps the newest
// with --keep 1, and never drops a user schema named like a rebuild's.
// Progress is drawn on a terminal, not when stdout is a pipe.
func TestRebuildCommands(t *testing.T) {
	t.Parallel()
	bin := mailplanetest.Build(t)
	for _, name := range []string{"registry", "health"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			kcfg := kafkatest.Config(t, 4)
			brokers := kcfg.Brokers
			db := pgtest.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := migrations.Apply(ctx, db.Pool); err != nil {
				t.Fatal(err)
			}
			var proj projections.Projection = projections.NewRegistry()
			table, alter, probe := "mailboxes",
				`UPDATE mailboxes SET address = 'drifted@example.com' WHERE mailbox_id = $1`,
				`SELECT address FROM mailboxes WHERE mailbox_id = $1`
			if name == "health" {
				s, err := health.NewScorer(domain.DefaultHealthPolicy())
				if err != nil {
					t.Fatal(err)
				}
				proj = s
				table, alter, probe = "mailbox_health",
					`UPDATE mailbox_health SET score = score / 2 + 1 WHERE mailbox_id = $1`,
					`SELECT score::text FROM mailbox_health WHERE mailbox_id = $1`
			}
			p, err := projections.New(kcfg, db.Pool, proj,
				projections.WithGroup(kafka.GroupConfig{SessionTimeout: kafkatest.SessionTimeout(2 * time.Second), HeartbeatInterval: 200 * time.Millisecond}),
				projections.WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			pctx, stop := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- p.Run(pctx) }()
			t.Cleanup(func() {
				stop()
				if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("projector: %v", err)
				}
			})

			prod, err := kafka.NewProducer(kcfg, kgo.RecordDeliveryTimeout(0))
			if err != nil {
				t.Fatal(err)
			}
			defer prod.Close()
			var recs []*kgo.Record
			for _, ev := range rebuildEvents(name) {
				r, err := topics.Encode(ev)
				if err != nil {
					t.Fatal(err)
				}
				r.Timestamp = ev.Time
				recs = append(recs, r)
			}
			if err := prod.ProduceSync(ctx, kafkatest.InNamespace(kcfg, recs...)...).FirstErr(); err != nil {
				t.Fatal(err)
			}
			// The live projector has applied every record.
			for deadline := time.Now().Add(30 * time.Second); ; {
				var applied int64
				if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM applied_events WHERE projector = $1`, name).Scan(&applied); err != nil {
					t.Fatal(err)
				}
				if applied == int64(len(recs)) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the live projector applied %d of %d events", applied, len(recs))
				}
				time.Sleep(20 * time.Millisecond)
			}

			run := func(args ...string) (string, string, int) {
				cmd := exec.Command(bin, args...)
				cmd.Env = []string{"PATH=/usr/bin:/bin", "MAILPLANE_DATABASE_URL=" + db.URL, "MAILPLANE_BROKERS=" + strings.Join(brokers, ","), "MAILPLANE_KAFKA_NAMESPACE=" + string(kcfg.Namespace)}
				var out, errb bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &errb
				err := cmd.Run()
				code := 0
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					code = ee.ExitCode()
				} else if err != nil {
					t.Fatal(err)
				}
				return out.String(), errb.String(), code
			}
			schemas := func() int64 {
				var n int64
				if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1`, db.Schema+"\\_%").Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			s := func(i int) string { return fmt.Sprintf("%s_%s_%d", db.Schema, name, i) }
			t.Cleanup(func() {
				for i := range 5 {
					_, _ = db.Pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{s(i)}.Sanitize()+` CASCADE`)
				}
			})

			// A swap without a verify and without --yes: refused, nothing made.
			for _, args := range [][]string{nil, {"nope"}} {
				if _, stderr, code := run(append([]string{"rebuild"}, args...)...); code != 2 || !strings.Contains(stderr, "usage: mailplane rebuild") {
					t.Errorf("rebuild %v: exit %d, want 2 (usage)\n%s", args, code, stderr)
				}
			}
			for _, args := range [][]string{{"--swap"}, {"--swap", "--schema", s(1)}, {"--yes"}} {
				_, stderr, code := run(append([]string{"rebuild", name}, args...)...)
				if code != 2 || !strings.Contains(stderr, "--swap") {
					t.Errorf("rebuild %s %v: exit %d, want 2 (usage)\n%s", name, args, code, stderr)
				}
			}
			if n := schemas(); n != 0 {
				t.Fatalf("a refused rebuild left %d schemas", n)
			}
			if _, stderr, code := run("rebuild", name, "--verify", "--schema", "public"); code != 2 || !strings.Contains(stderr, "rebuild schema is named") {
				t.Errorf("--schema public: exit %d\n%s", code, stderr)
			}

			// On a terminal (script(1) gives the command one) progress is drawn.
			scriptBin, err := exec.LookPath("script")
			if err != nil {
				t.Fatalf("script (util-linux) is needed to run the command on a terminal: %v", err)
			}
			tty := exec.Command(scriptBin, "-qec", strings.Join([]string{bin, "rebuild", name, "--schema", s(0)}, " "), "/dev/null")
			tty.Env = []string{"PATH=/usr/bin:/bin", "MAILPLANE_DATABASE_URL=" + db.URL, "MAILPLANE_BROKERS=" + strings.Join(brokers, ","), "MAILPLANE_KAFKA_NAMESPACE=" + string(kcfg.Namespace), "TERM=dumb"}
			if out, err := tty.CombinedOutput(); err != nil || !strings.Contains(string(out), "rebuild "+name+" [") ||
				!strings.Contains(string(out), "100.0%") || !strings.Contains(string(out), "done in") {
				t.Errorf("rebuild on a terminal: %v, no progress drawn:\n%q", err, out)
			}

			stdout, stderr, code := run("rebuild", name, "--verify", "--format", "json", "--schema", s(1))
			var rep rebuildJSON
			if err := json.Unmarshal([]byte(stdout), &rep); code != 0 || err != nil || rep.Projection != name || rep.Schema != s(1) ||
				rep.LiveSchema != db.Schema || rep.Records != int64(len(recs)) || len(rep.Positions) == 0 || rep.Verify == nil ||
				!rep.Verify.Equal || rep.Swapped {
				t.Fatalf("rebuild --verify --format json: exit %d, %v: %+v\n%s\n%s", code, err, rep, stdout, stderr)
			}
			if strings.Contains(stderr, "rebuild "+name+" [") {
				t.Errorf("progress drawn while stdout is not a terminal:\n%s", stderr)
			}

			// Drift: exit 4, and --verify --swap swaps nothing.
			key := cliID(2, 0)
			if _, err := db.Pool.Exec(ctx, alter, key); err != nil {
				t.Fatal(err)
			}
			var drifted string
			if err := db.Pool.QueryRow(ctx, probe, key).Scan(&drifted); err != nil {
				t.Fatal(err)
			}
			stdout, stderr, code = run("rebuild", name, "--verify", "--swap", "--format", "json", "--schema", s(2))
			rep = rebuildJSON{}
			if err := json.Unmarshal([]byte(stdout), &rep); code != 4 || err != nil || rep.Verify == nil || rep.Verify.Equal || rep.Swapped {
				t.Fatalf("rebuild --verify --swap of a drifted projection: exit %d (want 4), %v: %+v\n%s\n%s", code, err, rep, stdout, stderr)
			}
			for _, tr := range rep.Verify.Tables {
				if tr.Table == table && (tr.OnlyLive != 1 || tr.OnlyRebuilt != 1) {
					t.Errorf("%s: %d only live, %d only rebuilt, want 1 and 1", table, tr.OnlyLive, tr.OnlyRebuilt)
				}
			}
			var now string
			if err := db.Pool.QueryRow(ctx, probe, key).Scan(&now); err != nil || now != drifted {
				t.Errorf("a failed verify swapped: %s is %q, was %q (%v)", table, now, drifted, err)
			}

			// --swap --yes swaps the rebuild in: the row is the log's again.
			stdout, stderr, code = run("rebuild", name, "--swap", "--yes", "--schema", s(3))
			if code != 0 || !strings.Contains(stdout, "swapped in") {
				t.Fatalf("rebuild --swap --yes: exit %d\n%s\n%s", code, stdout, stderr)
			}
			if err := db.Pool.QueryRow(ctx, probe, key).Scan(&now); err != nil || now == drifted {
				t.Errorf("after the swap %s is still %q (%v)", table, now, err)
			}

			// Cleanup: a user schema named like a rebuild's is never listed.
			user := s(4)
			if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{user}.Sanitize()+`; CREATE TABLE `+
				pgx.Identifier{user, "keep_me"}.Sanitize()+` (id int)`); err != nil {
				t.Fatal(err)
			}
			if _, stderr, code := run("rebuild", "cleanup"); code != 2 || !strings.Contains(stderr, "--dry-run") {
				t.Errorf("rebuild cleanup without --dry-run or --yes: exit %d\n%s", code, stderr)
			}
			stdout, stderr, code = run("rebuild", "cleanup", "--dry-run", "--format", "json")
			var cl cleanupJSON
			if err := json.Unmarshal([]byte(stdout), &cl); code != 0 || err != nil || !cl.DryRun || len(cl.Dropped) != 4 {
				t.Fatalf("rebuild cleanup --dry-run: exit %d, %v: %+v\n%s", code, err, cl, stderr)
			}
			if n := schemas(); n != 5 {
				t.Errorf("--dry-run dropped something: %d schemas left of 5", n)
			}
			stdout, stderr, code = run("rebuild", "cleanup", "--yes", "--keep", "1", "--format", "json")
			cl = cleanupJSON{}
			if err := json.Unmarshal([]byte(stdout), &cl); code != 0 || err != nil || len(cl.Dropped) != 3 || len(cl.Kept) != 1 || cl.Kept[0].Schema != s(3) {
				t.Fatalf("rebuild cleanup --yes --keep 1: exit %d, %v: %+v\n%s", code, err, cl, stderr)
			}
			stdout, stderr, code = run("rebuild", "cleanup", "--yes")
			if code != 0 || !strings.Contains(stdout, s(3)) || !strings.Contains(stdout, "dropped") {
				t.Fatalf("rebuild cleanup --yes: exit %d\n%s\n%s", code, stdout, stderr)
			}
			// Each swap asked for and each cleanup is one audit record,
			// refused ones included; a rebuild without --swap is none.
			checkAudit(t, auditOf(t, kcfg, domain.OpsRebuildSwap), domain.OpsActorOSUser, "",
				wantAudit{domain.OpsRebuildSwap, domain.OpsRefused, "usage"}, wantAudit{domain.OpsRebuildSwap, domain.OpsRefused, "usage"},
				wantAudit{domain.OpsRebuildSwap, domain.OpsRefused, "verify_failed"}, wantAudit{domain.OpsRebuildSwap, domain.OpsOK, ""})
			cleanups := auditOf(t, kcfg, domain.OpsRebuildCleanup)
			checkAudit(t, cleanups, domain.OpsActorOSUser, "",
				wantAudit{domain.OpsRebuildCleanup, domain.OpsRefused, "usage"}, wantAudit{domain.OpsRebuildCleanup, domain.OpsOK, ""},
				wantAudit{domain.OpsRebuildCleanup, domain.OpsOK, ""}, wantAudit{domain.OpsRebuildCleanup, domain.OpsOK, ""})
			if len(cleanups) == 4 && (cleanups[2].Params == nil || cleanups[2].Params.Count != 3 || cleanups[2].Params.DryRun || cleanups[3].Params.Count != 1) {
				t.Errorf("cleanup parameters: %+v %+v", cleanups[2].Params, cleanups[3].Params)
			}
			var left []string
			rows, _ := db.Pool.Query(ctx, `SELECT nspname::text FROM pg_namespace WHERE nspname LIKE $1 ORDER BY 1`, db.Schema+"%")
			left, err = pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil || strings.Join(left, ",") != db.Schema+","+user {
				t.Errorf("schemas left: %v (%v), want the live one and %s", left, err, user)
			}
		})
	}
}
