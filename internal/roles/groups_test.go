package roles

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/mailplane/mailplane/internal/config"
)

// TestGroupFlags: every role's group timings default to a few seconds
// (not franz-go's 45 s session), values given reach the role's
// configuration, and a heartbeat not shorter than the session is refused.
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
	for _, s := range []config.Setting{config.ProjectorSession, config.ProjectorHeartbeat, config.EngineSession,
		config.EngineHeartbeat, config.StateSession, config.StateHeartbeat} {
		t.Setenv(s.Env, "")
	}
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
