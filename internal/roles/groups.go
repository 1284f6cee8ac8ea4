package roles

import (
	"flag"
	"fmt"
	"time"

	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/kafka"
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

// orDefault fills the timings a role configured by hand (tests,
// embedders) leaves zero with kafka's defaults, not franz-go's 45 s
// session.
func (g groupTimings) orDefault() groupTimings {
	if g.session <= 0 {
		g.session = kafka.DefaultSessionTimeout
	}
	if g.heartbeat <= 0 {
		g.heartbeat = kafka.DefaultHeartbeatInterval
	}
	return g
}

// groupFlags are the session and heartbeat settings of one role: its own
// when given, else the shared pair (--group-session-timeout,
// --group-heartbeat-interval), registered once per flag set.
type groupFlags struct {
	sharedSession, sharedHeartbeat *flag.Flag
	session, heartbeat             *config.Override
	sessionFlag, heartbeatFl       string
}

func registerGroupFlags(fs *flag.FlagSet, session, heartbeat config.Setting) groupFlags {
	if fs.Lookup(config.GroupSession.Flag) == nil {
		config.GroupSession.Duration(fs)
		config.GroupHeartbeat.Duration(fs)
	}
	return groupFlags{sharedSession: fs.Lookup(config.GroupSession.Flag), sharedHeartbeat: fs.Lookup(config.GroupHeartbeat.Flag),
		session: session.Override(fs), heartbeat: heartbeat.Override(fs), sessionFlag: session.Flag, heartbeatFl: heartbeat.Flag}
}

// timings reads the flags once parsed: the heartbeat must be positive and
// shorter than the session, or the member would miss its own session.
// Errors name the flags the values came from.
func (f groupFlags) timings() (groupTimings, error) {
	g := groupTimings{session: f.session.Or(flagDuration(f.sharedSession)), heartbeat: f.heartbeat.Or(flagDuration(f.sharedHeartbeat))}
	sessionFlag, heartbeatFl := config.GroupSession.Flag, config.GroupHeartbeat.Flag
	if f.session.Given() {
		sessionFlag = f.sessionFlag
	}
	if f.heartbeat.Given() {
		heartbeatFl = f.heartbeatFl
	}
	switch {
	case g.session <= 0 || g.heartbeat <= 0:
		return g, fmt.Errorf("--%s %s, --%s %s: both must be positive", sessionFlag, g.session, heartbeatFl, g.heartbeat)
	case g.heartbeat >= g.session:
		return g, fmt.Errorf("--%s %s must be shorter than --%s %s (a member would miss its own session)", heartbeatFl, g.heartbeat, sessionFlag, g.session)
	}
	return g, nil
}

// flagDuration is the value of a parsed duration flag.
func flagDuration(f *flag.Flag) time.Duration {
	return f.Value.(flag.Getter).Get().(time.Duration)
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
