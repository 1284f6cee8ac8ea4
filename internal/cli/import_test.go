package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/importer"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

const (
	importToken = "tok-import-5b0e2c9d7a31f4e8c6b2a0d9e7f1c3b5"
	// importSecret must never appear in a record, the output or a log.
	importSecret = "Imp0rt-S3cret-hunter2-PLUGH"
)

// importAPI is a real ingest API (as the api role wires it: sealing, the
// domain's validation, no schema validator) on loopback, backed by an
// in-process broker.
type importAPI struct {
	base    string
	brokers []string
	ns      topics.Namespace // the test's
	logs    *mailplanetest.Output
}

func startImportAPI(t testing.TB, opts ...api.Option) *importAPI {
	t.Helper()
	kcfg := kafkatest.Config(t, 4)
	kcfg.ClientID = "import-test"
	brokers := kcfg.Brokers
	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	key := make([]byte, sealing.KeySize)
	_, _ = rand.Read(key)
	k, err := sealing.NewKeyring("k1", map[string][]byte{"k1": key})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := access.FromBytes([]byte(access.Line("crm", importToken, []string{domain.ScopePublishPublic}, "/crm") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	logs := &mailplanetest.Output{}
	reg := prometheus.NewRegistry()
	srv, err := api.New(producer.New(kc, producer.WithSealer(k), producer.WithRegisterer(reg), producer.WithNamespace(kcfg.Namespace)),
		append([]api.Option{api.WithAuthenticator(auth), api.WithSealer(k), api.WithRegisterer(reg),
			api.WithLogger(slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))),
			api.WithDatabaseCheck(func(context.Context) error { return nil }), api.WithBrokerCheck(kc)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		if strings.Contains(logs.String(), importSecret) {
			t.Errorf("the plaintext password appears in the server log")
		}
	})
	return &importAPI{base: "http://" + ln.Addr().String(), brokers: brokers, ns: kcfg.Namespace, logs: logs}
}

// loggedIDs reads every mailbox event on the log: event id to how many
// records carry it; and fails if a record holds the plaintext secret.
func (a *importAPI) loggedIDs(t *testing.T) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kc, err := kgo.NewClient(kgo.SeedBrokers(a.brokers...), kgo.ConsumeTopics(a.ns.Topic(topics.MailboxEvents)),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	ends, err := kadm.NewClient(kc).ListEndOffsets(ctx, a.ns.Topic(topics.MailboxEvents))
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	ends.Each(func(o kadm.ListedOffset) { want += o.Offset })
	ids := map[string]int{}
	for got := int64(0); got < want; {
		fs := kc.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("reading the log: %v (%d of %d records)", err, got, want)
		}
		fs.EachRecord(func(r *kgo.Record) {
			got++
			if bytes.Contains(r.Value, []byte(importSecret)) {
				t.Errorf("a record holds the plaintext password")
			}
			id, _ := topics.Header(r, topics.HeaderID)
			ids[id]++
		})
	}
	return ids
}

// runImport runs the command as cmd/mailplane does, its output in files.
func runImport(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	dir := t.TempDir()
	out, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	errf, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	runErr := Import(context.Background(), args, strings.NewReader(""), out, errf)
	out.Close()
	errf.Close()
	o, _ := os.ReadFile(out.Name())
	e, _ := os.ReadFile(errf.Name())
	if runErr != nil {
		e = append(e, []byte(runErr.Error())...)
	}
	if bytes.Contains(o, []byte(importSecret)) || bytes.Contains(e, []byte(importSecret)) {
		t.Errorf("the output shows the plaintext password:\n%s\n%s", o, e)
	}
	return ExitCode(runErr), string(o), string(e)
}

func uuid7(n int) string { return fmt.Sprintf("0190a5b2-0000-7000-8000-%012x", n) }

