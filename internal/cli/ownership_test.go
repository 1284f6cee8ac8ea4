package cli_test

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/ownership"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/producer"
)

// TestOwnershipCommands: `ownership transfer` goes through the API (which
// applies it to the claims and puts it on the log), needs --api and an
// ops token; `ownership backfill` reads the log back into the claims.
func TestOwnershipCommands(t *testing.T) {
	t.Parallel()
	bin := mailplanetest.Build(t)
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	kcfg := kafkatest.Config(t, 4)
	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	const tokOps, tokBeta = "tok-ops-cli-0123456789abcdef0123456789ab", "tok-beta-cli-0123456789abcdef0123456789a"
	tokensFile := filepath.Join(t.TempDir(), "tokens")
	lines := access.Line("ops", tokOps, []string{domain.ScopeOps, domain.PublishScope(domain.TypeMailboxOwnerTransferred), domain.PublishScope(domain.TypeOrgOwnerTransferred)}, "/ops") + "\n" +
		access.Line("beta", tokBeta, []string{domain.ScopePublishPublic}, "/beta") + "\n"
	if err := os.WriteFile(tokensFile, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := access.FromBytes([]byte(lines))
	if err != nil {
		t.Fatal(err)
	}
	store := ownership.NewStore(db.Pool)
	g := ownership.NewGuard(store)
	srv, err := api.New(api.OwnershipProducer(producer.New(kc, producer.WithNamespace(kcfg.Namespace)), g),
		api.WithAuthenticator(auth), api.WithAdmission(api.OwnershipAdmission(g)))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	mb := "0190a5b2-4c5e-7b1a-9c3d-00000000c0aa"
	if _, err := db.Pool.Exec(ctx, `INSERT INTO ownership_claims (kind, id, owner, claimed_at) VALUES ('mailbox', $1, '/alpha', now())`, mb); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
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
	owner := func() string {
		k := ownership.Key{Kind: domain.OwnedMailbox, ID: mb}
		cs, err := store.Claims(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		return cs[k].Owner
	}
	transfer := []string{"ownership", "transfer", "--mailbox", mb, "--to", "/beta", "--comment", "ticket OPS-7"}

	if _, stderr, code := run(append(transfer, "--api-token", tokOps, "--source", "/ops")...); code != 2 || !strings.Contains(stderr, "--api") {
		t.Fatalf("without --api: exit %d, %s", code, stderr)
	}
	if stdout, _, code := run(append(transfer, "--api", hs.URL, "--api-token", tokBeta, "--source", "/beta")...); code != 1 || !strings.Contains(stdout, `"forbidden"`) {
		t.Fatalf("a producer's token: exit %d, %s", code, stdout)
	}
	if o := owner(); o != "/alpha" {
		t.Fatalf("after refused transfers: owner %q", o)
	}
	stdout, stderr, code := run(append(transfer, "--api", hs.URL, "--api-token", tokOps, "--source", "/ops")...)
	if code != 0 || !strings.Contains(stdout, domain.TypeMailboxOwnerTransferred) {
		t.Fatalf("transfer: exit %d, stdout %s, stderr %s", code, stdout, stderr)
	}
	if o := owner(); o != "/beta" {
		t.Fatalf("after the transfer: owner %q", o)
	}

	show := func(args ...string) string {
		stdout, stderr, code := run(append([]string{"ownership", "show", "--database-url", db.URL}, args...)...)
		if code != 0 {
			t.Fatalf("show %v: exit %d, %s", args, code, stderr)
		}
		return strings.TrimSpace(stdout)
	}
	if got := show("--mailbox", mb); got != "mailbox "+mb+": /beta" {
		t.Errorf("show: %q", got)
	}
	if got := show("--org", "0190a5b2-4c5e-7b1a-9c3d-00000000a0aa"); got != "org 0190a5b2-4c5e-7b1a-9c3d-00000000a0aa: unowned" {
		t.Errorf("show an unowned org: %q", got)
	}

	// The backfill finds the transfer on the log: the claim is there
	// already, so it writes nothing.
	stdout, stderr, code = run("ownership", "backfill", "--api-tokens-file", tokensFile, "--database-url", db.URL,
		"--brokers", strings.Join(kcfg.Brokers, ","), "--kafka-namespace", string(kcfg.Namespace))
	if code != 0 || !strings.Contains(stdout, "claims on the log: 1 mailboxes, 0 orgs; written (missing before): 0") {
		t.Fatalf("backfill: exit %d, stdout %s, stderr %s", code, stdout, stderr)
	}
}
