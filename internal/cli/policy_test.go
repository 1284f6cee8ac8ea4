package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
)

func runPolicy(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	err := Policy(args, &out)
	return out.String(), ExitCode(err)
}

func writePolicyFile(t *testing.T, name, doc string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// show --format json prints a document validate accepts as it is, and it
// is the default policy.
func TestPolicyShowJSONRoundTrips(t *testing.T) {
	doc, code := runPolicy(t, "show", "--format", "json")
	if code != ExitOK {
		t.Fatalf("show: exit %d: %s", code, doc)
	}
	p, ps := domain.ParsePolicy([]byte(doc))
	if len(ps) > 0 {
		t.Fatalf("show's document is refused: %v", ps)
	}
	if ch := domain.DiffPolicies(domain.DefaultPolicy(), p); len(ch) != 0 {
		t.Fatalf("show's document differs from the default: %+v", ch)
	}
	file := writePolicyFile(t, "p.json", doc)
	if out, code := runPolicy(t, "validate", file); code != ExitOK || !strings.Contains(out, "a valid policy (version 1)") {
		t.Fatalf("validate of show's document: exit %d: %s", code, out)
	}
	if out, code := runPolicy(t, "diff", "default", file); code != ExitOK || out != "no differences\n" {
		t.Fatalf("diff default and show's document: exit %d: %q", code, out)
	}
}

func TestPolicyShowText(t *testing.T) {
	out, code := runPolicy(t, "show")
	if code != ExitOK {
		t.Fatalf("exit %d", code)
	}
	for _, f := range domain.PolicyFields(domain.DefaultPolicy()) {
		if !strings.Contains(out, f.Field) {
			t.Errorf("show lacks %s:\n%s", f.Field, out)
		}
	}
	if !regexp.MustCompile(`(?m)^health\.levels\[2\]\.min_rate +0\.2$`).MatchString(out) {
		t.Errorf("show:\n%s", out)
	}
}

// An invalid document is refused with its field problems and exit 1.
func TestPolicyValidateRefuses(t *testing.T) {
	def, _ := json.Marshal(domain.DefaultPolicy())
	bad := strings.Replace(strings.Replace(string(def), `"window":"168h"`, `"window":"7d"`, 1), `"version":1`, `"version":1,"extra":true`, 1)
	out, code := runPolicy(t, "validate", writePolicyFile(t, "bad.json", bad))
	if code != ExitError || !strings.Contains(out, "extra: unknown_field") {
		t.Fatalf("unknown field: exit %d: %s", code, out)
	}
	bad = strings.Replace(string(def), `"window":"168h"`, `"window":"7d"`, 1)
	out, code = runPolicy(t, "validate", writePolicyFile(t, "bad.json", bad))
	if code != ExitError || !strings.Contains(out, "health.window: invalid") {
		t.Fatalf("bad duration: exit %d: %s", code, out)
	}
	huge := string(def) + strings.Repeat(" ", 10<<20)
	out, code = runPolicy(t, "validate", writePolicyFile(t, "huge.json", huge))
	if code != ExitError || !strings.Contains(out, "too_large") {
		t.Fatalf("10 MB: exit %d: %s", code, out)
	}
	if _, code := runPolicy(t, "validate", filepath.Join(t.TempDir(), "missing.json")); code != ExitError {
		t.Fatalf("missing file: exit %d", code)
	}
}

func TestPolicyDiff(t *testing.T) {
	def, _ := json.Marshal(domain.DefaultPolicy())
	strict := writePolicyFile(t, "strict.json", strings.Replace(string(def), `{"min_rate":0.2,"state":"quarantined"`, `{"min_rate":0.18,"state":"quarantined"`, 1))
	out, code := runPolicy(t, "diff", "-", strict)
	if code != ExitOK || out != "health.levels[2].min_rate  0.2  → 0.18\n" {
		t.Fatalf("diff: exit %d: %q", code, out)
	}
	out, code = runPolicy(t, "diff", "--format", "json", strict, "default")
	var got policyDiffJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != ExitOK {
		t.Fatalf("diff json: exit %d: %v: %s", code, err, out)
	}
	want := []domain.PolicyChange{{Field: "health.levels[2].min_rate", From: "0.18", To: "0.2"}}
	if len(got.Differences) != 1 || got.Differences[0] != want[0] {
		t.Fatalf("diff json: %+v", got)
	}
	if out, _ := runPolicy(t, "diff", "default", "-", "--format", "json"); !strings.Contains(out, `"differences": []`) {
		t.Fatalf("no differences must be an empty array: %s", out)
	}
}

func TestPolicyUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"apply", "x.json"}, {"validate"}, {"show", "extra"}, {"diff", "a"}, {"show", "--format", "yaml"}, {"show", "--bogus"}} {
		if _, code := runPolicy(t, args...); code != ExitUsage {
			t.Errorf("policy %q: exit %d, want %d", args, code, ExitUsage)
		}
	}
}

// docs/operating.md's table of the document names every field with its
// default.
func TestPolicyDocsListEveryField(t *testing.T) {
	b, err := os.ReadFile("../../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	_, sec, ok := strings.Cut(doc, "## The policy document")
	sec, _, _ = strings.Cut(sec, "\n## ")
	if !ok {
		t.Fatal("docs/operating.md has no section \"The policy document\"")
	}
	rows := map[string]string{}
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, " | ")
		if len(cells) >= 3 && strings.HasPrefix(cells[0], "| `") {
			rows[strings.Trim(cells[0], "| `")] = cells[1]
		}
	}
	levelRe := regexp.MustCompile(`\[\d+\]`)
	vals := map[string][]string{}
	var order []string
	for _, f := range domain.PolicyFields(domain.DefaultPolicy()) {
		k := levelRe.ReplaceAllString(f.Field, "[]")
		if i := strings.LastIndex(k, "_rates."); i >= 0 {
			k = k[:i+len("_rates")] + ".watch` … `.blocked"
		}
		if _, seen := vals[k]; !seen {
			order = append(order, k)
		}
		vals[k] = append(vals[k], f.Value)
	}
	for _, k := range order {
		if got, want := rows[k], strings.Join(vals[k], ", "); got != want {
			t.Errorf("docs/operating.md, %s: default %q, want %q", k, got, want)
		}
	}
	if len(rows) != len(order) {
		t.Errorf("docs/operating.md lists %d fields, the document has %d", len(rows), len(order))
	}
}