// plainRow is a valid plain mailbox object (JSON lines).
func plainRow(n int) map[string]any {
	return map[string]any{
		"mailbox_id": uuid7(n), "org_id": uuid7(1_000_000), "user_id": uuid7(2_000_000 + n),
		"address": fmt.Sprintf("box%d@example.com", n), "provider": "smtp_imap", "warmup_enabled": true,
		"imap":        map[string]any{"host": "imap.example.com", "port": 993, "tls": "implicit", "username": fmt.Sprintf("box%d", n)},
		"credentials": map[string]any{"password": importSecret},
	}
}

func jsonLine(t *testing.T, v any) string {
	t.Helper()
	return jsonLineTB(t, v)
}

func jsonLineTB(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// wantRow is what the import must make of one line: accepted, or refused
// with code at field.
type wantRow struct {
	line  int
	code  domain.Code
	field string
}

func checkSummary(t *testing.T, s importer.Summary, rows, accepted int, refusals []wantRow) {
	t.Helper()
	if s.Rows != rows || s.Accepted != accepted || s.Refused != len(refusals) || s.Failed != 0 {
		t.Errorf("rows %d accepted %d refused %d failed %d, want %d %d %d 0\n%+v", s.Rows, s.Accepted, s.Refused, s.Failed, rows, accepted, len(refusals), s)
	}
	for _, w := range refusals {
		if !slices.ContainsFunc(s.Problems, func(p importer.Problem) bool {
			return p.Line == w.line && p.Code == w.code && p.Field == w.field
		}) {
			t.Errorf("line %d: want %s at %q; problems %+v", w.line, w.code, w.field, s.Problems)
		}
		if s.RefusedByCode[w.code] == 0 {
			t.Errorf("refused_by_code lacks %s: %v", w.code, s.RefusedByCode)
		}
	}
}

// TestImportEndToEnd imports a JSON lines file and a CSV file full of
// hostile rows into a real API: what is valid lands (its credentials
// sealed), what is not is refused with its code and line, nothing is
// printed of the credentials, and a re-run sends the very same event ids.
func TestImportEndToEnd(t *testing.T) {
	t.Parallel()
	a := startImportAPI(t)
	dir := t.TempDir()

	ce := map[string]any{"specversion": "1.0", "id": "crm-evt-0001", "type": "mailbox.added", "source": "/crm",
		"data": plainRow(2)}
	ce["type"] = domain.TypeMailboxAdded
	ctrl := plainRow(3)
	ctrl["address"] = "box3\u0007@example.com"
	unknown := plainRow(4)
	unknown["pin"] = "1234"
	noCreds := plainRow(7)
	delete(noCreds, "credentials")
	lines := []string{
		jsonLine(t, plainRow(1)), // 1 accepted
		jsonLine(t, ce),          // 2 accepted (a CloudEvent, its own id)
		jsonLine(t, ctrl),        // 3 forbidden_character
		jsonLine(t, unknown),     // 4 unknown_field
		`{"mailbox_id":"` + strings.Repeat("x", importer.MaxRowBytes) + `"}`, // 5 too_large
		jsonLine(t, ce),       // 6 conflict: line 2's id
		jsonLine(t, noCreds),  // 7 credentials_required
		`{"mailbox_id": nope`, // 8 malformed_json
		``,                    // 9 blank: skipped
		strings.Replace(jsonLine(t, plainRow(10)), `"address"`, `"mailbox_id":"`+uuid7(99)+`","address"`, 1), // 10 repeated member: malformed_json
		jsonLine(t, plainRow(11)), // 11 accepted
	}
	jsonl := filepath.Join(dir, "fleet.jsonl")
	if err := os.WriteFile(jsonl, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	jsonlRefused := []wantRow{
		{3, domain.CodeForbiddenCharacter, "data.address"},
		{4, domain.CodeUnknownField, "data.pin"},
		{5, domain.CodeTooLarge, ""},
		{6, domain.CodeConflict, "id"},
		{7, domain.CodeCredentialsRequired, "data.credentials"},
		{8, domain.CodeMalformedJSON, ""},
		{10, domain.CodeMalformedJSON, "data.mailbox_id"},
	}

	csvRows := []string{
		"mailbox_id,org_id,user_id,address,provider,warmup_enabled,imap_host,imap_port,imap_tls,imap_username,password",
		csvRow(21, "box21@example.com", "993", importSecret),                              // 2 accepted
		csvRow(22, "box22\x01@example.com", "993", importSecret),                          // 3 forbidden_character
		csvRow(23, "box23@example.com", "993", importSecret) + ",extra",                   // 4 more fields than the header
		csvRow(24, "box24@example.com", "993", ""),                                        // 5 credentials_required
		csvRow(25, "box25@example.com", "nine", importSecret),                             // 6 invalid_type
		csvRow(26, "box26@example.com", "993", strings.Repeat("p", importer.MaxRowBytes)), // 7 too_large
		csvRow(21, "box21@example.com", "993", importSecret),                              // 8 conflict: row 2 again
		csvRow(29, "box29@example.com", "993", importSecret),                              // 9 accepted
	}
	csvFile := filepath.Join(dir, "fleet.csv")
	if err := os.WriteFile(csvFile, []byte(strings.Join(csvRows, "\r\n")+"\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	csvRefused := []wantRow{
		{3, domain.CodeForbiddenCharacter, "data.address"},
		{4, domain.CodeInvalid, ""},
		{5, domain.CodeCredentialsRequired, "data.credentials"},
		{6, domain.CodeInvalidType, "data.imap.port"},
		{7, domain.CodeTooLarge, ""},
		{8, domain.CodeConflict, "id"},
	}

	args := func(file string) []string {
		// Small batches, so refusals and acceptances share requests.
		return []string{file, "--api", a.base, "--api-token", importToken, "--source", "/crm/import", "--batch", "3", "--concurrency", "2", "--format", "json"}
	}
	run := func() (importer.Summary, importer.Summary) {
		var sums [2]importer.Summary
		for i, file := range []string{jsonl, csvFile} {
			code, out, errOut := runImport(t, args(file)...)
			if code != ExitPartial {
				t.Fatalf("%s: exit %d, want %d (rows refused)\n%s\n%s", file, code, ExitPartial, out, errOut)
			}
			if err := json.Unmarshal([]byte(out), &sums[i]); err != nil {
				t.Fatalf("%s: %v\n%s", file, err, out)
			}
		}
		return sums[0], sums[1]
	}
	js, cs := run()
	checkSummary(t, js, 10, 3, jsonlRefused)
	checkSummary(t, cs, 8, 2, csvRefused)
	first := a.loggedIDs(t)
	if len(first) != 5 {
		t.Fatalf("the log holds %d event ids, want the 5 accepted rows': %v", len(first), first)
	}
	if first["crm-evt-0001"] != 1 {
		t.Errorf("the CloudEvent's own id is not on the log: %v", first)
	}

	// Again: the same summary, and the same 5 ids, each now twice (the
	// fleet's projections apply an id once).
	js2, cs2 := run()
	checkSummary(t, js2, 10, 3, jsonlRefused)
	checkSummary(t, cs2, 8, 2, csvRefused)
	second := a.loggedIDs(t)
	if len(second) != len(first) {
		t.Fatalf("a re-run sent new ids: %v, first run %v", second, first)
	}
	for id := range first {
		if second[id] != 2 {
			t.Errorf("id %s: %d records after two runs, want 2", id, second[id])
		}
	}

	// The text summary: counts by code and the lines, no secrets.
	code, out, _ := runImport(t, jsonl, "--api", a.base, "--api-token", importToken, "--source", "/crm/import")
	if code != ExitPartial || !strings.Contains(out, "imported 3 of 10 rows: 7 refused, 0 not delivered") ||
		!strings.Contains(out, "unknown_field") || !strings.Contains(out, "lines 6") {
		t.Errorf("exit %d, text summary:\n%s", code, out)
	}
}

func csvRow(n int, address, port, password string) string {
	return strings.Join([]string{uuid7(n), uuid7(1_000_000), uuid7(2_000_000 + n), address, "smtp_imap", "true",
		"imap.example.com", port, "implicit", fmt.Sprintf("box%d", n), password}, ",")
}

// TestImportRetriesWithSameIDs: a batch answered 503 (or cut off in
// transport) is sent again with the same event ids, and lands once.
func TestImportRetriesWithSameIDs(t *testing.T) {
	t.Parallel()
	a := startImportAPI(t)
	target, _ := url.Parse(a.base)
	var calls atomic.Int32
	var failAll atomic.Bool
	var mu sync.Mutex
	var bodies [][]byte
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		_, _ = body.ReadFrom(r.Body)
		mu.Lock()
		bodies = append(bodies, body.Bytes())
		mu.Unlock()
		if failAll.Load() {
			api.WriteError(w, http.StatusServiceUnavailable, domain.CodeUnavailable, "not now")
			return
		}
		switch calls.Add(1) {
		case 1:
			w.Header().Set("Retry-After", "1")
			api.WriteError(w, http.StatusServiceUnavailable, domain.CodeUnavailable, "not now")
			return
		case 2:
			// Cut off: the client sees a transport error.
			hj, _ := w.(http.Hijacker)
			c, _, _ := hj.Hijack()
			c.Close()
			return
		}
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, target.String()+r.URL.Path, bytes.NewReader(body.Bytes()))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = bytes.NewBuffer(nil).ReadFrom(resp.Body)
	}))
	defer front.Close()

	lines := jsonLine(t, plainRow(1)) + "\n" + jsonLine(t, plainRow(2)) + "\n"
	s, err := importer.Run(context.Background(), strings.NewReader(lines), importer.Config{
		API: front.URL, Token: importToken, Source: "/crm/import", Format: importer.JSONL, Backoff: 10 * time.Millisecond,
		Concurrency: 1,
	})
	if err != nil || s.Accepted != 2 || s.Failed != 0 {
		t.Fatalf("%v %+v", err, s)
	}
	mu.Lock()
	n, same := len(bodies), len(bodies) == 3 && bytes.Equal(bodies[0], bodies[2]) && bytes.Equal(bodies[1], bodies[2])
	mu.Unlock()
	if !same {
		t.Fatalf("%d requests; the retries were not the same events", n)
	}
	ids := a.loggedIDs(t)
	if len(ids) != 2 {
		t.Fatalf("the log: %v", ids)
	}

	// No retries left: the rows are reported as not delivered, exit 1.
	failAll.Store(true)
	code, out, _ := runImport(t, writeTemp(t, lines), "--api", front.URL, "--api-token", importToken, "--source", "/crm/import", "--retries", "0")
	if code != ExitError || !strings.Contains(out, "not delivered:") || !strings.Contains(out, "line 1") {
		t.Errorf("exit %d:\n%s", code, out)
	}
}

func writeTemp(t *testing.T, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestImportRefusesPlainHTTPElsewhere: the input holds passwords, so plain
// http is for this host only, unless asked for.
func TestImportRefusesPlainHTTPElsewhere(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url   string
		plain bool
		ok    bool
	}{
		{"http://127.0.0.1:8080", false, true}, {"http://localhost:8080", false, true}, {"http://[::1]:8080", false, true},
		{"https://api.example.com", false, true}, {"http://api.example.com", false, false}, {"http://10.0.0.7:8080", false, false},
		{"http://api.example.com", true, true}, {"ftp://api.example.com", true, false}, {"api.example.com", false, false},
	} {
		err := checkImportURL(tc.url, tc.plain)
		if (err == nil) != tc.ok || (err != nil && ExitCode(err) != ExitUsage) {
			t.Errorf("%s (insecure-http %v): %v", tc.url, tc.plain, err)
		}
	}
	code, _, errOut := runImport(t, writeTemp(t, "{}\n"), "--api", "http://api.example.com", "--api-token", importToken)
	if code != ExitUsage || !strings.Contains(errOut, "in clear") {
		t.Errorf("exit %d: %s", code, errOut)
	}
}
