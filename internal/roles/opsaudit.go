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

// opsAudit opens the api role's audit recorder, closed at shutdown.
func (p *process) opsAudit(log *slog.Logger) (*apiAudit, error) {
	rec, err := opsaudit.New(p.kcfg("ops-audit"), "mailplane/api", p.reg, log.With("component", "opsaudit"))
	if err != nil {
		return nil, err
	}
	p.onShutdown(rec.Close)
	host, _ := os.Hostname()
	return &apiAudit{rec: rec, actor: opsaudit.Process("mailplane-api@" + host), ctx: p.ctx}, nil
}

// tokensReloaded records a reload of the tokens file (access.WithReloadHook);
// a failure is logged and counted by the recorder: the reload stands.
func (a *apiAudit) tokensReloaded(r access.Reload) {
	_ = a.rec.Record(a.ctx, opsaudit.TokensReload(a.actor, r))
}
