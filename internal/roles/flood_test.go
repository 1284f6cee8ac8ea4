package roles

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/billing"
	"github.com/mailplane/mailplane/internal/dbpools"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/opshttp"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/sealing"
)

// TestSlowBodyFloodLeavesWorkersAndProducers: the api role as wired, on
// loopback, while 200 anonymous connections hold slow bodies (100 login
// forms trickling to /console/login, 100 chunked Stripe deliveries with a
// fresh forged signature header trickling to /v1/webhooks/billing) and
// have spent the anonymous and billing budgets (both shed): six workers'
// heartbeats are all accepted and a producer's events too. The minimum
// body rate is set out of reach here, so the class budgets alone keep the
// attack off (the rate's cut has its own test in internal/api); the login
// limit is too, so the login forms reach the budget. Before the budgets
// per class, these bodies held the one server-wide budget and every
// heartbeat got 503.
func TestSlowBodyFloodLeavesWorkersAndProducers(t *testing.T) {
	t.Parallel()
	const (
		producerToken = "producer-tok-5e4d3c2b1a09f8e7d6c5"
		attackers     = 200
	)
	fleetSecret := []byte("fleet-secret-for-the-flood-test-0123456789")
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(access.Line("product", producerToken, []string{domain.ScopePublishPublic}, "/product")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keyring, err := sealing.NewKeyring("k1", map[string][]byte{"k1": bytes.Repeat([]byte{7}, sealing.KeySize)})
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	kcfg := kafkatest.Config(t, 4)
	kc, err := kafka.NewProducer(kcfg.WithClientID("flood-test"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)

	reg := prometheus.NewRegistry()
	hour := time.Hour
	rc := &roleConfig{api: true, log: slog.New(slog.DiscardHandler), reg: reg, statePartitions: 4,
		kafka: kcfg, tokensFile: tokens, fleetSecret: fleetSecret, keyring: keyring, httpAddr: "127.0.0.1:0",
		inflightBytes: api.DefaultMaxInflightBytes,
		billing:       &billing.Config{Secrets: []string{"whsec_flood"}, Prices: map[string]billing.PlanSpec{"price_premium": {Plan: domain.PlanPremium}}},
		bodies: bodyLimits{
			// The anonymous budget smaller than the default, so 100 login
			// forms of 4,000 bytes spend it; the billing budget is the
			// default 8 MiB (32 deliveries of 256 KiB).
			classes:         map[api.Class]api.ClassLimits{api.ClassAnonymous: {Budget: 256 << 10, Deadline: hour}, api.ClassBilling: {Budget: api.DefaultBillingBudget, Deadline: hour}},
			rate:            api.BodyRate{Min: 1, Grace: hour},
			loginsPerMinute: 1e6, loginBurst: 1e6,
		},
	}
	p := newProcess(ctx, rc)
	p.pools = &dbpools.Pools{Serve: db.Pool, Runners: db.Pool, Work: db.Pool}
	p.broker = kc
	p.health = opshttp.NewHealth(0, map[string]opshttp.Check{"broker": kc.Ping})
	srv, err := p.buildAPI()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-served })

	// The attack: each connection sends its headers and a first byte, then
	// a byte every 200 ms until told to stop.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range attackers {
		var head string
		if i%2 == 0 {
			head = "POST /console/login HTTP/1.1\r\nHost: " + addr + "\r\nOrigin: http://" + addr +
				"\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 4000\r\n\r\nt"
		} else {
			head = "POST /v1/webhooks/billing HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n" +
				billing.SignatureHeader + ": t=" + fmt.Sprint(time.Now().Unix()) + ",v1=" + strings.Repeat("ab", 32) +
				"\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n"
		}
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if _, err := conn.Write([]byte(head)); err != nil {
			t.Fatal(err)
		}
		chunked := i%2 == 1
		wg.Go(func() {
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				b := []byte("x")
				if chunked {
					b = []byte("1\r\n \r\n")
				}
				if _, err := conn.Write(b); err != nil {
					return // shed: the server answered 503 and closed
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()

	// Wait until the attack has spent both budgets.
	for _, class := range []api.Class{api.ClassAnonymous, api.ClassBilling} {
		waitFor(t, time.Minute, "the attack spending the "+string(class)+" budget",
			func() bool {
				return mailplanetest.Metric(t, reg, "mailplane_http_shed_total", "class", string(class)) > 0
			})
	}
	anonHeld := mailplanetest.Metric(t, reg, "mailplane_http_inflight_body_bytes", "class", string(api.ClassAnonymous))
	billHeld := mailplanetest.Metric(t, reg, "mailplane_http_inflight_body_bytes", "class", string(api.ClassBilling))
	if anonHeld < 200<<10 || billHeld < 7<<20 {
		t.Fatalf("the attack holds %v anonymous and %v billing bytes; want the budgets nearly full", anonHeld, billHeld)
	}

	client := &http.Client{Timeout: 30 * time.Second}
	post := func(path, token string, ct string, body any) (int, string) {
		t.Helper()
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", ct)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out bytes.Buffer
		_, _ = out.ReadFrom(resp.Body)
		return resp.StatusCode, out.String()
	}
	workers := make([]string, 6)
	for i := range workers {
		workers[i] = uuid.Must(uuid.NewV7()).String()
	}
	for round := range 3 {
		for _, id := range workers {
			status, body := post("/v1/workers/heartbeat", access.WorkerToken(fleetSecret, id), "application/json",
				map[string]any{"worker_id": id, "tier": "shared_free", "egress": "cold_smtp", "address": "10.0.0.7:25"})
			if status != http.StatusAccepted {
				t.Fatalf("round %d, worker %s: heartbeat %d %s during the flood", round, id, status, body)
			}
		}
		user := uuid.Must(uuid.NewV7()).String()
		status, body := post("/v1/events", producerToken, api.ContentTypeStructured, map[string]any{
			"specversion": "1.0", "id": domain.NewEventID(), "type": domain.TypeUserActive, "source": "/product",
			"data": map[string]any{"user_id": user, "source": "login"}})
		if status != http.StatusAccepted {
			t.Fatalf("round %d: producer's event %d %s during the flood", round, status, body)
		}
	}
	// The attack still held its budgets throughout.
	if v := mailplanetest.Metric(t, reg, "mailplane_http_inflight_body_bytes", "class", string(api.ClassBilling)); v < 7<<20 {
		t.Fatalf("the billing budget was released during the test (%v bytes held)", v)
	}
	for _, class := range []api.Class{api.ClassHeartbeat, api.ClassProducer} {
		if v := mailplanetest.Metric(t, reg, "mailplane_http_shed_total", "class", string(class)); v != 0 {
			t.Errorf("%v %s requests shed", v, class)
		}
	}
}
