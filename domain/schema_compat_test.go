package domain_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/eventschema"
)

const baselineDir = "schemas/baseline"

func baselineNames(t *testing.T) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(baselineDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range names {
		names[i] = filepath.Base(n)
	}
	return names
}

// TestSchemaCompatibleWithBaseline fails CI on a breaking change to a
// released schema (see schemas/baseline/README.md).
func TestSchemaCompatibleWithBaseline(t *testing.T) {
	t.Parallel()
	names := baselineNames(t)
	if len(names) == 0 {
		t.Fatal("no baselines")
	}
	for _, name := range names {
		old, err := os.ReadFile(filepath.Join(baselineDir, name))
		if err != nil {
			t.Fatal(err)
		}
		cur, err := fs.ReadFile(domain.SchemaFiles(), name)
		if err != nil {
			t.Errorf("%s: released schema has no current version (a released type is never removed): %v", name, err)
			continue
		}
		changes, err := eventschema.BreakingChanges(old, cur)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, c := range changes {
			t.Errorf("%s: breaking change to a released schema: %s (make a new versioned type instead)", name, c)
		}
	}
}

// TestSchemaEveryTypeHasBaseline makes releasing a type include its
// baseline.
func TestSchemaEveryTypeHasBaseline(t *testing.T) {
	t.Parallel()
	names := baselineNames(t)
	for _, typ := range domain.EventTypes() {
		if !slices.Contains(names, domain.SchemaFileName(typ)) {
			t.Errorf("%s has no baseline: copy domain/schemas/%s to %s and add its line to SHA256SUMS", typ, domain.SchemaFileName(typ), baselineDir)
		}
	}
}

// TestSchemaBaselinesUnedited checks every baseline against SHA256SUMS, so
// editing a released contract cannot happen by accident.
func TestSchemaBaselinesUnedited(t *testing.T) {
	t.Parallel()
	sums, err := os.ReadFile(filepath.Join(baselineDir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(sums))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS: malformed line %q", line)
		}
		listed[name] = sum
	}
	names := baselineNames(t)
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(baselineDir, name))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		switch want, ok := listed[name]; {
		case !ok:
			t.Errorf("%s is not in SHA256SUMS", name)
		case want != hex.EncodeToString(h[:]):
			t.Errorf("%s was edited: released baselines are never edited; a breaking change is a new versioned type", name)
		}
	}
	for name := range listed {
		if !slices.Contains(names, name) {
			t.Errorf("%s is in SHA256SUMS but was removed: released baselines are never removed", name)
		}
	}
}
