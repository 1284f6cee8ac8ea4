package cli_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
)

func TestPublishCommand(t *testing.T) {
	t.Parallel()
	bin := mailplanetest.Build(t)
	kcfg := kafkatest.Config(t, 4)
	brokers := strings.Join(kcfg.Brokers, ",")
	key := "cli-1:" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 32))
	run := func(stdin string, args ...string) (string, string, int) {
		cmd := exec.Command(bin, append(args, "--brokers", brokers, "--kafka-namespace", string(kcfg.Namespace), "--data-dir", t.TempDir())...)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		cmd.Stdin = strings.NewReader(stdin)
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

	const worker = `{"worker_id":"0190a5b2-4c5e-7b1a-9c3d-00000000d009","tier":"%s","egress":"cold_smtp","address":"10.0.0.7"}`
	_, stderr, code := run("", "publish", "worker.heartbeat", "--data", strings.Replace(worker, "%s", "dedicated", 1))
	if code != 1 || !strings.Contains(stderr, "data.tier: tier_not_allowed") {
		t.Fatalf("dedicated tier: exit %d, stderr %s", code, stderr)
	}
	stdout, stderr, code := run(strings.Replace(worker, "%s", "shared_free", 1), "publish", "mailplane.worker.heartbeat.v1")
	var receipt struct {
		Topic  string `json:"topic"`
		Offset int64  `json:"offset"`
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &receipt) != nil || receipt.Topic != kcfg.Topic("mailplane.worker.events.v1") || receipt.Offset != 0 {
		t.Fatalf("valid heartbeat from stdin: exit %d, stdout %s, stderr %s", code, stdout, stderr)
	}

	const mailbox = `{"mailbox_id":"0190a5b2-4c5e-7b1a-9c3d-00000000c009","org_id":"0190a5b2-4c5e-7b1a-9c3d-00000000a001","user_id":"0190a5b2-4c5e-7b1a-9c3d-00000000b001","address":"bo@example.com","provider":"smtp_imap","imap":{"host":"imap.example.com","port":993,"tls":"implicit","username":"bo@example.com"},"credentials":{"password":"s3cret"}}`
	_, stderr, code = run("", "publish", "mailbox.added", "--data", mailbox)
	if code != 1 || !strings.Contains(stderr, "plaintext_secret") || strings.Contains(stderr, "s3cret") {
		t.Fatalf("plain credentials without a key: exit %d, stderr %s", code, stderr)
	}
	stdout, stderr, code = run("", "publish", "mailbox.added", "--data", mailbox, "--seal-keys", key)
	if code != 0 || !strings.Contains(stdout, `"offset":0`) {
		t.Fatalf("sealed publish: exit %d, stdout %s, stderr %s", code, stdout, stderr)
	}
	// Sealed credentials copied from the log are refused: only mailplane
	// seals.
	copied := strings.Replace(mailbox, `"credentials":{"password":"s3cret"}`, `"sealed_credentials":{"key_id":"cli-1","alg":"A256GCM","nonce":"AAAA","ciphertext":"AAAA"}`, 1)
	_, stderr, code = run("", "publish", "mailbox.added", "--data", copied, "--seal-keys", key)
	if code != 1 || !strings.Contains(stderr, "sealed_credentials_refused") {
		t.Fatalf("copied sealed credentials: exit %d, stderr %s", code, stderr)
	}
	_, stderr, code = run("", "publish", "mailbox.exploded", "--data", "{}")
	if code != 1 || !strings.Contains(stderr, "unknown_type") {
		t.Fatalf("unknown type: exit %d, stderr %s", code, stderr)
	}
}
