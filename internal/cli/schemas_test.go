package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/cli"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/internal/srtest"
)

// The registry in these tests is srtest's in-process stand-in for the
// Confluent REST API Redpanda's Schema Registry serves: NOT Redpanda
// (none can run here). They prove what `schemas register` asks of a
// registry and how it reads the answers; whether Redpanda accepts the
// schemas is checked only where compose runs.

type registerReport struct {
	Registry string                     `json:"registry"`
	DryRun   bool                       `json:"dry_run"`
	Schemas  []eventschema.Registration `json:"schemas"`
}

func runSchemas(t *testing.T, args ...string) (registerReport, string, int) {
	t.Helper()
	var out, stderr bytes.Buffer
	err := cli.Schemas(context.Background(), args, &out, &stderr)
	var rep registerReport
	if slices.Contains(args, "json") && out.Len() > 0 {
		if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
			t.Fatalf("--format json printed what is not JSON: %v\n%s", jerr, out.String())
		}
	}
	return rep, out.String(), cli.ExitCode(err)
}

func byType(rep registerReport) map[string]eventschema.Registration {
	m := map[string]eventschema.Registration{}
	for _, r := range rep.Schemas {
		m[r.Type] = r
	}
	return m
}

func readerCompact(t *testing.T, typ string) string {
	t.Helper()
	strict, ok := eventschema.SchemaOf(typ)
	if !ok {
		t.Fatalf("no schema for %s", typ)
	}
	reader, err := eventschema.ReaderSchema(strict)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, reader); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// TestSchemasRegister: every record type's reader schema lands under the
