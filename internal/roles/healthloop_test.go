package roles

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dovecottest"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// TestHealthLoop closes the whole loop with the production wiring
// (runRoles): warmup mail sent by mailbox ann lands in bob's Junk folder on
// Dovecot; bob's sync runner reports where each landed; the health scorer
// turns ann's spam rate into quarantined; the placement engine moves ann to
// a worker of the quarantine pool. Every step is checked on its topic.
func TestHealthLoop(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: runs every role against Dovecot")
	}
	dc := dovecottest.Start(t)
	dc.AddUser(t, "ann", "ann-secret-1")
	dc.AddUser(t, "bob", "bob-secret-2")
	kcfg := kafkatest.Config(t, 4)
	db := pgtest.New(t)

	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, dc.Cert.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	key := make([]byte, sealing.KeySize)
	for i := range key {
		key[i] = byte(3 * i)
	}
	keyring, err := sealing.NewKeyring("loop-1", map[string][]byte{"loop-1": key})
	if err != nil {
		t.Fatal(err)
	}
	sc := mailsync.DefaultConfig()
	sc.WorkerID = "loop-sync"
	sc.SessionTimeout, sc.HeartbeatInterval = kafkatest.SessionTimeout(time.Second), 200*time.Millisecond
	sc.PollWarm = 300 * time.Millisecond
	rc := &roleConfig{
		log:   slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		kafka: kcfg, databaseURL: db.URL, keyring: keyring, statePartitions: 4,
		engine: true, stateProc: true, project: true,
		syncWorkers: 1, syncConfig: sc, syncRunner: "imap", imapCAFile: caFile, imapDisableAfter: time.Hour,
		// Dovecot listens on loopback, which IMAP reaches only when allowlisted.
		imapTransport: domain.MustTransportPolicy("127.0.0.0/8"),
	}
	startRoles(t, rc)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	pc := producer.New(kc, producer.WithSealer(keyring), producer.WithSource("test/healthloop"), producer.WithNamespace(kcfg.Namespace))
	publish := func(ds ...domain.Data) {
		t.Helper()
		evs := make([]domain.Event, len(ds))
		for i, d := range ds {
			evs[i] = pc.NewEvent(d)
		}
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if _, err := pc.Publish(pctx, evs...); err != nil {
			t.Fatal(err)
		}
	}

	const (
		org  = "0190a5b2-4c5e-7b1a-9c3d-0000000e0001"
		user = "0190a5b2-4c5e-7b1a-9c3d-0000000e0002"
		ann  = "0190a5b2-4c5e-7b1a-9c3d-0000000e00a1"
		bob  = "0190a5b2-4c5e-7b1a-9c3d-0000000e00b1"
	)
	workers := []string{"0190a5b2-4c5e-7b1a-9c3d-0000000e0f01", "0190a5b2-4c5e-7b1a-9c3d-0000000e0f02", "0190a5b2-4c5e-7b1a-9c3d-0000000e0f03"}
	beat := func() {
		var ds []domain.Data
		for _, w := range workers {
			ds = append(ds, &domain.WorkerHeartbeat{WorkerID: w, Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Address: "smtp-" + w[len(w)-2:] + ".example.org"})
		}
		publish(ds...)
	}
	beat()
	go func() {
		tk := time.NewTicker(3 * time.Second)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				beat()
			}
		}
	}()
	mailbox := func(id, name, pw string) *domain.MailboxAdded {
		return &domain.MailboxAdded{MailboxID: id, OrgID: org, UserID: user, Address: name + "@example.org",
			Provider: domain.ProviderSMTPIMAP, WarmupEnabled: true,
			IMAP:        domain.IMAPEndpoint{Host: dc.Host, Port: dc.IMAPSPort, TLS: domain.TLSImplicit, Username: name},
			Credentials: &domain.Credentials{Password: pw}}
	}
	publish(&domain.OrgPlanChanged{OrgID: org, Plan: domain.PlanFree, Source: "test"})
	publish(mailbox(ann, "ann", "ann-secret-1"), mailbox(bob, "bob", "bob-secret-2"))

	// Both are placed on clean workers, one each (lowest utilisation).
	var annWorker string
	waitDecision(t, kcfg, "ann placed", func(d domain.PlacementDecision) bool {
		if a, ok := d.(*domain.PlacementAssigned); ok && a.MailboxID == ann {
			annWorker = a.WorkerID
			return true
		}
		return false
	})
	// Sync runs both mailboxes under an epoch.
	waitRecord(t, kcfg, topics.SyncAudit, "sync ownership acquired", func(r *kgo.Record) bool {
		return strings.Contains(headerValue(r, topics.HeaderType), "ownership_acquired")
	})

	// ann's warmup mail to bob: 6 of 20 land in Junk (30%: quarantined).
	deliverWarmup(t, dc, ann, "bob", nil)

	// 1. Observations, reported by bob's runner, about ann.
	checkWarmupObserved(t, kcfg, ann, bob)
	// 2. The scorer's verdict on the mailbox topic.
	waitRecord(t, kcfg, topics.MailboxEvents, "ann scored quarantined", func(r *kgo.Record) bool {
		ev, err := topics.Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		hs, ok := ev.Data.(*domain.MailboxHealthScored)
		return ok && hs.MailboxID == ann && hs.State == domain.HealthQuarantined
	})
	// 3. The engine moves ann to a quarantine-pool worker, not the one it
	// was on, and bob stays where he was.
	waitDecision(t, kcfg, "ann's band changed to quarantine", func(d domain.PlacementDecision) bool {
		b, ok := d.(*domain.PlacementBandChanged)
		return ok && b.MailboxID == ann && b.FromBand == domain.RiskClean && b.ToBand == domain.RiskQuarantine && b.Health == domain.HealthQuarantined
	})
	var promoted string
	waitDecision(t, kcfg, "a worker promoted into the quarantine pool", func(d domain.PlacementDecision) bool {
		if p, ok := d.(*domain.PlacementWorkerPromoted); ok && p.ToPool == domain.RiskQuarantine {
			promoted = p.WorkerID
			return true
		}
		return false
	})
	waitDecision(t, kcfg, "ann migrated to the quarantine pool", func(d domain.PlacementDecision) bool {
		m, ok := d.(*domain.PlacementMigrated)
		if !ok || m.MailboxID != ann {
			return false
		}
		if m.ToBand != domain.RiskQuarantine || m.FromWorker != annWorker || m.ToWorker != promoted {
			t.Fatalf("migration %+v (ann was on %s, %s promoted)", m, annWorker, promoted)
		}
		return true
	})
	// The row of the registry projection shows the state too.
	waitFor(t, 20*time.Second, "registry shows ann quarantined", func() bool {
		var s *string
		_ = db.Pool.QueryRow(context.Background(), `SELECT health_state FROM mailboxes WHERE mailbox_id = $1`, ann).Scan(&s)
		return s != nil && *s == "quarantined"
	})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func headerValue(r *kgo.Record, key string) string {
	v, _ := topics.Header(r, key)
	return v
}

