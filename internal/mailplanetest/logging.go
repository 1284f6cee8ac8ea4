package mailplanetest

import (
	"encoding/json"
	"log/slog"
	"os"
	"testing"
)

// EnvLog names the variable that turns on debug logs in tests
// (MAILPLANE_TEST_LOG=debug, or any value).
const EnvLog = "MAILPLANE_TEST_LOG"

// Logger returns a logger for the components a test runs: warnings and
// errors go into t's output (shown when the test fails, or with -v), and
// everything down to debug when MAILPLANE_TEST_LOG is set. A component
// must stop logging before t ends (stop it in a cleanup), as t's output
// is closed then.
func Logger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv(EnvLog) != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: level}))
}

// MustJSON renders v as JSON (a request body, a value in a failure
// message); it fails t if v cannot be rendered.
func MustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
