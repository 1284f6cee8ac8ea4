package roles_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/examples"
	"github.com/mailplane/mailplane/internal/devfleet"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/topics"
)

type devProc struct {
	cmd    *exec.Cmd
	out    *mailplanetest.Output
	done   chan error
	http   string
	broker string
	dbURL  string
}

// startDev runs mailplane dev on the given ports with extra flags; the dev
// IMAP server listens on a port of its choosing (port 0).
func startDev(t *testing.T, bin, dataDir string, kport, pport, hport int, extra ...string) *devProc {
	t.Helper()
	p := &devProc{
		out:    &mailplanetest.Output{},
		done:   make(chan error, 1),
		http:   fmt.Sprintf("127.0.0.1:%d", hport),
		broker: fmt.Sprintf("127.0.0.1:%d", kport),
		dbURL:  fmt.Sprintf("postgres://postgres@127.0.0.1:%d/mailplane?sslmode=disable", pport),
	}
	args := append([]string{"dev", "--data-dir", dataDir, "--kafka-port", fmt.Sprint(kport),
		"--pg-port", fmt.Sprint(pport), "--http", p.http, "--state-partitions", "8", "--dev-imap-addr", "127.0.0.1:0", "--ops-http", "127.0.0.1:0"}, extra...)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), "MAILPLANE_API_TOKEN=test-token", "MAILPLANE_DATABASE_URL=", "DATABASE_URL=")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-p.done:
			case <-time.After(30 * time.Second):
				p.cmd.Process.Kill()
			}
		}
	})
	mailplanetest.WaitFor(t, 90*time.Second, 100*time.Millisecond, "dev mode healthy", func() error {
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("mailplane dev exited: %v\n%s", err, p.out)
		default:
		}
		resp, err := http.Get("http://" + p.http + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("healthz %d", resp.StatusCode)
		}
		return nil
	})
	return p
}

func (p *devProc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("mailplane dev exit: %v\n%s", err, p.out)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("mailplane dev did not stop on SIGINT\n%s", p.out)
	}
}

func examplesBatch(t *testing.T) []byte {
	t.Helper()
	var parts []string
	for _, typ := range domain.EventTypes() {
		if domain.FromRolesOnly(typ) {
			continue // ingest refuses it from any caller
		}
		b, err := examples.Event(typ)
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, string(b))
	}
	return []byte("[" + strings.Join(parts, ",") + "]")
}

