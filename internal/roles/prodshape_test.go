package roles

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/dovecottest"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/pgcluster"
	"github.com/mailplane/mailplane/internal/srtest"
	"github.com/mailplane/mailplane/internal/workerapi"
	"github.com/mailplane/mailplane/topics"
)

// prodShape is the production shape of TestProductionShape: every
// mailplane service of docker-compose.yml as its own processes, against
// a broker, a private Postgres the test stops and starts, and Dovecot.
type prodShape struct {
	t       *testing.T
	f       *fleet
	jobs    map[string]bool
	dc      *dovecottest.Server
	pg      *pgcluster.Cluster
	db      *pgxpool.Pool // the test's own reads of the projections
	brokers []string
	// ns is the namespace every service runs in (MAILPLANE_KAFKA_NAMESPACE):
	// the production shape works in one as it does without.
	ns topics.Namespace
	// broker is the in-process broker (nil against a real one), persisted
	// under brokerDir so that it can be restarted on the same port.
	broker    *kafka.Embedded
	brokerDir string
	adm       *kadm.Client
	apiURL    string
	token     string // an API caller: publish, ops, workers:read
	fleet     []byte // the worker fleet secret
	warmup    []byte // the warmup signing key
	workers   []string
	next      atomic.Int64 // mailboxes added so far
	// hbRefused counts the heartbeats of heartbeat's loop that were not
	// answered 2xx (postgresOutage resets it when Postgres stops).
	hbRefused atomic.Int64
	// hbSilenced holds the worker ids heartbeat's loop no longer
	// heartbeats for (workerKilled's victim).
	hbSilenced sync.Map
}

// roleSession is the group session the roles run on: compose sets none,
// so every role has the shared default. Failover is asserted within it
// plus failoverSlack.
var roleSession = func() time.Duration {
	d, err := time.ParseDuration(config.GroupSession.Default)
	if err != nil {
		panic(err)
	}
	return d
}()

const failoverSlack = 4 * time.Second

