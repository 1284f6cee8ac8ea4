package roles

import (
	"flag"
	"fmt"
	"time"

	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/kafka"
)

// Consumer-group timings a role gets when its configuration names none
// (tests and embedders building a roleConfig by hand): franz-go's own
// defaults (45 s session) would leave a dead member's partitions idle
// for most of a minute.
const (
	defaultGroupSession   = 6 * time.Second
	defaultGroupHeartbeat = 500 * time.Millisecond
)

// groupTimings are one role's consumer-group timings: how long after a
// member dies its partitions move (session), and how often it says it
// lives (heartbeat).
type groupTimings struct {
	session, heartbeat time.Duration
}

// group returns the group configuration with these timings (name and
// topics left to the role's package), defaults for zero fields.
func (g groupTimings) group() kafka.GroupConfig {
	return kafka.GroupConfig{SessionTimeout: g.orDefault().session, HeartbeatInterval: g.orDefault().heartbeat}
}

func (g groupTimings) orDefault() groupTimings {
	if g.session <= 0 {
		g.session = defaultGroupSession
	}
	if g.heartbeat <= 0 {
		g.heartbeat = defaultGroupHeartbeat
	}
	return g
}

// groupFlags are the session and heartbeat settings of one role.
type groupFlags struct {
	session, heartbeat       *time.Duration
	sessionFlag, heartbeatFl string
}

func registerGroupFlags(fs *flag.FlagSet, session, heartbeat config.Setting) groupFlags {
	return groupFlags{session: session.Duration(fs), heartbeat: heartbeat.Duration(fs),
		sessionFlag: session.Flag, heartbeatFl: heartbeat.Flag}
}

// timings reads the flags once parsed: the heartbeat must be positive and
// shorter than the session, or the member would miss its own session.
func (f groupFlags) timings() (groupTimings, error) {
	g := groupTimings{session: *f.session, heartbeat: *f.heartbeat}
	switch {
	case g.session <= 0 || g.heartbeat <= 0:
		return g, fmt.Errorf("--%s %s, --%s %s: both must be positive", f.sessionFlag, g.session, f.heartbeatFl, g.heartbeat)
	case g.heartbeat >= g.session:
		return g, fmt.Errorf("--%s %s must be shorter than --%s %s", f.heartbeatFl, g.heartbeat, f.sessionFlag, g.session)
	}
	return g, nil
}

// allGroupFlags are the group settings of every role but sync, for dev
// mode, which runs them all in one process.
type allGroupFlags struct{ projector, engine, state groupFlags }

func registerAllGroupFlags(fs *flag.FlagSet) allGroupFlags {
	return allGroupFlags{
		projector: registerGroupFlags(fs, config.ProjectorSession, config.ProjectorHeartbeat),
		engine:    registerGroupFlags(fs, config.EngineSession, config.EngineHeartbeat),
		state:     registerGroupFlags(fs, config.StateSession, config.StateHeartbeat),
	}
}

// timings reads the flags once parsed; the returned func sets them on a
// role configuration.
func (f allGroupFlags) timings() (func(*roleConfig), error) {
	pg, err := f.projector.timings()
	if err != nil {
		return nil, err
	}
	eg, err := f.engine.timings()
	if err != nil {
		return nil, err
	}
	sg, err := f.state.timings()
	if err != nil {
		return nil, err
	}
	return func(rc *roleConfig) { rc.projectorGroup, rc.engineGroup, rc.stateGroup = pg, eg, sg }, nil
}