// subject named by its type, as JSON Schema, with FORWARD set on the
// subject; running it again changes nothing and registers nothing.
func TestSchemasRegister(t *testing.T) {
	t.Parallel()
	reg := srtest.Start(t)
	rep, out, code := runSchemas(t, "register", "--registry", reg.URL, "--format", "json")
	if code != cli.ExitOK {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	types := eventschema.SchemaTypes()
	if len(rep.Schemas) != len(types) || len(types) < 30 {
		t.Fatalf("%d registrations for %d types", len(rep.Schemas), len(types))
	}
	first := byType(rep)
	ids := map[int]bool{}
	for _, typ := range types {
		r := first[typ]
		if r.Subject != typ || r.Status != eventschema.StatusRegistered || r.ID == 0 || r.Version != 1 {
			t.Errorf("%s: %+v", typ, r)
		}
		ids[r.ID] = true
		if got := reg.Versions(typ); len(got) != 1 || got[0] != readerCompact(t, typ) {
			t.Errorf("%s: the registry holds %d versions, not the reader schema", typ, len(got))
		}
	}
	if len(ids) != len(types) {
		t.Errorf("%d distinct ids for %d different schemas", len(ids), len(types))
	}
	cl, err := sr.NewClient(sr.URLs(reg.URL))
	if err != nil {
		t.Fatal(err)
	}
	subjects, err := cl.Subjects(context.Background())
	if err != nil || !slices.Equal(subjects, types) {
		t.Fatalf("GET /subjects = %v (%v), want the types", subjects, err)
	}
	for _, c := range cl.Compatibility(context.Background(), types...) {
		if c.Err != nil || c.Level != sr.CompatForward {
			t.Errorf("%s: compatibility %v (%v)", c.Subject, c.Level, c.Err)
		}
	}
	// The $id an analyst sees in the registry is the record's
	// dataschema, in its reader form.
	var doc struct {
		ID string `json:"$id"`
	}
	_ = json.Unmarshal([]byte(reg.Versions(domain.TypeUserActive)[0]), &doc)
	if doc.ID != domain.SchemaURI(domain.TypeUserActive)+":reader" {
		t.Errorf("registered $id %q", doc.ID)
	}

	before := len(reg.Requests())
	rep, out, code = runSchemas(t, "register", "--registry", reg.URL, "--format", "json")
	if code != cli.ExitOK {
		t.Fatalf("second run: exit %d:\n%s", code, out)
	}
	for _, r := range rep.Schemas {
		if r.Status != eventschema.StatusUnchanged || r.ID != first[r.Type].ID || r.Version != 1 {
			t.Errorf("second run: %+v", r)
		}
	}
	for _, req := range reg.Requests()[before:] {
		if strings.HasSuffix(req, "/versions") {
			t.Errorf("second run registered: %s", req)
		}
	}
	for _, typ := range types {
		if n := len(reg.Versions(typ)); n != 1 {
			t.Errorf("%s: %d versions after two runs", typ, n)
		}
	}
	// The text form names every subject once.
	_, out, code = runSchemas(t, "register", "--registry", reg.URL)
	if code != cli.ExitOK || strings.Count(out, "unchanged") != len(types) {
		t.Errorf("text form (exit %d):\n%s", code, out)
	}
}

// TestSchemasRegisterDryRunWritesNothing: a dry run reports what it would
// register and sends nothing that changes the registry.
func TestSchemasRegisterDryRunWritesNothing(t *testing.T) {
	t.Parallel()
	reg := srtest.Start(t)
	rep, out, code := runSchemas(t, "register", "--registry", reg.URL, "--dry-run", "--format", "json")
	if code != cli.ExitOK || !rep.DryRun {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, r := range rep.Schemas {
		if r.Status != eventschema.StatusWouldRegister {
			t.Errorf("%+v", r)
		}
	}
	for _, req := range reg.Requests() {
		if strings.HasPrefix(req, "PUT ") || strings.HasSuffix(req, "/versions") {
			t.Errorf("a dry run sent %s", req)
		}
	}
	if len(reg.Versions(domain.TypeUserActive)) != 0 {
		t.Error("a dry run registered a schema")
	}
}

// TestSchemasRegisterRefusesIncompatible: a subject whose registered
// version would refuse records the new one accepts (here: an older
// version typing a property the new one leaves open, so a reader holding
// it refuses records the new one lets through: not FORWARD) gets the
// registry's 409: code conflict, exit 5; the other types are registered
// all the same, and a dry run, under the subject's level as a previous
// run left it, finds the same.
func TestSchemasRegisterRefusesIncompatible(t *testing.T) {
	t.Parallel()
	reg := srtest.Start(t)
	var doc map[string]any
	if err := json.Unmarshal([]byte(readerCompact(t, domain.TypeUserActive)), &doc); err != nil {
		t.Fatal(err)
	}
	doc["properties"].(map[string]any)["legacy"] = map[string]any{"type": "integer"}
	older, _ := json.Marshal(doc)
	if status, body := reg.Register(domain.TypeUserActive, string(older)); status != http.StatusOK {
		t.Fatalf("preloading the older schema: %d %s", status, body)
	}
	cl, err := sr.NewClient(sr.URLs(reg.URL))
	if err != nil {
		t.Fatal(err)
	}
	if res := cl.SetCompatibility(context.Background(), sr.SetCompatibility{Level: eventschema.RegistryCompatibility}, domain.TypeUserActive); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}

	for _, dry := range []bool{true, false} {
		args := []string{"register", "--registry", reg.URL, "--format", "json"}
		if dry {
			args = append(args, "--dry-run")
		}
		rep, out, code := runSchemas(t, args...)
		if code != cli.ExitIncompatible {
			t.Fatalf("dry run %v: exit %d, want %d:\n%s", dry, code, cli.ExitIncompatible, out)
		}
		for typ, r := range byType(rep) {
			if typ == domain.TypeUserActive {
				if r.Status != eventschema.StatusFailed || r.Code != domain.CodeConflict || !strings.Contains(r.Message, "legacy") {
					t.Errorf("dry run %v: %+v", dry, r)
				}
			} else if r.Status == eventschema.StatusFailed {
				t.Errorf("dry run %v: %+v", dry, r)
			}
		}
	}
	if n := len(reg.Versions(domain.TypeUserActive)); n != 1 {
		t.Errorf("the incompatible schema was added: %d versions", n)
	}
	if n := len(reg.Versions(domain.TypeMailboxAdded)); n != 1 {
		t.Errorf("the other types were not registered: %d versions", n)
	}
}

// TestSchemasRegisterFailures: a registry failing, gone, or answering
// without end, and a --registry that is not a registry URL, each end with
// a stable code and exit code.
func TestSchemasRegisterFailures(t *testing.T) {
	t.Parallel()
	t.Run("registry failing", func(t *testing.T) {
		t.Parallel()
		reg := srtest.Start(t)
		reg.Fail(http.StatusInternalServerError)
		rep, out, code := runSchemas(t, "register", "--registry", reg.URL, "--format", "json", "--wait", "0")
		if code != cli.ExitError || len(rep.Schemas) == 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		for _, r := range rep.Schemas {
			if r.Status != eventschema.StatusFailed || r.Code != domain.CodeUnavailable {
				t.Errorf("%+v", r)
			}
		}
	})
	t.Run("registry starting", func(t *testing.T) {
		t.Parallel()
		// Failing until its first requests came in, as a registry that
		// is starting: the command retries and registers everything.
		reg := srtest.Start(t)
		reg.Fail(http.StatusServiceUnavailable)
		go func() {
			for len(reg.Requests()) < 3 {
				time.Sleep(time.Millisecond) // polling a condition
			}
			reg.Fail(0)
		}()
		rep, out, code := runSchemas(t, "register", "--registry", reg.URL, "--format", "json", "--wait", "30s")
		if code != cli.ExitOK {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		// Those registered before the registry recovered within the
		// first round are unchanged in the retry.
		for _, r := range rep.Schemas {
			if (r.Status != eventschema.StatusRegistered && r.Status != eventschema.StatusUnchanged) || len(reg.Versions(r.Subject)) != 1 {
				t.Errorf("%+v", r)
			}
		}
		if len(rep.Schemas) != len(eventschema.SchemaTypes()) {
			t.Errorf("%d registrations", len(rep.Schemas))
		}
	})
	t.Run("registry gone", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL
		srv.Close()
		rep, out, code := runSchemas(t, "register", "--registry", url, "--format", "json", "--wait", "0")
		if code != cli.ExitError || len(rep.Schemas) == 0 || rep.Schemas[0].Code != domain.CodeUnavailable {
			t.Fatalf("exit %d:\n%s", code, out)
		}
	})
	t.Run("endless or hostile answers", func(t *testing.T) {
		t.Parallel()
		// Control characters in its message, and a body past the
		// bound: neither reaches the terminal as is.
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut {
				w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
				w.WriteHeader(http.StatusForbidden)
				_, _ = w.Write([]byte(`{"error_code":40301,"message":"denied\u001b[2J\r\nfake prompt$ "}`))
				return
			}
			w.WriteHeader(http.StatusOK)
			chunk := bytes.Repeat([]byte(" "), 1<<20)
			for range 6 {
				_, _ = w.Write(chunk)
			}
		}))
		t.Cleanup(srv.Close)
		_, out, code := runSchemas(t, "register", "--registry", srv.URL)
		if code != cli.ExitError {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		if strings.ContainsAny(out, "\x1b\r") || !strings.Contains(out, "unauthorized") {
			t.Errorf("printed:\n%q", out)
		}
		rep, out, code := runSchemas(t, "register", "--registry", srv.URL, "--dry-run", "--format", "json")
		if code != cli.ExitError || len(rep.Schemas) == 0 || rep.Schemas[0].Code != domain.CodeTooLarge || !strings.Contains(out, "larger than") {
			t.Errorf("endless answer: exit %d:\n%s", code, out)
		}
	})
	for _, bad := range []string{"ftp://registry:8081", "http://user:pw@registry:8081", "registry:8081", "http://registry:8081/?x=1", "http://registry\x1b:8081"} {
		if _, _, code := runSchemas(t, "register", "--registry", bad); code != cli.ExitUsage {
			t.Errorf("--registry %q: exit %d, want %d", bad, code, cli.ExitUsage)
		}
	}
	for _, args := range [][]string{nil, {"list"}, {"register", "--format", "yaml"}, {"register", "--nope"}} {
		if _, _, code := runSchemas(t, args...); code != cli.ExitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, cli.ExitUsage)
		}
	}
}