// waitRecord reads topic from the start until match holds, failing after
// 60 s.
func waitRecord(t *testing.T, kcfg kafka.Config, topic, what string, match func(*kgo.Record) bool) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kcfg.Brokers...), kgo.ConsumeTopics(kcfg.Topic(topic)),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("waiting for %s on %s: timed out", what, topic)
		}
		for _, r := range fs.Records() {
			if match(r) {
				return
			}
		}
	}
}

func waitDecision(t *testing.T, kcfg kafka.Config, what string, match func(domain.PlacementDecision) bool) {
	t.Helper()
	waitRecord(t, kcfg, topics.PlacementDecisions, what, func(r *kgo.Record) bool {
		d, err := topics.DecodeDecision(r)
		if err != nil {
			t.Fatalf("decision: %v", err)
		}
		return match(d.Data)
	})
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// deliverWarmup delivers 20 warmup messages from sender to user's
// mailbox on dc, signed with key when given: 6 land in Junk (30 %, which
// quarantines the sender), the rest in INBOX.
func deliverWarmup(t *testing.T, dc *dovecottest.Server, sender, user string, key []byte) {
	t.Helper()
	for i := range 20 {
		folder := "INBOX"
		if i%10 < 3 {
			folder = "Junk"
		}
		dc.Deliver(t, user, folder, fmt.Appendf(nil, "From: Sender <sender@example.org>\r\nTo: %s@example.org\r\n"+
			"Subject: warmup %d\r\nMessage-ID: <w%d@example.org>\r\nDate: %s\r\nX-Mailplane-Warmup: %s\r\n\r\nhello\r\n",
			user, i, i, time.Now().UTC().Format(time.RFC1123Z), domain.FormatWarmupHeader(sender, fmt.Sprintf("w-%d", i), key)))
	}
}

// checkWarmupObserved waits for the 20 observations of deliverWarmup's
// messages, reported by recipient's runner about sender, 6 in Junk.
func checkWarmupObserved(t *testing.T, kcfg kafka.Config, sender, recipient string) {
	t.Helper()
	junk := 0
	seen := map[string]bool{}
	waitRecord(t, kcfg, topics.MailboxObservations, "20 warmup observations", func(r *kgo.Record) bool {
		ev, err := topics.Decode(r)
		if err != nil {
			t.Fatalf("observation: %v", err)
		}
		o := ev.Data.(*domain.WarmupObserved)
		if o.MailboxID != sender || o.RecipientMailboxID != recipient {
			t.Fatalf("observation %+v", o)
		}
		if !seen[o.WarmupID] {
			seen[o.WarmupID] = true
			if o.Placement == domain.PlacedJunk {
				junk++
			}
		}
		return len(seen) == 20
	})
	if junk != 6 {
		t.Fatalf("%d observations in junk, want 6", junk)
	}
}
