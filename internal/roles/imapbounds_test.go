package roles

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/imapsync"
)

// TestSyncIMAPBoundsFlags: the settings' defaults are the runner's
// defaults, and values given (by flag or environment) reach the runner's
// configuration.
func TestSyncIMAPBoundsFlags(t *testing.T) {
	parse := func(args ...string) imapsync.Config {
		fs := flag.NewFlagSet("sync", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		sf := registerSyncFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		rc := &roleConfig{}
		sf.applyIMAP(rc, nil, domain.TransportPolicy{})
		return rc.imapBounds
	}
	for _, s := range []config.Setting{config.SetupTimeout, config.SetupSharePerHost, config.IMAPMaxResponse, config.IMAPMaxSession} {
		t.Setenv(s.Env, "")
	}
	got := parse()
	want := imapsync.Config{SetupTimeout: imapsync.DefaultSetupTimeout, SetupSharePerHost: imapsync.DefaultSetupSharePerHost,
		MaxResponseBytes: imapsync.DefaultMaxResponseBytes, MaxSessionBytes: imapsync.DefaultMaxSessionBytes}
	if got.SetupTimeout != want.SetupTimeout || got.SetupSharePerHost != want.SetupSharePerHost ||
		got.MaxResponseBytes != want.MaxResponseBytes || got.MaxSessionBytes != want.MaxSessionBytes {
		t.Errorf("defaults: %+v, want the runner's %+v", got, want)
	}
	t.Setenv(config.SetupSharePerHost.Env, "50")
	got = parse("--sync-setup-timeout", "45s", "--sync-imap-max-response-kib", "512", "--sync-imap-max-session-mib", "64")
	if got.SetupTimeout != 45*time.Second || got.SetupSharePerHost != 50 || got.MaxResponseBytes != 512<<10 || got.MaxSessionBytes != 64<<20 {
		t.Errorf("given: %+v", got)
	}
}
