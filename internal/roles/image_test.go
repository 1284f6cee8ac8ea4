package roles_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestImage: the image is built with go.mod's toolchain, stamps its
// version, carries a CA bundle (TLS to IMAP servers and OAuth token
// endpoints fails without one), runs unprivileged, and its build context
// leaves out the dev data directory (the dev seal key lives there).
func TestImage(t *testing.T) {
	t.Parallel()
	read := func(name string) string {
		b, err := os.ReadFile("../../" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	gomod, dockerfile, ignore := read("go.mod"), read("Dockerfile"), read(".dockerignore")
	want := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(gomod)
	if want == nil {
		t.Fatal("go.mod names no go version")
	}
	if !strings.Contains(dockerfile, "FROM golang:"+want[1]+" AS build") {
		t.Errorf("the build stage is not golang:%s (go.mod's toolchain)", want[1])
	}
	for _, must := range []string{
		"-X github.com/mailplane/mailplane/internal/buildinfo.version=${VERSION}",
		"/etc/ssl/certs/ca-certificates.crt",
		"USER mailplane",
	} {
		if !strings.Contains(dockerfile, must) {
			t.Errorf("Dockerfile lacks %q", must)
		}
	}
	kept := map[string]bool{}
	for _, line := range strings.Split(ignore, "\n") {
		kept[strings.TrimSpace(line)] = true
	}
	for _, must := range []string{"var", ".git", "bin"} {
		if !kept[must] {
			t.Errorf(".dockerignore does not leave out %s", must)
		}
	}
}
