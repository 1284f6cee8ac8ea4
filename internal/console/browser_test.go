package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/devfleet"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/topics"
)

// EnvScreenshots set to 1 makes TestConsoleInChromium write a PNG of each
// page to docs/console/ (make console-screenshots).
const EnvScreenshots = "MAILPLANE_CONSOLE_SCREENSHOTS"

// EnvChromium overrides the browser (default /usr/bin/chromium, Debian's
// chromium package; scripts/deps.sh installs it).
const EnvChromium = "MAILPLANE_CHROMIUM"

const opsToken = "console-test-ops-token"

// hostile is what the poison record carries in a header: the DLQ entry
// page must show it as text.
const hostile = `<script>alert("dlq")</script><img src=x onerror=alert(2)>`

// TestConsoleInChromium runs `mailplane dev` (real projectors filling
// real Postgres projections, a simulated fleet whose spammy@example.com
// goes to quarantine), dead-letters a poison record with a value that
// may hold a secret and a hostile header, then drives headless Chromium
// through the console: the login form, the fleet, a mailbox, an org, the
// consumers, the DLQ and one dead letter, asserting what each shows. It
// also checks the query API's real answers against the OpenAPI document.
func TestConsoleInChromium(t *testing.T) {
	chromium := os.Getenv(EnvChromium)
	if chromium == "" {
		chromium = "/usr/bin/chromium"
	}
	if _, err := exec.LookPath(chromium); err != nil {
		t.Fatalf("no Chromium at %s (install Debian's chromium package: scripts/deps.sh): %v", chromium, err)
	}
	start := time.Now()
	// Chromium starts while the binary builds and dev mode comes up.
	ctx, shot := browser(t, chromium)
	launched := make(chan error, 1)
	go func() { launched <- chromedp.Do(ctx, chromedp.Navigate("about:blank")) }()
	bin := mailplanetest.Build(t)
	t.Logf("built in %s", time.Since(start).Round(time.Millisecond))
	dev := startDev(t, bin)
	base := "http://" + dev.http
	t.Logf("dev mode healthy after %s", time.Since(start).Round(time.Millisecond))

	// Spammy's warmup mail lands in Junk until the scorer blocks it and
	// placement moves it to the quarantine pool.
	var spammy map[string]any
	mailplanetest.WaitFor(t, 60*time.Second, 200*time.Millisecond, "spammy@example.com in quarantine", func() error {
		status, body := get(t, base+"/v1/mailboxes/"+devfleet.SpammyMailboxID, opsToken)
		if status != http.StatusOK {
			return fmt.Errorf("status %d: %s", status, body)
		}
		spammy = nil
		if err := json.Unmarshal(body, &spammy); err != nil {
			return err
		}
		if band := spammy["placement"].(map[string]any)["band"]; band != "quarantine" {
			return fmt.Errorf("band %v", band)
		}
		// The registry folds the health decision that moved it, with its
		// evidence and the sentence for the customer.
		if d, _ := spammy["health_decision"].(map[string]any); d == nil || d["evidence"] == nil ||
			!strings.Contains(fmt.Sprint(d["sentence"]), "landed in spam") {
			return fmt.Errorf("health decision %v", spammy["health_decision"])
		}
		return nil
	})

	t.Logf("spammy in quarantine after %s", time.Since(start).Round(time.Millisecond))
	// The sync partition the API names is where the mailbox.state
	// processor put spammy's state record.
	sync := spammy["sync"].(map[string]any)
	var statePart int32 = -1
	if _, err := kafka.ReadToEnd(t.Context(), kafka.Config{Brokers: []string{dev.broker}}, kafka.ReadSpec{Topics: []string{topics.MailboxState}, Timeout: 15 * time.Second},
		func(r *kgo.Record) error {
			if string(r.Key) == devfleet.SpammyMailboxID {
				statePart = r.Partition
			}
			return nil
		}); err != nil {
		t.Fatal(err)
	}
	if p, ok := sync["partition"].(float64); !ok || int32(p) != statePart {
		t.Errorf("the API puts spammy on mailbox.state partition %v; its state record is on %d", sync["partition"], statePart)
	}
	poison(t, dev.broker)
	var dead dlq.Entry
	mailplanetest.WaitFor(t, 30*time.Second, 200*time.Millisecond, "the poison record in the DLQ", func() error {
		es, err := dlq.List(t.Context(), kafka.Config{Brokers: []string{dev.broker}}, 100)
		if err != nil {
			return err
		}
		for _, e := range es {
			if v, _ := e.Header("x-console-test"); v == hostile && e.Consumer == "registry" {
				dead = e
				return nil
			}
		}
		return fmt.Errorf("not yet among %d", len(es))
	})
	if dead.ValueWithheld != dlq.WithheldPossibleSecret {
		t.Fatalf("the poison record's value is %q, not withheld", dead.ValueWithheld)
	}

	t.Logf("dead letter after %s", time.Since(start).Round(time.Millisecond))
	t.Run("query API answers match the OpenAPI document", func(t *testing.T) {
		checkAPIAgainstOpenAPI(t, base)
	})

	if err := <-launched; err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	var dialogs atomic.Int32
	chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
		}
	})
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	contains := func(page, sel string, wants ...string) {
		t.Helper()
		got := text(sel)
		for _, w := range wants {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %s shows %q, want it to contain %q", page, sel, got, w)
			}
		}
	}

	// Not logged in: every page sends the browser to the login form.
	do("open the fleet page", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("token")))
	shot("login")
	// A token without ops is refused; no session.
	do("log in without ops", chromedp.SendKeys(chromedp.ID("token"), "not-a-known-token"), chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("login-error")))
	contains("login", "#login-error", "not valid")
	do("log in", chromedp.SendKeys(chromedp.ID("token"), opsToken), chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("workers")))

	contains("fleet", "#workers", "0190a5b2-4c5e-7b1a-9c3d-00000000d001", "shared_premium", "live")
	contains("fleet", "#pools", "quarantine", "clean")
	shot("fleet")

	do("mailbox page", chromedp.Navigate(base+"/console/mailboxes/"+devfleet.SpammyMailboxID), chromedp.WaitVisible(chromedp.ID("history")))
	contains("mailbox", "#band", "quarantine")
	contains("mailbox", "#health", "blocked")
	contains("mailbox", "#history", "band_changed", "band_worsened", "migrated")
	contains("mailbox", "#health-sentence", "warmup messages", "landed in spam over the last 7 days")
	contains("mailbox", "#health-evidence", "rule", "spam rate")
	contains("mailbox", "#sync-owner", "dev-sync-")
	contains("mailbox", "#last-sync", "lag")
	contains("mailbox", "#sync-tier", "dev-sync-")
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#evidence rect").length`)); err != nil || n == 0 {
		t.Errorf("mailbox: the evidence chart has %d bars (%v)", n, err)
	}
	if label, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("evidence").getAttribute("aria-label")`)); err != nil || !strings.Contains(label, "junk") {
		t.Errorf("mailbox: the evidence chart says %q (%v)", label, err)
	}
	shot("mailbox")

	// The search box finds a mailbox by id.
	do("search", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("workers")),
		chromedp.SendKeys(chromedp.CSS(`input[name="id"]`), devfleet.AdaMailboxID+"\n"), chromedp.WaitVisible(chromedp.ID("history")))
	contains("search", "h1", devfleet.AdaMailboxID)

	do("org page", chromedp.Navigate(base+"/console/orgs/"+devfleet.PremiumOrgID), chromedp.WaitVisible(chromedp.ID("org-mailboxes")))
	contains("org", "#org-mailboxes", "spammy@example.com", "ada@example.com")
	contains("org", "#class", "premium")
	shot("org")

	do("consumers page", chromedp.Navigate(base+"/console/consumers"), chromedp.WaitVisible(chromedp.ID("consumers")))
	contains("consumers", "#consumers", "registry", "bulk", "placement-projection", "interactive", "health", "background")
	if s, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.ID("parts-registry"))); err != nil || !strings.Contains(s, topics.MailboxEvents+"/") {
		t.Errorf("consumers: the registry's partitions show %q (%v)", s, err)
	}
	shot("consumers")

	do("DLQ page", chromedp.Navigate(base+"/console/dlq?consumer=registry"), chromedp.WaitVisible(chromedp.ID("dlq")))
	contains("dlq", "#dlq", "withheld: possible_secret", topics.MailboxEvents, "registry")
	shot("dlq")

	do("dead letter page", chromedp.Navigate(fmt.Sprintf("%s/console/dlq/%d/%d", base, dead.Partition, dead.Offset)), chromedp.WaitVisible(chromedp.ID("headers")))
	contains("dead letter", "#value", "withheld: possible_secret")
	contains("dead letter", "#headers", "x-console-test", hostile)
	contains("dead letter", "#redrive", "cannot be redriven: re-publish the event")
	shot("dlq-entry")

	// The operator audit holds this session's login, by the dev caller.
	do("audit page", chromedp.Navigate(base+"/console/audit"), chromedp.WaitVisible(chromedp.ID("audit")))
	contains("audit", "#audit", "console_login", "caller", "mailplane/api")

	// Script injection through a mailbox id: refused, shown as text.
	do("hostile mailbox id", chromedp.Navigate(base+"/console/mailboxes/%3Cscript%3Ealert(1)%3C%2Fscript%3E"), chromedp.WaitVisible(chromedp.ID("error")))
	contains("hostile id", "#error", "lower-case UUID")
	if v, err := chromedp.Run(ctx, chromedp.Value(chromedp.CSS(`input[name="id"]`))); err != nil || v != "<script>alert(1)</script>" {
		t.Errorf("the search box holds %q (%v), want the id as text", v, err)
	}
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.scripts.length + document.querySelectorAll("img").length`)); err != nil || n != 0 {
		t.Errorf("a page holds %d script or img elements (%v)", n, err)
	}
	if n := dialogs.Load(); n != 0 {
		t.Errorf("%d JavaScript dialogs opened: injected script ran", n)
	}

	t.Logf("pages checked after %s", time.Since(start).Round(time.Millisecond))
	// Logging out ends the session: the fleet page asks for a token again.
	do("log out", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("workers")),
		chromedp.Click(chromedp.CSS(`form[action="/console/logout"] button`)), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("token")))
}

