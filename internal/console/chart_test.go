package console

import (
	"math"
	"testing"
	"time"

	"github.com/mailplane/mailplane/internal/query"
)

// The chart spans the scoring window ending at the current hour: each
// hour's bar in its slot, junk stacked on inbox, heights to scale, hours
// outside the window left out.
func TestEvidenceChart(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 8, 12, 30, 0, 0, time.UTC)
	h := func(d int) time.Time {
		return time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC).Add(-time.Duration(d) * time.Hour)
	}
	c := evidenceChart([]query.EvidenceHour{
		{Hour: h(30), Inbox: 1, Junk: 1}, // outside a day's window
		{Hour: h(23), Inbox: 4, Junk: 0},
		{Hour: h(0), Inbox: 2, Junk: 6},
	}, now, 24*time.Hour)
	if len(c.Bars) != 2 || c.Max != 8 || c.Inbox != 7 || c.Junk != 7 {
		t.Fatalf("chart %+v", c)
	}
	slot := float64(chartW) / 24
	if c.Bars[0].X != 0 || math.Abs(c.Bars[1].X-23*slot) > 1e-9 {
		t.Errorf("bars at %v and %v, want 0 and %v", c.Bars[0].X, c.Bars[1].X, 23*slot)
	}
	full := float64(chartH - 4)
	b := c.Bars[1]
	if math.Abs(b.InboxH-full*2/8) > 1e-9 || math.Abs(b.JunkH-full*6/8) > 1e-9 || math.Abs(b.JunkY+b.JunkH-b.InboxY) > 1e-9 {
		t.Errorf("last hour's bar %+v: want inbox 2/8 and junk 6/8 of the height, stacked", b)
	}
	if c.First != "2026-03-07 13:00Z" || c.Last != "2026-03-08 12:00Z" {
		t.Errorf("span %s to %s", c.First, c.Last)
	}
	if e := evidenceChart(nil, now, 24*time.Hour); len(e.Bars) != 0 || e.Max != 0 {
		t.Errorf("no evidence: %+v", e)
	}
}
