package conventions_test

import (
	"bufio"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// moduleRoot is the repository's root, where go.mod is.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

// readDoc reads a file of the repository by its slash path.
func readDoc(t *testing.T, root, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// section returns the text of the "## N. ..." section of a markdown
// document, up to the next level-two heading.
func section(doc, n string) string {
	var out []string
	in := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "## ") {
			if in {
				break
			}
			in = strings.HasPrefix(line, "## "+n+". ")
			continue
		}
		if in {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

var backticked = regexp.MustCompile("`([^`]+)`")

// TestArchitectureListsEveryPackage: the package tables of
// docs/architecture.md §2 name, by full path, exactly the packages `go list
// ./...` prints, each once, so the map cannot drift from the code.
func TestArchitectureListsEveryPackage(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	sec := section(readDoc(t, root, "docs/architecture.md"), "2")
	if sec == "" {
		t.Fatal(`docs/architecture.md has no "## 2. " section`)
	}
	listed := map[string]int{}
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "| `") || len(cells) < 3 {
			continue
		}
		for _, m := range backticked.FindAllStringSubmatch(cells[1], -1) {
			listed[strings.TrimSuffix(m[1], "/")]++
		}
	}

	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	module := modulePath(t, root)
	actual := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		actual[strings.TrimPrefix(strings.TrimPrefix(p, module), "/")] = true
	}
	if len(actual) < 20 {
		t.Fatalf("go list printed %d packages: not the module", len(actual))
	}
	for _, p := range sortedKeys(actual) {
		if listed[p] == 0 {
			t.Errorf("package %s is missing from docs/architecture.md §2", p)
		}
	}
	for _, p := range sortedKeys(listed) {
		if !actual[p] {
			t.Errorf("docs/architecture.md §2 lists %s, which go list does not know", p)
		}
		if listed[p] > 1 {
			t.Errorf("docs/architecture.md §2 lists %s %d times", p, listed[p])
		}
	}
}

// modulePath is the module's path from go.mod.
func modulePath(t *testing.T, root string) string {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(readDoc(t, root, "go.mod")))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "module "); ok {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatal("go.mod names no module")
	return ""
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

var (
	fence      = regexp.MustCompile("^\\s*(```|~~~)")
	codeSpan   = regexp.MustCompile("`[^`]*`")
	mdLink     = regexp.MustCompile(`\]\(([^()\s]+)\)`)
	headingRE  = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	externalRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// prose returns a markdown document's lines outside fenced code blocks.
func prose(doc string) []string {
	var out []string
	inFence := false
	for _, line := range strings.Split(doc, "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if !inFence {
			out = append(out, line)
		}
	}
	return out
}

// anchors are the ids GitHub gives a document's headings: lower case,
// punctuation dropped, spaces to hyphens, a repeated id suffixed -1, -2.
func anchors(doc string) map[string]bool {
	ids := map[string]bool{}
	seen := map[string]int{}
	for _, line := range prose(doc) {
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		id := slug(m[2])
		if n := seen[id]; n > 0 {
			ids[id+"-"+strconv.Itoa(n)] = true
		} else {
			ids[id] = true
		}
		seen[id]++
	}
	return ids
}

func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDocLinksResolve: every relative link in README.md and docs/*.md
// names a file or directory of the repository and, when it has an
// #anchor into a markdown document, one of that document's headings.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join(root, "README.md"))
	if len(docs) < 5 {
		t.Fatalf("found %d documents: not the repository", len(docs))
	}
	checked := 0
	for _, path := range docs {
		rel, _ := filepath.Rel(root, path)
		for _, line := range prose(readDoc(t, root, filepath.ToSlash(rel))) {
			for _, m := range mdLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
				if externalRE.MatchString(m[1]) {
					continue
				}
				checked++
				if problem := resolve(root, path, m[1]); problem != "" {
					t.Errorf("%s: link %s: %s", filepath.ToSlash(rel), m[1], problem)
				}
			}
		}
	}
	if checked < 30 {
		t.Fatalf("checked %d links: the link pattern no longer matches the documents", checked)
	}
}

// resolve says what is wrong with a relative link from the document at
// from, or "" when it resolves.
func resolve(root, from, link string) string {
	target, anchor, _ := strings.Cut(link, "#")
	file := from
	if target != "" {
		file = filepath.Join(filepath.Dir(from), filepath.FromSlash(target))
	}
	if r, err := filepath.Rel(root, file); err != nil || strings.HasPrefix(r, "..") {
		return "outside the repository"
	}
	info, err := os.Stat(file)
	if err != nil {
		return "no such file"
	}
	if anchor == "" || info.IsDir() || !strings.HasSuffix(file, ".md") {
		return ""
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	if !anchors(string(b))[anchor] {
		return "no heading with that anchor"
	}
	return ""
}

var (
	docCitation     = regexp.MustCompile(`docs/[a-z0-9-]+\.md`)
	sectionCitation = regexp.MustCompile(`docs/architecture\.md[^.;)]*`)
	sectionNumber   = regexp.MustCompile(`§(\d+)`)
	numbered        = regexp.MustCompile(`^## (\d+)\. `)
)

// TestCodeCitesLiveSections: a document a Go comment cites exists, and a
// "docs/architecture.md §N" it cites is a section of that document, so
// comments cannot point at a retired map or a renumbered section. Test
// files count: their comments are documentation too.
func TestCodeCitesLiveSections(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	arch := readDoc(t, root, "docs/architecture.md")
	sections := map[string]bool{}
	for _, line := range prose(arch) {
		if m := numbered.FindStringSubmatch(line); m != nil {
			sections[m[1]] = true
		}
	}
	if len(sections) < 9 {
		t.Fatalf("docs/architecture.md has %d numbered sections: the heading pattern no longer matches", len(sections))
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "var") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		checkCitations(t, root, filepath.ToSlash(rel), string(b), sections)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checkCitations reports the documents and sections a Go file cites that
// do not exist.
func checkCitations(t *testing.T, root, path, text string, sections map[string]bool) {
	t.Helper()
	for _, doc := range docCitation.FindAllString(text, -1) {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(doc))); err != nil {
			t.Errorf("%s cites %s, which does not exist", path, doc)
		}
	}
	for _, cite := range sectionCitation.FindAllString(text, -1) {
		for _, n := range sectionNumber.FindAllStringSubmatch(cite, -1) {
			if !sections[n[1]] {
				t.Errorf("%s cites docs/architecture.md §%s, which has no such section", path, n[1])
			}
		}
	}
}