// browser starts headless Chromium; shot saves a full-page PNG of the
// current page under docs/console/ when EnvScreenshots is 1.
func browser(t *testing.T, path string) (context.Context, func(name string)) {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.WindowSize(1280, 900))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	actx, cancel := chromedp.NewExecAllocator(t.Context(), opts...)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx)
	t.Cleanup(cancel2)
	ctx, cancel3 := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(cancel3)
	save := os.Getenv(EnvScreenshots) == "1"
	dir := filepath.Join("..", "..", "docs", "console")
	return ctx, func(name string) {
		t.Helper()
		if !save {
			return
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// poison produces a record no consumer can apply, with a value that looks
// like it holds a password and a hostile header.
func poison(t *testing.T, broker string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	r := &kgo.Record{Topic: topics.MailboxEvents, Key: []byte(devfleet.AdaMailboxID),
		Value:   []byte(`{"not":"a cloudevent","password":"hunter2"}`),
		Headers: []kgo.RecordHeader{{Key: "x-console-test", Value: []byte(hostile)}}}
	if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// checkAPIAgainstOpenAPI validates real answers of the query API against
// the response schemas of the served OpenAPI document.
func checkAPIAgainstOpenAPI(t *testing.T, base string) {
	status, raw := get(t, base+"/v1/openapi.json", "")
	if status != http.StatusOK || !bytes.Equal(raw, api.OpenAPI()) {
		t.Fatalf("GET /v1/openapi.json: %d, %d bytes", status, len(raw))
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	const loc = "https://mailplane.invalid/openapi.json"
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(loc, doc); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, route string
		token       string
		status      int
	}{
		{"/v1/workers", "/v1/workers", opsToken, 200},
		{"/v1/mailboxes/" + devfleet.SpammyMailboxID, "/v1/mailboxes/{id}", opsToken, 200},
		{"/v1/mailboxes/" + devfleet.AdaMailboxID, "/v1/mailboxes/{id}", opsToken, 200},
		{"/v1/orgs/" + devfleet.PremiumOrgID, "/v1/orgs/{id}", opsToken, 200},
		{"/v1/orgs/" + devfleet.FreeOrgID, "/v1/orgs/{id}", opsToken, 200},
		{"/v1/mailboxes/0190a5b2-4c5e-7b1a-9c3d-0000000000ff", "/v1/mailboxes/{id}", opsToken, 404},
		{"/v1/orgs/not-an-id", "/v1/orgs/{id}", opsToken, 400},
		{"/v1/workers", "/v1/workers", "", 401},
	} {
		status, body := get(t, base+tc.path, tc.token)
		if status != tc.status {
			t.Errorf("GET %s: %d, want %d: %s", tc.path, status, tc.status, body)
			continue
		}
		ptr := "#/paths/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(tc.route) +
			fmt.Sprintf("/get/responses/%d/content/application~1json/schema", status)
		sch, err := c.Compile(loc + ptr)
		if err != nil {
			t.Errorf("GET %s: the document has no schema for %d: %v", tc.route, status, err)
			continue
		}
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if err := sch.Validate(v); err != nil {
			t.Errorf("GET %s (%d) does not match the document: %v\n%s", tc.path, status, err, body)
		}
	}
}

func get(t *testing.T, url, token string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	cl := &http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

type devProc struct {
	http, broker string
}

// startDev runs mailplane dev with its simulated fleet sped up: warmup
// mail every 200 ms and Junk polled every 500 ms, so the scorer sees
// spammy's Junk placements within seconds.
func startDev(t *testing.T, bin string) devProc {
	t.Helper()
	kport, pport, hport := mailplanetest.FreePort(t), mailplanetest.FreePort(t), mailplanetest.FreePort(t)
	p := devProc{http: fmt.Sprintf("127.0.0.1:%d", hport), broker: fmt.Sprintf("127.0.0.1:%d", kport)}
	// Dev mode's Postgres runs as the postgres user when we are root and
	// must reach the data dir: t.TempDir() is private to root.
	dataDir, err := os.MkdirTemp("/tmp", "mailplane-console-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dataDir) })
	out := &mailplanetest.Output{}
	cmd := exec.Command(bin, "dev", "--data-dir", dataDir, "--kafka-port", fmt.Sprint(kport), "--pg-port", fmt.Sprint(pport),
		"--http", p.http, "--state-partitions", "8", "--dev-imap-addr", "127.0.0.1:0", "--ops-http", "127.0.0.1:0",
		"--dev-warmup-interval", "200ms", "--poll-warm", "500ms")
	cmd.Env = append(os.Environ(), "MAILPLANE_API_TOKEN="+opsToken, "MAILPLANE_DATABASE_URL=", "DATABASE_URL=")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("mailplane dev output:\n%s", out)
		}
	})
	mailplanetest.WaitFor(t, 90*time.Second, 200*time.Millisecond, "dev mode healthy", func() error {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("mailplane dev exited: %v\n%s", err, out)
		default:
		}
		status, body := get(t, "http://"+p.http+"/healthz", "")
		if status != http.StatusOK {
			return fmt.Errorf("healthz %d: %s", status, body)
		}
		return nil
	})
	return p
}
