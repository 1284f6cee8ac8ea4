package roles

import (
	"fmt"
	"strconv"

	"github.com/mailplane/mailplane/internal/dbpools"
)

// PoolSizesFor returns the pools a process running command opens, with the
// pool settings of env (compose's environment), for the compose tests.
func PoolSizesFor(command string, env map[string]string) (dbpools.Sizes, error) {
	rc := &roleConfig{}
	switch command {
	case "api":
		rc.api = true
	case "project":
		rc.project = true
	case "engine":
		rc.engine = true
	case "state":
		rc.stateProc = true
	case "sync":
		rc.syncWorkers = 1
	default:
		return dbpools.Sizes{}, fmt.Errorf("role %q: which pools does it open?", command)
	}
	for _, p := range []struct {
		n   *int32
		env string
	}{{&rc.pgSizes.Serve, "MAILPLANE_PG_SERVE_CONNS"}, {&rc.pgSizes.Runners, "MAILPLANE_PG_RUNNER_CONNS"}, {&rc.pgSizes.Work, "MAILPLANE_PG_WORK_CONNS"}} {
		if v, ok := env[p.env]; ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				return dbpools.Sizes{}, fmt.Errorf("%s=%q: %w", p.env, v, err)
			}
			*p.n = int32(n)
		}
	}
	return rc.poolSizes(), nil
}