func post(t *testing.T, addr string, body []byte) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/events", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer test-token")
	req.Header.Set("Content-Type", "application/cloudevents-batch+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// registryExamples is how many of the examples the registry projection
// reads (those on the domain topics).
func registryExamples(t *testing.T) int {
	t.Helper()
	n := 0
	for _, typ := range domain.EventTypes() {
		if domain.FromRolesOnly(typ) {
			continue // not published by examplesBatch
		}
		topic, err := topics.ForType(typ)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(topics.DomainTopics(), topic) {
			n++
		}
	}
	return n
}

// registryState summarises the registry tables and the dedupe ledger.
func registryState(ctx context.Context, url string) (string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var s string
	err = conn.QueryRow(ctx, `select
		(select count(*) from mailboxes)::text || '/' ||
		(select count(*) from orgs)::text || '/' ||
		(select count(*) from users)::text || '/' ||
		(select count(*) from workers)::text || '/' ||
		(select count(*) from applied_events where projector = 'registry')::text || '/' ||
		(select coalesce(md5(string_agg(m::text, ',' order by mailbox_id)), '') from mailboxes m)`).Scan(&s)
	return s, err
}

// TestDevModeEndToEnd runs the README's path: make run, publish every
// example over HTTP, see it projected, read it with kcat, stop with Ctrl-C,
// start again on the same state (these two runs without the simulated
// fleet, whose heartbeats and registrations would blur the exact counts);
// then start a third time with the fleet, as `make run` does, and see the
// sample mailboxes registered, placed and synced from the dev IMAP server.
func TestDevModeEndToEnd(t *testing.T) {
	t.Parallel()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat not found: install it (make deps); analysts' Kafka client is part of what this test checks")
	}
	bin := mailplanetest.Build(t)
	// The private Postgres runs as the postgres user, which must be able to
	// reach the data dir: t.TempDir() is private to root.
	dataDir, err := os.MkdirTemp("/tmp", "mailplane-devtest-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dataDir, 0o755)
	t.Cleanup(func() { os.RemoveAll(dataDir) })
	kport, pport, hport := mailplanetest.FreePort(t), mailplanetest.FreePort(t), mailplanetest.FreePort(t)
	ctx := context.Background()

	// The example mailbox names the dev IMAP server's default address,
	// 127.0.0.1:1143; this one listens on a free port, and dev mode
	// allowlists only its own server's port: allowlist the examples' as an
	// operator would.
	examplesIMAP := "--imap-allow=" + devfleet.DefaultAddr
	p := startDev(t, bin, dataDir, kport, pport, hport, "--dev-fleet=false", examplesIMAP)
	if code, body := post(t, p.http, examplesBatch(t)); code != http.StatusAccepted {
		t.Fatalf("publish examples: %d %s", code, body)
	}
	var state string
	mailplanetest.WaitFor(t, 30*time.Second, 100*time.Millisecond, "examples projected", func() error {
		s, err := registryState(ctx, p.dbURL)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(s, fmt.Sprintf("1/1/1/1/%d/", registryExamples(t))) {
			return fmt.Errorf("registry %s", s)
		}
		state = s
		return nil
	})

	// Sealed on the log, never plain.
	conn, err := pgx.Connect(ctx, p.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	var keyID string
	if err := conn.QueryRow(ctx, `select sealed_credentials->>'key_id' from mailboxes`).Scan(&keyID); err != nil || keyID == "" {
		t.Fatalf("sealed credentials key id %q: %v", keyID, err)
	}
	conn.Close(ctx)

	// Analysts read it with kcat, attributes in ce_ headers.
	out, err := exec.Command(kcat, "-b", p.broker, "-C", "-t", "mailplane.user.events.v1", "-o", "beginning", "-e", "-q", "-J").Output()
	if err != nil {
		t.Fatalf("kcat: %v", err)
	}
	var msg struct {
		Key     string   `json:"key"`
		Payload string   `json:"payload"`
		Headers []string `json:"headers"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &msg); err != nil {
		t.Fatalf("kcat output %q: %v", out, err)
	}
	hdr := map[string]string{}
	for i := 0; i+1 < len(msg.Headers); i += 2 {
		hdr[msg.Headers[i]] = msg.Headers[i+1]
	}
	if hdr["ce_type"] != domain.TypeUserActive || hdr["ce_specversion"] != "1.0" || !domain.IsUUIDv7(hdr["ce_id"]) ||
		hdr["ce_subject"] != msg.Key || hdr["content-type"] != "application/json" || !strings.Contains(msg.Payload, `"user_id"`) {
		t.Fatalf("kcat read key %q headers %v payload %s", msg.Key, hdr, msg.Payload)
	}
	out, _ = exec.Command(kcat, "-b", p.broker, "-C", "-t", "mailplane.mailbox.events.v1", "-o", "beginning", "-e", "-q").Output()
	if bytes.Contains(out, []byte("dev-password")) {
		t.Fatal("plain-text password readable on the log")
	}

	p.stop(t)
	if _, err := registryState(ctx, p.dbURL); err == nil {
		t.Fatal("postgres still answers after dev mode stopped")
	}

	// Second start reuses the state; a retried publish changes nothing.
	p = startDev(t, bin, dataDir, kport, pport, hport, "--dev-fleet=false", examplesIMAP)
	if s, err := registryState(ctx, p.dbURL); err != nil || s != state {
		t.Fatalf("state after restart %q (%v), want %q", s, err, state)
	}
	if code, body := post(t, p.http, examplesBatch(t)); code != http.StatusAccepted {
		t.Fatalf("republish: %d %s", code, body)
	}
	// Wait until the projector has caught up with the republished records
	// (its offsets reach the end), then the state must be unchanged.
	mailplanetest.WaitFor(t, 30*time.Second, 100*time.Millisecond, "republished events consumed", func() error {
		conn, err := pgx.Connect(ctx, p.dbURL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		var n int64
		if err := conn.QueryRow(ctx, `select coalesce(sum(next_offset),0) from projector_offsets where projector = 'registry'`).Scan(&n); err != nil {
			return err
		}
		if want := 2 * int64(registryExamples(t)); n != want {
			return fmt.Errorf("projector consumed %d of %d records", n, want)
		}
		return nil
	})
	if s, err := registryState(ctx, p.dbURL); err != nil || s != state {
		t.Fatalf("state after duplicate publish %q (%v), want %q", s, err, state)
	}
	p.stop(t)

	// Third start, with the simulated fleet (dev mode's default).
	p = startDev(t, bin, dataDir, kport, pport, hport)
	for _, want := range []string{"ada@example.com / " + devfleet.DevPassword, "tls none", "simulated sending workers", "all-scopes dev caller"} {
		if !strings.Contains(p.out.String(), want) {
			t.Fatalf("banner lacks %q:\n%s", want, p.out)
		}
	}
	var ids []string
	for _, m := range devfleet.Mailboxes() {
		ids = append(ids, m.ID)
	}
	mailplanetest.WaitFor(t, 90*time.Second, 100*time.Millisecond, "sample mailboxes registered, placed and synced", func() error {
		conn, err := pgx.Connect(ctx, p.dbURL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		var registered, placed, synced int
		var adaRoles []string
		err = conn.QueryRow(ctx, `select
			(select count(*) from mailboxes where mailbox_id = any($1::uuid[]) and removed_at is null),
			(select count(*) from placement_mailboxes where mailbox_id = any($1::uuid[]) and worker_id is not null),
			(select count(distinct mailbox_id) from imap_messages where mailbox_id = any($1::uuid[])),
			(select coalesce(array_agg(distinct role order by role), '{}') from imap_messages where mailbox_id = $2::uuid)`,
			ids, devfleet.AdaMailboxID).Scan(&registered, &placed, &synced, &adaRoles)
		if err != nil {
			return err
		}
		if registered != len(ids) || placed != len(ids) || synced != len(ids) ||
			strings.Join(adaRoles, ",") != "inbox,junk,sent" {
			return fmt.Errorf("of %d sample mailboxes %d registered, %d placed, %d with synced messages; ada@example.com's synced folders %v",
				len(ids), registered, placed, synced, adaRoles)
		}
		return nil
	})
	// Warmup mail from the simulator reaches ada's synced messages.
	mailplanetest.WaitFor(t, 60*time.Second, 100*time.Millisecond, "warmup mail synced", func() error {
		conn, err := pgx.Connect(ctx, p.dbURL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, `select count(*) from imap_messages where mailbox_id = $1::uuid
			and message_id like '%@devfleet.mailplane.invalid' and message_id not like 'prefill-%'`, devfleet.AdaMailboxID).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("no warmup message synced for ada@example.com yet")
		}
		return nil
	})
	// The signed warmup headers are accepted: observations reach the
	// health scorer.
	mailplanetest.WaitFor(t, 60*time.Second, 100*time.Millisecond, "warmup observations scored", func() error {
		conn, err := pgx.Connect(ctx, p.dbURL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		var n int64
		if err := conn.QueryRow(ctx, `select coalesce(sum(observations), 0) from mailbox_health`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("no warmup observation scored yet")
		}
		return nil
	})
	out, _ = exec.Command(kcat, "-b", p.broker, "-C", "-t", "mailplane.mailbox.events.v1", "-o", "beginning", "-e", "-q").Output()
	if bytes.Contains(out, []byte(devfleet.DevPassword)) {
		t.Fatal("plain-text password readable on the log")
	}
	p.stop(t)
}
