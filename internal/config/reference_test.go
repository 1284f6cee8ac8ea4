package config_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// docs/configuration.md's reference is what `mailplane help config`
// prints, byte for byte from its header to the end of the file, so it
// cannot drift from the flags; and that table names every environment
// variable with the MAILPLANE_ prefix only.
func TestConfigurationReference(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "run", "../../cmd/mailplane", "help", "config").Output()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	const header = "| flag | environment | default | meaning |\n"
	if !strings.HasPrefix(string(out), header) {
		t.Fatalf("`mailplane help config` does not start with the table header %q:\n%s", header, out)
	}
	i := strings.Index(string(doc), header)
	if i < 0 || string(doc[i:]) != string(out) {
		t.Fatalf("docs/configuration.md's reference differs from `mailplane help config`; run make docs-config")
	}
	rows := 0
	envCell := regexp.MustCompile("^\\| `--[a-z0-9-]+` \\| `([^`]*)` \\|")
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n")[2:] {
		m := envCell.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("row not of the form | `--flag` | `ENV` | ...: %s", line)
		}
		if !strings.HasPrefix(m[1], "MAILPLANE_") {
			t.Errorf("environment name %s lacks the MAILPLANE_ prefix", m[1])
		}
		rows++
	}
	if rows == 0 {
		t.Error("no settings in the reference")
	}
}
