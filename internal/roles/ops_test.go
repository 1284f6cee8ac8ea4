package roles

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/opshttp"
	"github.com/mailplane/mailplane/internal/pgtest"
)

// TestOpsListenerHealthShape: the ops listener of a role without the API
// answers the detailed /healthz in the API's shape (opshttp.HealthResponse:
// status, and per check status, error and latency) and serves the role's
// metrics.
func TestOpsListenerHealthShape(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 4)
	db := pgtest.New(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	startRoles(t, &roleConfig{log: log, kafka: kcfg, databaseURL: db.URL, statePartitions: 4,
		stateProc: true, opsAddr: addr})

	var body string
	var code int
	// The listener answers from the start, the database "waiting" until
	// the pools are open; then both checks are ok.
	waitFor(t, 30*time.Second, "the ops listener to report healthy", func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body, code = string(b), resp.StatusCode
		return code == http.StatusOK
	})
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	var hr opshttp.HealthResponse
	if err := dec.Decode(&hr); err != nil {
		t.Fatalf("healthz is not the API's shape: %v: %s", err, body)
	}
	if code != http.StatusOK || hr.Status != opshttp.HealthOK || len(hr.Checks) != 2 ||
		hr.Checks["broker"].Status != opshttp.HealthOK || hr.Checks["database"].Status != opshttp.HealthOK {
		t.Fatalf("healthz: %d %s", code, body)
	}

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "go_goroutines") || !strings.Contains(string(b), "mailplane_build_info{") {
		t.Fatalf("metrics: %d\n%s", resp.StatusCode, fmt.Sprint(len(b)))
	}
}
