package roles_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// composeSecrets are the variables docker-compose.yml must refuse to start
// without: none of them has a default, so no deployment runs on a key or
// token published in this repository.
var composeSecrets = []string{
	"POSTGRES_PASSWORD",
	"MAILPLANE_SEAL_KEYS",
	"MAILPLANE_API_TOKENS_FILE",
	"MAILPLANE_WORKER_FLEET_SECRET",
	"MAILPLANE_WARMUP_KEY",
}

// composeConfig runs `docker-compose config` on the repository's compose
// file with the environment stripped of every secret, plus set.
func composeConfig(t *testing.T, set map[string]string) (string, error) {
	t.Helper()
	bin, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Fatalf("docker-compose is needed to validate docker-compose.yml (apt-get install docker-compose, or make deps): %v", err)
	}
	file, err := filepath.Abs("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-f", file, "config")
	cmd.Dir = t.TempDir()
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "MAILPLANE_") || strings.HasPrefix(name, "POSTGRES_") {
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	for k, v := range set {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestComposeRefusesToStartWithoutItsSecrets(t *testing.T) {
	t.Parallel()
	tokens := filepath.Join(t.TempDir(), "api-tokens")
	if err := os.WriteFile(tokens, []byte("# callers\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	all := map[string]string{
		"POSTGRES_PASSWORD":             "pg-secret-from-the-store",
		"MAILPLANE_SEAL_KEYS":           "k1:bWFpbHBsYW5lLXRlc3Qta2V5LW5vdC1hLXJlYWwtb25lIQ==",
		"MAILPLANE_API_TOKENS_FILE":     tokens,
		"MAILPLANE_WORKER_FLEET_SECRET": "fleet-secret-from-the-store-32-bytes-long",
		"MAILPLANE_WARMUP_KEY":          "warmup-key-from-the-store",
	}
	out, err := composeConfig(t, all)
	if err != nil {
		t.Fatalf("docker-compose config with every secret set: %v\n%s", err, out)
	}
	for _, k := range composeSecrets {
		if k != "MAILPLANE_API_TOKENS_FILE" && !strings.Contains(out, all[k]) {
			t.Errorf("the rendered compose file does not use %s", k)
		}
	}
	// The fallbacks compose once had are gone for good.
	for _, old := range []string{"compose-dev-token", "bWFpbHBsYW5lLWNvbXBvc2UtZGV2LWtleS0zMmJ5dGU=", "mailplane:mailplane@"} {
		if strings.Contains(out, old) {
			t.Errorf("the rendered compose file still holds the public default %q", old)
		}
	}
	for _, missing := range composeSecrets {
		set := map[string]string{}
		for k, v := range all {
			if k != missing {
				set[k] = v
			}
		}
		out, err := composeConfig(t, set)
		if err == nil {
			t.Errorf("docker-compose config without %s succeeded; compose would start on a default", missing)
			continue
		}
		if !strings.Contains(out, missing) {
			t.Errorf("docker-compose config without %s failed without naming it:\n%s", missing, out)
		}
	}
}