// startProdShape starts everything: Dovecot, Postgres, the broker, the
// compose services (jobs first), and waits until every role's ops
// listener says healthy.
func startProdShape(t *testing.T) *prodShape {
	e := &prodShape{t: t, jobs: map[string]bool{}}
	bin := mailplanetest.Build(t)
	e.dc = dovecottest.Start(t)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, e.dc.Cert.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	e.pg = startPrivatePostgres(t)
	vars := e.secrets(t, bin)
	services := loadCompose(t, composeFile(t), vars)
	parts := int32(0)
	for _, s := range services {
		if n, err := strconv.Atoi(s.env["MAILPLANE_STATE_PARTITIONS"]); err == nil && s.job {
			parts = int32(n)
		}
	}
	if kafkatest.Real() {
		kcfg := kafkatest.Config(t, parts) // the topics job then finds no drift
		e.brokers, e.ns = kcfg.Brokers, kcfg.Namespace
	} else {
		e.brokerDir = t.TempDir()
		e.startBroker(t, freeAddr(t))
		e.brokers, e.ns = e.broker.Addrs(), kafkatest.Namespace(t)
	}
	adm, err := kafka.NewAdmin(kafka.Config{Brokers: e.brokers, ClientID: "prodshape-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(adm.Close)
	e.adm = adm
	pool, err := pgxpool.New(context.Background(), e.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e.db = pool

	e.f = newFleet(t)
	// The schemas job's registry: srtest's stand-in, not Redpanda's.
	registry := srtest.Start(t)
	for _, s := range services {
		for i := range s.replicas {
			host := map[string]string{"MAILPLANE_BROKERS": strings.Join(e.brokers, ","), "MAILPLANE_KAFKA_NAMESPACE": string(e.ns), "MAILPLANE_DATABASE_URL": e.pg.URL(),
				"MAILPLANE_SCHEMA_REGISTRY_URL": registry.URL}
			if !s.job {
				// The test's Dovecot: its CA, and loopback allowlisted
				// (the API checks the mailbox's endpoint at ingest too).
				host["MAILPLANE_IMAP_CA_FILE"], host["MAILPLANE_IMAP_ALLOW"] = caFile, "127.0.0.0/8"
			}
			p := newRoleProc(t, bin, s, i, host)
			if s.job {
				e.jobs[p.name] = true
				e.f.runJob(t, p, 60*time.Second)
				continue
			}
			e.f.procs = append(e.f.procs, p)
			p.start(t)
		}
	}
	if got := registry.Versions(domain.TypeUserActive); len(got) != 1 {
		t.Fatalf("the schemas job left %d versions of %s in the registry", len(got), domain.TypeUserActive)
	}
	apis := e.f.service("api")
	if len(apis) == 0 || apis[0].addrs["--http"] == "" {
		t.Fatal("compose runs no api service with --http")
	}
	e.apiURL = "http://" + apis[0].addrs["--http"]
	e.waitHealthy()
	return e
}

// secrets makes the secrets compose refuses to start without, and an API
// caller with `mailplane token`; it returns compose's variables.
func (e *prodShape) secrets(t *testing.T, bin string) map[string]string {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	e.fleet = []byte(base64.RawURLEncoding.EncodeToString(key))
	e.warmup = []byte("prodshape-warmup-key")
	out, err := exec.Command(bin, "token", "--name", "prodshape", "--source", "/prodshape",
		"--scopes", "publish:public,publish:org.plan_changed,ops,workers:read").Output()
	if err != nil {
		t.Fatalf("mailplane token: %v", err)
	}
	lines := strings.Split(string(out), "\n")
	if len(lines) < 5 {
		t.Fatalf("mailplane token printed:\n%s", out)
	}
	e.token = strings.TrimSpace(lines[1])
	tokens := filepath.Join(t.TempDir(), "api-tokens")
	if err := os.WriteFile(tokens, []byte(strings.TrimSpace(lines[4])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _ = rand.Read(key)
	return map[string]string{
		"POSTGRES_PASSWORD":             "unused-on-one-host",
		"MAILPLANE_SEAL_KEYS":           "ps1:" + base64.StdEncoding.EncodeToString(key),
		"MAILPLANE_API_TOKENS_FILE":     tokens,
		"MAILPLANE_WORKER_FLEET_SECRET": string(e.fleet),
		"MAILPLANE_WARMUP_KEY":          string(e.warmup),
	}
}

// startPrivatePostgres starts a Postgres cluster of the test's own (the
// shared pgtest one must not be stopped), failing if the binaries are
// missing.
func startPrivatePostgres(t *testing.T) *pgcluster.Cluster {
	t.Helper()
	// Not t.TempDir(): root's 0700 directory is closed to the postgres
	// user the server runs as.
	dir, err := os.MkdirTemp("", "mailplane-prodshape-pg-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(freeAddr(t))
	n, _ := strconv.Atoi(port)
	c := pgcluster.New(dir, pgcluster.WithPort(n), pgcluster.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
		os.RemoveAll(dir)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatalf("private Postgres (needs the PostgreSQL server binaries; make deps): %v", err)
	}
	return c
}

// waitHealthy waits until every role's detailed /healthz answers 200.
func (e *prodShape) waitHealthy() {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for _, p := range e.f.procs {
		if e.jobs[p.name] {
			continue
		}
		waitUntil(ctx, e.t, p.name+" healthy", func(ctx context.Context) bool {
			e.f.alive(e.t, e.jobs)
			code, _ := e.call(ctx, http.MethodGet, "http://"+p.addrs["--ops-http"]+"/healthz", "", "", nil, nil)
			return code == http.StatusOK
		})
	}
}

// call makes one HTTP request (5 s deadline) and decodes a JSON answer
// into out when given; it returns the status (0 when unanswered) and
// the body.
func (e *prodShape) call(ctx context.Context, method, url, token, ctype string, body []byte, out any) (int, []byte) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if out != nil {
		_ = json.Unmarshal(b, out) // a caller checks the status first
	}
	return resp.StatusCode, b
}

// publish posts events to the API as a producer would (a structured
// batch); it returns the status and body.
func (e *prodShape) publish(ctx context.Context, ds ...domain.Data) (int, []byte) {
	var batch [][]byte
	for _, d := range ds {
		b, err := domain.MarshalStructured(domain.Event{ID: domain.NewEventID(), Type: d.EventType(), Source: "/prodshape",
			Time: time.Now().UTC(), Subject: d.AggregateID(), Data: d})
		if err != nil {
			e.t.Fatal(err)
		}
		batch = append(batch, b)
	}
	body := append(append([]byte("["), bytes.Join(batch, []byte(","))...), ']')
	return e.call(ctx, http.MethodPost, e.apiURL+"/v1/events", e.token, api.ContentTypeBatch, body, nil)
}

func (e *prodShape) mustPublish(ctx context.Context, ds ...domain.Data) {
	e.t.Helper()
	if code, body := e.publish(ctx, ds...); code != http.StatusAccepted {
		e.t.Fatalf("POST /v1/events: %d %s", code, body)
	}
}

// retryPublish publishes until the API accepts, as a producer retries a
// 503.
func (e *prodShape) retryPublish(ctx context.Context, ds ...domain.Data) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	waitUntil(ctx, e.t, "the API accepts the events again", func(ctx context.Context) bool {
		code, _ := e.publish(ctx, ds...)
		return code == http.StatusAccepted
	})
}

// heartbeat posts worker heartbeats through the worker API, as sending
// workers do, every 2 s until ctx is done; the test waits for it at
// cleanup.
func (e *prodShape) heartbeat(ctx context.Context) {
	var wg sync.WaitGroup
	e.t.Cleanup(wg.Wait)
	wg.Go(func() {
		for {
			for _, w := range e.workers {
				if _, silenced := e.hbSilenced.Load(w); silenced {
					continue
				}
				b, _ := json.Marshal(domain.WorkerHeartbeat{WorkerID: w, Tier: domain.TierSharedFree,
					Egress: domain.EgressColdSMTP, Address: "smtp-" + w[len(w)-2:] + ".example.org"})
				code, _ := e.call(ctx, http.MethodPost, e.apiURL+"/v1/workers/heartbeat", access.WorkerToken(e.fleet, w), "application/json", b, nil)
				if code/100 != 2 && ctx.Err() == nil {
					e.hbRefused.Add(1)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(2 * time.Second):
			}
		}
	})
}

// placedOn returns the worker the assignments API places mailbox on ("" if
// none, or if the API does not answer 200).
func (e *prodShape) placedOn(ctx context.Context, mailbox string) (worker string, band domain.RiskPool) {
	for _, w := range e.workers {
		var fr workerapi.FullResponse
		code, _ := e.call(ctx, http.MethodGet, e.apiURL+"/v1/workers/"+w+"/assignments", e.token, "", nil, &fr)
		for _, a := range fr.Mailboxes {
			if code == http.StatusOK && a.MailboxID == mailbox {
				return w, a.Band
			}
		}
	}
	return "", ""
}

// addMailbox makes a Dovecot user with one message in its INBOX and
// publishes its mailbox.added through the API; it returns the mailbox id.
func (e *prodShape) addMailbox(ctx context.Context, org, user string) string {
	id, added := e.newMailbox(org, user)
	e.mustPublish(ctx, added)
	return id
}

// newMailbox makes a Dovecot user with one message in its INBOX and
// returns the id and the mailbox.added of its mailbox, not published.
func (e *prodShape) newMailbox(org, user string) (string, *domain.MailboxAdded) {
	n := e.next.Add(1)
	name, pw := fmt.Sprintf("box%d", n), fmt.Sprintf("box-secret-%d", n)
	id := fmt.Sprintf("0190a5b2-4c5e-7b1a-9c3d-%012x", 0xb00000+n)
	e.dc.AddUser(e.t, name, pw)
	e.dc.Deliver(e.t, name, "INBOX", fmt.Appendf(nil, "From: a@example.org\r\nTo: %s@example.org\r\nSubject: hello %d\r\n"+
		"Message-ID: <m%d@example.org>\r\nDate: %s\r\n\r\nhello\r\n", name, n, n, time.Now().UTC().Format(time.RFC1123Z)))
	return id, e.mailbox(id, org, user, name, pw)
}

func (e *prodShape) mailbox(id, org, user, name, pw string) *domain.MailboxAdded {
	return &domain.MailboxAdded{MailboxID: id, OrgID: org, UserID: user, Address: name + "@example.org",
		Provider: domain.ProviderSMTPIMAP, WarmupEnabled: true,
		IMAP:        domain.IMAPEndpoint{Host: e.dc.Host, Port: e.dc.IMAPSPort, TLS: domain.TLSImplicit, Username: name},
		Credentials: &domain.Credentials{Password: pw}}
}

// waitFlowed waits until mailbox went through every role: placed (the
// assignments API), projected (the registry's row) and synced (a message
// stored by its sync runner). It returns how long that took.
func (e *prodShape) waitFlowed(ctx context.Context, mailbox, after string) time.Duration {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	waitUntil(ctx, e.t, "mailbox placed "+after, func(ctx context.Context) bool {
		w, _ := e.placedOn(ctx, mailbox)
		return w != ""
	})
	stages := []string{fmt.Sprintf("placed %s", time.Since(start).Round(10*time.Millisecond))}
	for _, q := range [][2]string{
		{"projected", `SELECT count(*) FROM mailboxes WHERE mailbox_id = $1`},
		{"synced", `SELECT count(*) FROM imap_messages WHERE mailbox_id = $1`},
	} {
		waitUntil(ctx, e.t, "mailbox "+q[0]+" "+after, func(ctx context.Context) bool {
			var n int
			err := e.db.QueryRow(ctx, q[1], mailbox).Scan(&n)
			return err == nil && n > 0
		})
		stages = append(stages, fmt.Sprintf("%s %s", q[0], time.Since(start).Round(10*time.Millisecond)))
	}
	e.t.Logf("mailbox %s %s: %s", mailbox, after, strings.Join(stages, ", "))
	return time.Since(start)
}

// startBroker starts the in-process broker on addr, persisted in
// brokerDir (a restart finds its topics, offsets and groups).
func (e *prodShape) startBroker(t *testing.T, addr string) {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	emb, err := kafka.StartEmbedded(kafka.WithPort(p), kafka.WithDataDir(e.brokerDir), kafka.WithSyncWrites(),
		kafka.WithKfakeOptions(kfake.GroupMinSessionTimeout(100*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	e.broker = emb
	t.Cleanup(func() { e.broker.Close() })
}
