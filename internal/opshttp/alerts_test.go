package opshttp_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// rulesDir holds the Prometheus rules and their unit tests.
const rulesDir = "../../deploy/prometheus"

func promtool(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is needed to check the alert rules (apt-get install prometheus, or make deps): %v", err)
	}
	return bin
}

// TestAlertRules: compose's Prometheus configuration and the rules parse,
// and each alert fires on what it is for
// and stays quiet on the healthy case beside it (alerts_test.yml).
func TestAlertRules(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	for _, args := range [][]string{{"check", "config", "prometheus.yml"}, {"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = rulesDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

type ruleFile struct {
	Groups []struct {
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rulesDir, "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatal(err)
	}
	return rf
}

// registeredMetrics returns every mailplane_ metric name the production
// code registers (the names are string constants in internal/).
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	re := regexp.MustCompile(`"(mailplane_[a-z_]+)"`)
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !names["mailplane_build_info"] {
		t.Fatalf("read %d metric names from internal/, mailplane_build_info not among them", len(names))
	}
	return names
}

// TestAlertRulesReadRegisteredMetrics: every metric a rule reads is one the
// code registers, so a renamed metric cannot leave an alert silently empty.
func TestAlertRulesReadRegisteredMetrics(t *testing.T) {
	t.Parallel()
	known := registeredMetrics(t)
	metric := regexp.MustCompile(`\bmailplane_[a-z_]+\b`)
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			for _, name := range metric.FindAllString(r.Expr, -1) {
				base := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(name, suffix); ok && known[b] {
						base = b
					}
				}
				if !known[base] {
					t.Errorf("rule %s%s reads %s, which no code registers", r.Alert, r.Record, name)
				}
			}
		}
	}
}

// TestEveryAlertHasARunbookEntry: each alert's runbook annotation names a
// heading of docs/runbook.md.
func TestEveryAlertHasARunbookEntry(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			anchors[strings.ToLower(strings.TrimSpace(h))] = true
		}
	}
	alerts := 0
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			link := r.Annotations["runbook"]
			anchor, ok := strings.CutPrefix(link, "docs/runbook.md#")
			if !ok || anchor != strings.ToLower(r.Alert) || !anchors[anchor] {
				t.Errorf("alert %s links %q; want docs/runbook.md#%s with a heading ## %s there", r.Alert, link, strings.ToLower(r.Alert), r.Alert)
			}
		}
	}
	if alerts < 10 {
		t.Fatalf("read %d alerts", alerts)
	}
}

// recordedSeries returns the recording rules' names: a dashboard may read
// them as it reads registered metrics.
func recordedSeries(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				out[r.Record] = true
			}
		}
	}
	return out
}

// TestDashboardsReadRegisteredMetrics: every query of every provisioned
// dashboard reads metrics the code registers or series the recording rules
// make, so no panel stays empty after a rename.
func TestDashboardsReadRegisteredMetrics(t *testing.T) {
	t.Parallel()
	known, recorded := registeredMetrics(t), recordedSeries(t)
	files, err := filepath.Glob("../../deploy/grafana/dashboards/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards under deploy/grafana/dashboards (%v)", err)
	}
	metric := regexp.MustCompile(`\bmailplane(?::[a-z0-9_]+)+|\bmailplane_[a-z_]+\b`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			UID    string `json:"uid"`
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		queries := 0
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				queries++
				names := metric.FindAllString(tg.Expr, -1)
				if len(names) == 0 {
					t.Errorf("%s: panel %q queries no mailplane metric: %s", f, p.Title, tg.Expr)
				}
				for _, name := range names {
					base := name
					for _, suffix := range []string{"_bucket", "_sum", "_count"} {
						if b, ok := strings.CutSuffix(name, suffix); ok && known[b] {
							base = b
						}
					}
					if !known[base] && !recorded[name] {
						t.Errorf("%s: panel %q reads %s, which neither the code nor a recording rule makes", f, p.Title, name)
					}
				}
			}
		}
		if d.UID == "" || queries < 10 {
			t.Errorf("%s: uid %q, %d queries", f, d.UID, queries)
		}
	}
}
