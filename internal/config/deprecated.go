package config

import (
	"log/slog"
	"os"
	"sort"
	"sync"
)

// formerEnv maps each setting's environment name to the name it had
// before every name took the MAILPLANE_ prefix. The former names are read
// for one release, with a warning at startup (WarnDeprecated), and then
// dropped with this table; `mailplane help config` lists only the new.
var formerEnv = map[string]string{
	DatabaseURL.Env:      "DATABASE_URL",
	PollWarm.Env:         "POLL_WARM",
	PollCold.Env:         "POLL_COLD",
	SessionGrace.Env:     "TIER_SESSION_GRACE",
	HotActivity.Env:      "TIER_HOT_ACTIVITY",
	ColdAfter.Env:        "TIER_COLD_AFTER",
	HotBudget.Env:        "HOT_BUDGET_PER_WORKER",
	IMAPCAFile.Env:       "IMAP_CA_FILE",
	IMAPDisableAfter.Env: "IMAP_AUTH_DISABLE_AFTER",
}

// lookupEnv returns the value of the environment variable env, else (for
// one release) that of its former name; empty when neither is set. The
// new name wins when both are.
func lookupEnv(env string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	if old, ok := formerEnv[env]; ok {
		return os.Getenv(old)
	}
	return ""
}

var warnOnce sync.Once

// WarnDeprecated logs, once per process, a warning for every former
// environment name set, naming the new one (and, when both are set, that
// the new one wins). The command calls it at startup, before any setting
// is read.
func WarnDeprecated(log *slog.Logger) {
	warnOnce.Do(func() { warnDeprecated(log) })
}

func warnDeprecated(log *slog.Logger) {
	news := make([]string, 0, len(formerEnv))
	for n := range formerEnv {
		news = append(news, n)
	}
	sort.Strings(news)
	for _, n := range news {
		old := formerEnv[n]
		if os.Getenv(old) == "" {
			continue
		}
		if os.Getenv(n) != "" {
			log.Warn("deprecated environment variable "+old+" ignored: "+n+" is also set and wins; unset "+old,
				"deprecated", old, "use", n)
			continue
		}
		log.Warn("deprecated environment variable "+old+" read for one more release: rename it "+n,
			"deprecated", old, "use", n)
	}
}
