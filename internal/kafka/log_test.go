package kafka

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestClientLoggerPassesWarningsOnly(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	debug := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l := clientLogger(debug, "c1")
	if l.Level() != kgo.LogLevelWarn {
		t.Fatalf("level %v under a debug logger, want warn", l.Level())
	}
	l.Log(kgo.LogLevelInfo, "fetched")
	l.Log(kgo.LogLevelWarn, "broker gone", "broker", 1)
	out := buf.String()
	if strings.Contains(out, "fetched") || !strings.Contains(out, "broker gone") || !strings.Contains(out, "kafka_client=c1") {
		t.Fatalf("logged %q", out)
	}
	quiet := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError}))
	if lvl := clientLogger(quiet, "c2").Level(); lvl != kgo.LogLevelError {
		t.Fatalf("level %v under an error logger, want error", lvl)
	}
}
