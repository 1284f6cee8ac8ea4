package billing

import (
	"testing"

	"github.com/mailplane/mailplane/domain"
)

// TestOrgPlan: the best plan any subscription grants; dedicated workers of
// the dedicated grants added up, bounded by the domain's maximum; free
// without grants.
func TestOrgPlan(t *testing.T) {
	t.Parallel()
	free, premium := grant{plan: domain.PlanFree}, grant{plan: domain.PlanPremium}
	ded := func(n int) grant { return grant{plan: domain.PlanDedicated, dedicated: n} }
	for _, c := range []struct {
		name string
		in   []grant
		want grant
	}{
		{"none", nil, free},
		{"free only", []grant{free, free}, free},
		{"premium beats free, whatever the order", []grant{free, premium, free}, premium},
		{"dedicated beats premium", []grant{premium, ded(2)}, ded(2)},
		{"dedicated workers added up", []grant{ded(2), free, ded(1), premium}, ded(3)},
		{"bounded", []grant{ded(domain.MaxDedicatedWorkers), ded(5)}, ded(domain.MaxDedicatedWorkers)},
	} {
		if got := orgPlan(c.in); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
