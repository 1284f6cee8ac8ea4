package sla_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mailplane/mailplane/internal/sla"
	"github.com/mailplane/mailplane/topics"
)

func TestEveryConsumerHasATierWithAnObjective(t *testing.T) {
	t.Parallel()
	names := map[sla.Name]bool{}
	for _, c := range sla.Consumers() {
		if names[c.Name] {
			t.Errorf("%s is declared twice", c.Name)
		}
		names[c.Name] = true
		if !slices.Contains(sla.Tiers(), c.Tier) {
			t.Errorf("%s: tier %q is not one of %v", c.Name, c.Tier, sla.Tiers())
		}
		if len(c.Topics) == 0 || c.Effect == "" {
			t.Errorf("%s: topics %v, effect %q", c.Name, c.Topics, c.Effect)
		}
		for _, tp := range c.Topics {
			if _, ok := topics.Lookup(topics.Config{}, tp); !ok {
				t.Errorf("%s consumes %s, which is not in the catalog", c.Name, tp)
			}
		}
	}
	for _, n := range []sla.Name{sla.SyncActivity, sla.Sync, sla.MailboxState, sla.PlacementEngine, sla.PlacementProjection, sla.Registry, sla.Health} {
		if _, err := sla.Lookup(n); err != nil {
			t.Error(err)
		}
	}
	if _, err := sla.Lookup("nobody"); err == nil {
		t.Error("an unknown consumer was found")
	}
	// Each tier is looser than the one before it, in every objective.
	var prev sla.Objective
	for i, tier := range sla.Tiers() {
		o := tier.Objective()
		if o.Latency <= 0 || o.Behind < o.Latency || o.Backlog <= 0 {
			t.Errorf("%s: objective %+v", tier, o)
		}
		if i > 0 && (o.Latency <= prev.Latency || o.Behind <= prev.Behind || o.Backlog < prev.Backlog) {
			t.Errorf("%s (%+v) is not looser than the tier before (%+v)", tier, o, prev)
		}
		prev = o
	}
}

// The seed's tiers: realtime under 1 s, interactive under 5 s, bulk in
// minutes, background in hours.
func TestTiersAreTheSeeds(t *testing.T) {
	t.Parallel()
	want := map[sla.Tier]time.Duration{sla.Realtime: time.Second, sla.Interactive: 5 * time.Second, sla.Bulk: 5 * time.Minute, sla.Background: time.Hour}
	for tier, lat := range want {
		if got := tier.Objective().Latency; got != lat {
			t.Errorf("%s latency objective %v, want %v", tier, got, lat)
		}
	}
}

// docs/architecture.md lists the table; it must say what the code does.
func TestDocsListTheTable(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	want.WriteString("| consumer | tier | p95 latency | lag (seconds) | lag (records) | effect |\n|---|---|---|---|---|---|\n")
	for _, c := range sla.Consumers() {
		o := c.Tier.Objective()
		want.WriteString("| `" + string(c.Name) + "` | " + string(c.Tier) + " | " + o.Latency.String() + " | " + o.Behind.String() + " | " + formatInt(o.Backlog) + " | " + c.Effect + " |\n")
	}
	if !strings.Contains(string(doc), want.String()) {
		t.Errorf("docs/architecture.md does not hold the consumer table; want:\n%s", want.String())
	}
}

