package roles

import (
	"context"
	"log/slog"
	"os"

	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/opsaudit"
)

// apiAudit is the api role's operator audit: the console's logins,
// logouts and redrives, and the tokens-file reloads.
type apiAudit struct {
	rec   *opsaudit.Recorder
	actor opsaudit.Actor
	ctx   context.Context
}

// opsAudit is the api role's audit recorder, writing through the
// process's producer (the API's own).
func (p *process) opsAudit(log *slog.Logger) *apiAudit {
	rec := opsaudit.NewOn(p.broker, p.rc.kafka.Namespace, "mailplane/api", p.reg, log.With("component", "opsaudit"))
	host, _ := os.Hostname()
	return &apiAudit{rec: rec, actor: opsaudit.Process("mailplane-api@" + host), ctx: p.ctx}
}

// tokensReloaded records a reload of the tokens file (access.WithReloadHook);
// a failure is logged and counted by the recorder: the reload stands.
func (a *apiAudit) tokensReloaded(r access.Reload) {
	_ = a.rec.Record(a.ctx, opsaudit.TokensReload(a.actor, r))
}
