package opsaudit

import (
	"fmt"
	"strings"

	"github.com/mailplane/mailplane/domain"
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
