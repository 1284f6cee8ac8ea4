package roles

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/devfleet"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// startRoles runs rc's roles until the returned stop is called (or the
// test ends).
func startRoles(t *testing.T, rc *roleConfig) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runRoles(ctx, rc, nil) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("runRoles: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("runRoles did not stop within 30s")
		}
	}
	t.Cleanup(stop)
	return stop
}

func testKeyring(t *testing.T, active string, ids ...string) *sealing.Keyring {
	t.Helper()
	keys := map[string][]byte{}
	for _, id := range ids {
		// Derived from the id: the same id is the same key in every ring.
		k := make([]byte, sealing.KeySize)
		for i := range k {
			k[i] = byte(int(id[len(id)-1])*31 + i)
		}
		keys[id] = k
	}
	kr, err := sealing.NewKeyring(active, keys)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// TestKeyRotationEndToEnd: mailboxes registered under key k1; k2 is added
// and made active; `credentials reseal` re-seals every live mailbox under
// k2; k1 is removed from every role; every mailbox still syncs (a message
// delivered after the rotation lands in imap_messages).
func TestKeyRotationEndToEnd(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 4)
	kcfg.ClientID = "rotation-test"
	db := pgtest.New(t)
	srv, err := devfleet.Start(t.Context(), devfleet.WithAddr("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	host, ps, _ := net.SplitHostPort(srv.Addr())
	port, _ := strconv.Atoi(ps)
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))

	k1 := testKeyring(t, "k1", "k1")
	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	boxes := devfleet.Mailboxes()
	var evs []domain.Event
	pc1 := producer.New(kc, producer.WithSealer(k1), producer.WithSource("test/rotation"), producer.WithNamespace(kcfg.Namespace))
	for _, m := range boxes {
		evs = append(evs, pc1.NewEvent(&domain.MailboxAdded{MailboxID: m.ID, OrgID: m.OrgID, UserID: m.UserID, Address: m.Address,
			Provider: domain.ProviderSMTPIMAP, IMAP: domain.IMAPEndpoint{Host: host, Port: port, TLS: domain.TLSNone, Username: m.Address},
			Credentials: &domain.Credentials{Password: devfleet.DevPassword}}))
	}
	if _, err := pc1.Publish(t.Context(), evs...); err != nil {
		t.Fatal(err)
	}
	stateUnder := func(key string) func() bool {
		return func() bool {
			live, bad, err := mailboxstate.ReadLive(t.Context(), kcfg, kcfg.Topic(topics.MailboxState), log)
			if err != nil || bad > 0 || len(live) != len(boxes) {
				return false
			}
			for _, m := range live {
				if m.SealedCredentials == nil || m.SealedCredentials.KeyID != key {
					return false
				}
			}
			return true
		}
	}
	// The state processor folds the registrations: every mailbox under k1.
	stop := startRoles(t, &roleConfig{log: log, kafka: kcfg.WithClientID(""), databaseURL: db.URL, statePartitions: 4, stateProc: true})
	waitFor(t, 60*time.Second, "every mailbox in mailbox.state under k1", stateUnder("k1"))

	// k2 added and active; reseal; the processor folds the rotations.
	k12 := testKeyring(t, "k2", "k1", "k2")
	res, err := mailboxstate.Reseal(t.Context(), kcfg, k12, producer.New(kc, producer.WithSource("mailplane/cli"), producer.WithNamespace(kcfg.Namespace)), log)
	if err != nil || res.Resealed != len(boxes) || res.Failed != 0 || res.Live != len(boxes) {
		t.Fatalf("reseal: %+v, %v", res, err)
	}
	waitFor(t, 60*time.Second, "every mailbox in mailbox.state under k2", stateUnder("k2"))
	// Idempotent: nothing left to re-seal.
	if res, err := mailboxstate.Reseal(t.Context(), kcfg, k12, producer.New(kc, producer.WithNamespace(kcfg.Namespace)), log); err != nil || res.Resealed != 0 || res.Current != len(boxes) {
		t.Fatalf("second reseal: %+v, %v", res, err)
	}
	stop()

	// k1 removed everywhere: sync with k2 only.
	k2only := testKeyring(t, "k2", "k2")
	for _, m := range boxes {
		msg := fmt.Sprintf("From: x@example.org\r\nTo: %s\r\nSubject: after rotation\r\nMessage-ID: <rot-%s@example.org>\r\nDate: Tue, 01 Dec 2026 06:00:00 +0000\r\n\r\nhi\r\n", m.Address, m.ID)
		if err := srv.Deliver(m.Address, "INBOX", []byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	sc := mailsync.DefaultConfig()
	sc.WorkerID = "rotation-sync"
	sc.SessionTimeout, sc.HeartbeatInterval = kafkatest.SessionTimeout(time.Second), 200*time.Millisecond
	sc.PollWarm = 300 * time.Millisecond
	startRoles(t, &roleConfig{log: log, kafka: kcfg.WithClientID(""), databaseURL: db.URL, keyring: k2only, statePartitions: 4,
		stateProc: true, syncWorkers: 1, syncConfig: sc, syncRunner: "imap", imapDisableAfter: time.Hour,
		imapTransport: domain.MustTransportPolicy(host)})
	waitFor(t, 90*time.Second, "every mailbox synced the message delivered after the rotation", func() bool {
		var n int
		err := db.Pool.QueryRow(t.Context(), `SELECT count(DISTINCT mailbox_id) FROM imap_messages WHERE subject = 'after rotation'`).Scan(&n)
		return err == nil && n == len(boxes)
	})
}