// formatInt writes n with thousands separators, as the docs do.
func formatInt(n int64) string {
	d := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i, c := range d {
		if i > 0 && (len(d)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestMeterLagGrowsWhileAPartitionIsStuck(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ck := &clock{time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	m := sla.NewMeter(reg, sla.Registry, sla.WithClock(ck.now))
	defer m.Close()

	// Partition 0 holds its oldest waiting record, appended 3 s ago;
	// partition 1 is caught up; partition 2 is behind, its oldest record
	// not fetched yet.
	m.Set(topics.MailboxEvents, 0, sla.Position{Next: 10, End: 25, Oldest: ck.t.Add(-3 * time.Second)})
	m.Set(topics.MailboxEvents, 1, sla.Position{Next: 7, End: 7})
	m.Set(topics.MailboxEvents, 2, sla.Position{Next: 0, End: 4})
	ck.t = ck.t.Add(2 * time.Second)

	want := `
# HELP mailplane_consumer_lag_records Records between a consumer's next offset and the partition's end as last fetched, per owned partition.
# TYPE mailplane_consumer_lag_records gauge
mailplane_consumer_lag_records{consumer="registry",partition="0",tier="bulk",topic="mailplane.mailbox.events.v1"} 15
mailplane_consumer_lag_records{consumer="registry",partition="1",tier="bulk",topic="mailplane.mailbox.events.v1"} 0
mailplane_consumer_lag_records{consumer="registry",partition="2",tier="bulk",topic="mailplane.mailbox.events.v1"} 4
# HELP mailplane_consumer_lag_seconds Seconds since the oldest record not yet applied was appended (0 when caught up), per owned partition.
# TYPE mailplane_consumer_lag_seconds gauge
mailplane_consumer_lag_seconds{consumer="registry",partition="0",tier="bulk",topic="mailplane.mailbox.events.v1"} 5
mailplane_consumer_lag_seconds{consumer="registry",partition="1",tier="bulk",topic="mailplane.mailbox.events.v1"} 0
mailplane_consumer_lag_seconds{consumer="registry",partition="2",tier="bulk",topic="mailplane.mailbox.events.v1"} 2
# HELP mailplane_consumer_objective_records The consumer's tier objective for records waiting on a partition.
# TYPE mailplane_consumer_objective_records gauge
mailplane_consumer_objective_records{consumer="registry",tier="bulk"} 1e+06
# HELP mailplane_consumer_objective_seconds The consumer's tier objective: objective="latency_p95" bounds append-to-effect p95, objective="lag" the seconds behind.
# TYPE mailplane_consumer_objective_seconds gauge
mailplane_consumer_objective_seconds{consumer="registry",objective="lag",tier="bulk"} 900
mailplane_consumer_objective_seconds{consumer="registry",objective="latency_p95",tier="bulk"} 300
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"mailplane_consumer_lag_records", "mailplane_consumer_lag_seconds", "mailplane_consumer_objective_records", "mailplane_consumer_objective_seconds"); err != nil {
		t.Fatal(err)
	}

	// Still stuck ten seconds later: the seconds grow with no call.
	ck.t = ck.t.Add(10 * time.Second)
	if got := lagSeconds(t, reg, "0"); got != 15 {
		t.Errorf("partition 0 is %v s behind, want 15", got)
	}
	if got := lagSeconds(t, reg, "2"); got != 12 {
		t.Errorf("partition 2 is %v s behind, want 12", got)
	}
	// Caught up, then revoked: 0, then gone.
	m.Set(topics.MailboxEvents, 0, sla.Position{Next: 25, End: 25})
	if got := lagSeconds(t, reg, "0"); got != 0 {
		t.Errorf("caught up partition is %v s behind", got)
	}
	m.Forget(topics.MailboxEvents, 0)
	if got := testutil.CollectAndCount(reg, "mailplane_consumer_lag_seconds"); got != 2 {
		t.Errorf("%d lag series after a revoke, want 2", got)
	}
	m.ForgetAll()
	if got := testutil.CollectAndCount(reg, "mailplane_consumer_lag_records"); got != 0 {
		t.Errorf("%d lag series after leaving, want 0", got)
	}
}

func lagSeconds(t *testing.T, reg *prometheus.Registry, partition string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "mailplane_consumer_lag_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" && l.GetValue() == partition {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no lag series for partition %s", partition)
	return 0
}

// Two members of one consumer in one process (two sync workers of dev
// mode) own the same partition for a moment during a rebalance: the
// scrape still succeeds and reports the larger lag.
func TestMembersSharingAPartitionReportTheLargerLag(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ck := &clock{time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	a := sla.NewMeter(reg, sla.Sync, sla.WithClock(ck.now))
	b := sla.NewMeter(reg, sla.Sync, sla.WithClock(ck.now))
	a.Set(topics.MailboxState, 3, sla.Position{Next: 5, End: 9, Oldest: ck.t.Add(-time.Second)})
	b.Set(topics.MailboxState, 3, sla.Position{Next: 2, End: 9, Oldest: ck.t.Add(-4 * time.Second)})
	if got := lagSeconds(t, reg, "3"); got != 4 {
		t.Errorf("lag %v s, want the larger, 4", got)
	}
	if n := testutil.CollectAndCount(reg, "mailplane_consumer_objective_seconds"); n != 2 {
		t.Errorf("%d objective series for one consumer, want 2", n)
	}
	b.Close()
	if got := lagSeconds(t, reg, "3"); got != 1 {
		t.Errorf("lag %v s after the second member closed, want 1", got)
	}
	a.Applied(ck.t, ck.t.Add(-1500*time.Millisecond))
	a.Applied(ck.t, ck.t.Add(time.Second)) // appended "after" now: counts as 0
	if n := testutil.CollectAndCount(reg, "mailplane_consumer_latency_seconds"); n != 1 {
		t.Errorf("%d latency series, want 1", n)
	}
}

func TestUnknownConsumerPanics(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Error("a meter for a consumer outside the table was made")
		}
	}()
	sla.NewMeter(prometheus.NewRegistry(), "nobody")
}

func TestStatusesReadWhatMetersReport(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ck := &clock{time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	h := sla.NewMeter(reg, sla.Health, sla.WithClock(ck.now))
	e := sla.NewMeter(reg, sla.PlacementEngine, sla.WithClock(ck.now))
	h.Set(topics.MailboxObservations, 2, sla.Position{Next: 3, End: 10, Oldest: ck.t.Add(-time.Minute)})
	h.Set(topics.MailboxObservations, 1, sla.Position{Next: 4, End: 4})
	// 100 records: 90 at 10 ms, 10 at 3 s: the p95 lies among the slow.
	for i := range 100 {
		d := 10 * time.Millisecond
		if i >= 90 {
			d = 3 * time.Second
		}
		e.Applied(ck.t, ck.t.Add(-d))
	}
	st, err := sla.Statuses(reg)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 || st[0].Consumer.Name != sla.PlacementEngine || st[1].Consumer.Name != sla.Health {
		t.Fatalf("statuses %+v, want the engine then health (the table's order)", st)
	}
	if st[0].Applied != 100 || st[0].P95 < 2*time.Second || st[0].P95 > 4*time.Second {
		t.Errorf("engine: %d applied, p95 %v; want 100 and about 3 s", st[0].Applied, st[0].P95)
	}
	want := []sla.PartitionLag{{topics.MailboxObservations, 1, 0, 0}, {topics.MailboxObservations, 2, 7, 60}}
	if !slices.Equal(st[1].Partitions, want) || st[1].Applied != 0 || st[1].P95 != 0 {
		t.Errorf("health: %+v, want partitions %+v and nothing applied", st[1], want)
	}
}
