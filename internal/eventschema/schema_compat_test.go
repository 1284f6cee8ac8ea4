package eventschema_test

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
	"github.com/mailplane/mailplane/internal/eventschema"
)

// baselineDir holds the released domain event schemas (package domain
// embeds the current ones).
const baselineDir = "../../domain/schemas/baseline"

// baselineNames lists the released schemas in dir.
func baselineNames(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.json"))
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
	checkCompatibleWithBaseline(t, baselineDir, domain.SchemaFiles())
}

// checkCompatibleWithBaseline checks every released schema in dir against
// its current version in current.
func checkCompatibleWithBaseline(t *testing.T, dir string, current fs.FS) {
	t.Helper()
	names := baselineNames(t, dir)
	if len(names) == 0 {
		t.Fatalf("no baselines in %s", dir)
	}
	for _, name := range names {
		old, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		cur, err := fs.ReadFile(current, name)
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
	names := baselineNames(t, baselineDir)
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
	checkBaselinesUnedited(t, baselineDir)
}

// checkBaselinesUnedited checks the baselines in dir against dir's
// SHA256SUMS: none edited, none removed, none unlisted.
func checkBaselinesUnedited(t *testing.T, dir string) {
	t.Helper()
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
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
	names := baselineNames(t, dir)
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(dir, name))
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
