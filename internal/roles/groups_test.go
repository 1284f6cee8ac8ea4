package roles

import (
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/mailsync"
)

// TestGroupFlags: every role's group timings default to a few seconds
// (not franz-go's 45 s session), values given reach the role's
// configuration, and a heartbeat not shorter than the session is refused.
// The shared pair and the per-role overrides have their own test below.
func TestGroupFlags(t *testing.T) {
	parse := func(args ...string) (*roleConfig, error) {
		fs := flag.NewFlagSet("dev", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		gf := registerAllGroupFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		set, err := gf.timings()
		if err != nil {
			return nil, err
		}
		rc := &roleConfig{}
		set(rc)
		return rc, nil
	}
	clearGroupEnv(t)
	rc, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	want := groupTimings{6 * time.Second, 500 * time.Millisecond}
	for name, g := range map[string]groupTimings{"projector": rc.projectorGroup, "engine": rc.engineGroup, "state": rc.stateGroup} {
		if g != want {
			t.Errorf("%s: default %+v, want %+v", name, g, want)
		}
	}
	if (groupTimings{}).orDefault() != want {
		t.Errorf("a role configured by hand gets %+v, want %+v", (groupTimings{}).orDefault(), want)
	}
	rc, err = parse("--projector-session-timeout", "9s", "--projector-heartbeat-interval", "1s", "--engine-session-timeout", "7s")
	if err != nil {
		t.Fatal(err)
	}
	if g := rc.projectorGroup.group(); g.SessionTimeout != 9*time.Second || g.HeartbeatInterval != time.Second {
		t.Errorf("projector group %+v, want 9s and 1s", g)
	}
	if rc.engineGroup.session != 7*time.Second || rc.stateGroup != want {
		t.Errorf("engine %+v, state %+v", rc.engineGroup, rc.stateGroup)
	}
	for _, bad := range [][]string{
		{"--state-session-timeout", "2s", "--state-heartbeat-interval", "2s"},
		{"--engine-heartbeat-interval", "0s"},
		{"--projector-session-timeout", "-1s"},
	} {
		if _, err := parse(bad...); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func clearGroupEnv(t *testing.T) {
	for _, s := range []config.Setting{config.GroupSession, config.GroupHeartbeat, config.ProjectorSession, config.ProjectorHeartbeat,
		config.EngineSession, config.EngineHeartbeat, config.StateSession, config.StateHeartbeat, config.SyncSession, config.SyncHeartbeat} {
		t.Setenv(s.Env, "")
	}
}

// TestSharedGroupTimings: one pair (--group-session-timeout,
// --group-heartbeat-interval, or their environment) sets every role's
// timings, sync's included; a role's own setting overrides only its half
// of the pair; the heartbeat-shorter-than-session check applies to the
// pair each role ends up with, and its error names the settings the values
// came from.
func TestSharedGroupTimings(t *testing.T) {
	clearGroupEnv(t)
	parse := func(args ...string) (*roleConfig, time.Duration, time.Duration, error) {
		fs := flag.NewFlagSet("dev", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		gf, sf := registerAllGroupFlags(fs), registerSyncFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		set, err := gf.timings()
		if err != nil {
			return nil, 0, 0, err
		}
		rc := &roleConfig{}
		set(rc)
		sc, err := sf.config()
		return rc, sc.SessionTimeout, sc.HeartbeatInterval, err
	}
	rc, syncSession, syncHeartbeat, err := parse("--group-session-timeout", "10s", "--group-heartbeat-interval", "2s")
	if err != nil {
		t.Fatal(err)
	}
	shared := groupTimings{10 * time.Second, 2 * time.Second}
	for name, g := range map[string]groupTimings{"projector": rc.projectorGroup, "engine": rc.engineGroup, "state": rc.stateGroup,
		"sync": {syncSession, syncHeartbeat}} {
		if g != shared {
			t.Errorf("%s: %+v, want the shared %+v", name, g, shared)
		}
	}

	t.Setenv(config.GroupSession.Env, "20s")
	t.Setenv(config.EngineHeartbeat.Env, "3s")
	rc, syncSession, _, err = parse("--state-session-timeout", "8s")
	if err != nil {
		t.Fatal(err)
	}
	if want := (groupTimings{20 * time.Second, 3 * time.Second}); rc.engineGroup != want {
		t.Errorf("engine %+v, want the shared session and its own heartbeat %+v", rc.engineGroup, want)
	}
	if want := (groupTimings{8 * time.Second, 500 * time.Millisecond}); rc.stateGroup != want {
		t.Errorf("state %+v, want its own session and the default heartbeat %+v", rc.stateGroup, want)
	}
	if syncSession != 20*time.Second {
		t.Errorf("sync session %s, want the shared 20s", syncSession)
	}

	for _, c := range []struct {
		args  []string
		names []string
	}{
		{[]string{"--group-session-timeout", "1s", "--group-heartbeat-interval", "1s"}, []string{"--group-heartbeat-interval", "--group-session-timeout"}},
		{[]string{"--sync-heartbeat-interval", "25s"}, []string{"--sync-heartbeat-interval 25s", "--group-session-timeout 20s"}},
		{[]string{"--projector-session-timeout", "400ms"}, []string{"--group-heartbeat-interval 500ms", "--projector-session-timeout 400ms"}},
		{[]string{"--state-heartbeat-interval", "0s"}, []string{"--state-heartbeat-interval 0s", "positive"}},
	} {
		_, _, _, err := parse(c.args...)
		if err == nil {
			t.Errorf("%v accepted", c.args)
			continue
		}
		for _, n := range c.names {
			if !strings.Contains(err.Error(), n) {
				t.Errorf("%v: error %q does not name %s", c.args, err, n)
			}
		}
	}
}

// TestSyncFlagDefaults: with nothing set, the sync settings give exactly
// mailsync's defaults (the table renders them from there).
func TestSyncFlagDefaults(t *testing.T) {
	clearGroupEnv(t)
	for _, s := range []config.Setting{config.SyncWorkerID, config.PollWarm, config.PollCold, config.SessionGrace, config.HotActivity,
		config.ColdAfter, config.HotBudget, config.ConnectRate, config.PollsInFlight} {
		t.Setenv(s.Env, "")
	}
	fs := flag.NewFlagSet("sync", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	sf := registerSyncFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	got, err := sf.config()
	if err != nil {
		t.Fatal(err)
	}
	if want := mailsync.DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("sync flags' defaults %+v, want mailsync's %+v", got, want)
	}
}
