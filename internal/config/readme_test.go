package config_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The README's configuration reference is what `mailplane help config`
// prints, so it cannot drift from the flags.
func TestREADMEConfigReference(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "run", "../../cmd/mailplane", "help", "config").Output()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), strings.TrimSpace(string(out))) {
		t.Fatalf("README.md's configuration table differs from `mailplane help config`; paste this in:\n%s", out)
	}
}
