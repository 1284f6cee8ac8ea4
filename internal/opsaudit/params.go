package opsaudit

import (
	"fmt"
	"strings"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/dlq"
)

// RedriveParams are the audit parameters of a DLQ redrive of sel, from the
// CLI or the console alike: the consumer, the filters, and, once it ran,
// how many dead letters rep says were redriven.
func RedriveParams(sel dlq.Selection, rep *dlq.Report) domain.OpsParams {
	var f []string
	if sel.Code != "" {
		f = append(f, "code="+string(sel.Code))
	}
	if sel.FromOffset != nil {
		f = append(f, fmt.Sprintf("from_offset=%d", *sel.FromOffset))
	}
	if sel.ToOffset != nil {
		f = append(f, fmt.Sprintf("to_offset=%d", *sel.ToOffset))
	}
	if sel.Again {
		f = append(f, "again")
	}
	if sel.OutOfOrder {
		f = append(f, "out_of_order")
	}
	p := domain.OpsParams{Target: sel.Consumer, Filter: strings.Join(f, " "), DryRun: sel.DryRun}
	if rep != nil {
		p.Count = int64(rep.Count(dlq.OutcomeRedriven) + rep.Count(dlq.OutcomeWouldRedrive))
	}
	return p
}

// TokensReload is the audit entry of a tokens-file reload the process
// (actor) noticed: the caller names it added, removed or changed (never a
// token); refused when the file was not loaded at all, failed when some
// of its lines were invalid (only the callers they repeat unchanged stay).
func TokensReload(actor Actor, r access.Reload) Entry {
	e := Entry{Actor: actor, Action: domain.OpsTokensReload, Params: &domain.OpsParams{
		Target: r.Path, Added: Names(r.Added), Removed: Names(r.Removed), Changed: Names(r.Changed),
	}}
	switch {
	case r.Failed:
		e.Err, e.Refused = domain.Errorf(domain.CodeInvalid, "the tokens file was not loaded; the callers in force stay (see the log)"), true
	case r.InvalidLines > 0:
		e.Err = domain.Errorf(domain.CodeInvalid, "%d invalid lines: only the callers they repeat unchanged stay in force (see the log)", r.InvalidLines)
	}
	return e
}
