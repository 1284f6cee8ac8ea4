package config

import (
	"bytes"
	"flag"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestFormerEnvNames: a former name alone is read, with a warning naming
// it and the new name; with both set the new name's value wins and the
// warning says so; the warnings come once per process.
func TestFormerEnvNames(t *testing.T) {
	parse := func() (time.Duration, string) {
		fs := flag.NewFlagSet("sync", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		warm, db := PollWarm.Duration(fs), DatabaseURL.String(fs)
		if err := fs.Parse(nil); err != nil {
			t.Fatal(err)
		}
		return *warm, *db
	}
	for n, old := range formerEnv {
		t.Setenv(n, "")
		t.Setenv(old, "")
	}
	t.Setenv("POLL_WARM", "3m")
	t.Setenv("DATABASE_URL", "postgres://old")
	t.Setenv("MAILPLANE_DATABASE_URL", "postgres://new")
	warm, db := parse()
	if warm != 3*time.Minute {
		t.Errorf("POLL_WARM=3m alone: poll-warm %s, want 3m", warm)
	}
	if db != "postgres://new" {
		t.Errorf("both names set: database-url %q, want the new name's postgres://new", db)
	}

	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	WarnDeprecated(log)
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want one warning per former name set (2), got:\n%s", logs.String())
	}
	for _, want := range []struct{ line, old, new, says string }{
		{lines[0], "DATABASE_URL", "MAILPLANE_DATABASE_URL", "is also set and wins"},
		{lines[1], "POLL_WARM", "MAILPLANE_POLL_WARM", "rename it MAILPLANE_POLL_WARM"},
	} {
		for _, s := range []string{"level=WARN", "deprecated=" + want.old, "use=" + want.new, want.says} {
			if !strings.Contains(want.line, s) {
				t.Errorf("warning %q lacks %q", want.line, s)
			}
		}
	}
	logs.Reset()
	WarnDeprecated(log)
	if logs.Len() != 0 {
		t.Errorf("warned twice: %s", logs.String())
	}
}

// TestEnvNames: every setting's environment name has the MAILPLANE_
// prefix; every former name is unprefixed, belongs to a setting, and is
// no setting's current name; the reference lists every setting and no
// former name.
func TestEnvNames(t *testing.T) {
	current := map[string]bool{}
	for _, s := range settings {
		if !strings.HasPrefix(s.Env, "MAILPLANE_") {
			t.Errorf("--%s: environment name %s lacks the MAILPLANE_ prefix", s.Flag, s.Env)
		}
		current[s.Env] = true
	}
	for n, old := range formerEnv {
		if !current[n] || current[old] || strings.HasPrefix(old, "MAILPLANE_") {
			t.Errorf("former name %s of %s: want an unprefixed name of a registered setting", old, n)
		}
	}
	var ref bytes.Buffer
	PrintReference(&ref)
	if rows := strings.Count(ref.String(), "\n") - 2; rows != len(settings) {
		t.Errorf("reference has %d rows, want one per setting (%d)", rows, len(settings))
	}
	for _, old := range formerEnv {
		if strings.Contains(ref.String(), "`"+old+"`") {
			t.Errorf("reference lists the former name %s", old)
		}
	}
}

// TestConfigurationDocListsFormerNames: docs/configuration.md's table of
// renamed variables is formerEnv, row for row.
func TestConfigurationDocListsFormerNames(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([A-Z_]+)` \\| `([A-Z_]+)` \\|$")
	rows := 0
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		if old, n := m[1], m[2]; formerEnv[n] != old {
			t.Errorf("docs/configuration.md renames %s to %s; formerEnv has %q", old, n, formerEnv[n])
		}
		rows++
	}
	if rows != len(formerEnv) {
		t.Errorf("docs/configuration.md lists %d renamed variables, formerEnv %d", rows, len(formerEnv))
	}
}
