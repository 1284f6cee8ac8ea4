package sla

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/internal/promreg"
)

// Position is where a consumer member stands on one partition it owns.
type Position struct {
	// Next is the offset of the first record not yet applied.
	Next int64
	// End is the partition's end as the member last fetched it (its high
	// watermark, or last stable offset when reading committed).
	End int64
	// Oldest is the append time of the record at Next when the member
	// holds it (fetched, not yet applied); zero when it does not.
	Oldest time.Time
}

// Behind reports whether records wait on the partition.
func (p Position) Behind() bool { return p.Next >= 0 && p.End > p.Next }

// Meter measures one consumer member. It is safe for concurrent use. The
// lag gauges are computed when scraped, so a partition that stops moving
// shows its seconds behind growing.
type Meter struct {
	c       Consumer
	now     func() time.Time
	latency prometheus.Observer
	col     *collector

	mu    sync.Mutex
	parts map[topicPartition]*part
}

type topicPartition struct {
	topic     string
	partition int32
}

type part struct {
	pos Position
	// behindSince is when the member first saw the partition behind
	// without holding the oldest record: the seconds behind then count
	// from it (a lower bound).
	behindSince time.Time
}

// MeterOption configures a Meter.
type MeterOption func(*Meter)

// WithClock sets the clock lag and latency are measured with.
func WithClock(now func() time.Time) MeterOption { return func(m *Meter) { m.now = now } }

// NewMeter returns the meter of one member of consumer n, reporting on
// reg. Members of one process share the series: two members owning the
// same partition for a moment (a rebalance) report the larger lag. n must
// be in the table; an unknown name is a programming error and panics.
func NewMeter(reg prometheus.Registerer, n Name, opts ...MeterOption) *Meter {
	c, err := Lookup(n)
	if err != nil {
		panic(err)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Meter{c: c, now: time.Now, parts: map[topicPartition]*part{}}
	for _, o := range opts {
		o(m)
	}
	vec := promreg.MustRegister(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "mailplane_consumer_latency_seconds",
		Help:    "Time from a record's append to the broker to its effect (per consumer: sla.Consumer.Effect), by consumer and tier.",
		Buckets: prometheus.ExponentialBucketsRange(0.001, 7200, 24),
	}, []string{"consumer", "tier"}))
	m.latency = vec.WithLabelValues(string(c.Name), string(c.Tier))
	m.col = promreg.MustRegister(reg, newCollector())
	m.col.add(m)
	return m
}

// Consumer returns the member's table entry.
func (m *Meter) Consumer() Consumer { return m.c }

// Set records the member's position on a partition it owns.
func (m *Meter) Set(topic string, partition int32, pos Position) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	k := topicPartition{topic, partition}
	p := m.parts[k]
	if p == nil {
		p = &part{}
		m.parts[k] = p
	}
	p.pos = pos
	switch {
	case !pos.Behind():
		p.behindSince = time.Time{}
	case p.behindSince.IsZero():
		p.behindSince = now
	}
}

// Forget drops a partition the member no longer owns.
func (m *Meter) Forget(topic string, partition int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.parts, topicPartition{topic, partition})
}

// ForgetAll drops every partition (the member left its group).
func (m *Meter) ForgetAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.parts)
}

// Applied observes the latency of a record appended at appended whose
// effect happened at now.
func (m *Meter) Applied(now, appended time.Time) {
	m.latency.Observe(max(0, now.Sub(appended).Seconds()))
}

// Close stops reporting the member.
func (m *Meter) Close() { m.col.remove(m) }

// sample is one partition's lag at a scrape.
type sample struct {
	records int64
	seconds float64
}

func (m *Meter) samples(into map[lagKey]sample) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, p := range m.parts {
		var s sample
		if p.pos.Behind() {
			s.records = p.pos.End - p.pos.Next
			since := p.behindSince
			if !p.pos.Oldest.IsZero() {
				since = p.pos.Oldest
			}
			s.seconds = max(0, now.Sub(since).Seconds())
		}
		key := lagKey{m.c.Name, k}
		if old, ok := into[key]; ok {
			s.records, s.seconds = max(s.records, old.records), max(s.seconds, old.seconds)
		}
		into[key] = s
	}
}

type lagKey struct {
	consumer Name
	tp       topicPartition
}

// collector reports every meter of one registry: the lag of each owned
// partition and the objectives of each consumer running there.
type collector struct {
	lagRecords, lagSeconds, objSeconds, objRecords *prometheus.Desc

	mu     sync.Mutex
	meters map[*Meter]struct{}
}

func newCollector() *collector {
	part := []string{"consumer", "tier", "topic", "partition"}
	return &collector{
		lagRecords: prometheus.NewDesc("mailplane_consumer_lag_records",
			"Records between a consumer's next offset and the partition's end as last fetched, per owned partition.", part, nil),
		lagSeconds: prometheus.NewDesc("mailplane_consumer_lag_seconds",
			"Seconds since the oldest record not yet applied was appended (0 when caught up), per owned partition.", part, nil),
		objSeconds: prometheus.NewDesc("mailplane_consumer_objective_seconds",
			`The consumer's tier objective: objective="latency_p95" bounds append-to-effect p95, objective="lag" the seconds behind.`,
			[]string{"consumer", "tier", "objective"}, nil),
		objRecords: prometheus.NewDesc("mailplane_consumer_objective_records",
			"The consumer's tier objective for records waiting on a partition.", []string{"consumer", "tier"}, nil),
		meters: map[*Meter]struct{}{},
	}
}

func (c *collector) add(m *Meter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.meters[m] = struct{}{}
}

func (c *collector) remove(m *Meter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.meters, m)
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lagRecords
	ch <- c.lagSeconds
	ch <- c.objSeconds
	ch <- c.objRecords
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	meters := make([]*Meter, 0, len(c.meters))
	for m := range c.meters {
		meters = append(meters, m)
	}
	c.mu.Unlock()
	lags := map[lagKey]sample{}
	running := map[Name]Consumer{}
	for _, m := range meters {
		m.samples(lags)
		running[m.c.Name] = m.c
	}
	tiers := func(n Name) string { return string(running[n].Tier) }
	for k, s := range lags {
		labels := []string{string(k.consumer), tiers(k.consumer), k.tp.topic, strconv.Itoa(int(k.tp.partition))}
		ch <- prometheus.MustNewConstMetric(c.lagRecords, prometheus.GaugeValue, float64(s.records), labels...)
		ch <- prometheus.MustNewConstMetric(c.lagSeconds, prometheus.GaugeValue, s.seconds, labels...)
	}
	for n, cons := range running {
		o := cons.Tier.Objective()
		ch <- prometheus.MustNewConstMetric(c.objSeconds, prometheus.GaugeValue, o.Latency.Seconds(), string(n), string(cons.Tier), "latency_p95")
		ch <- prometheus.MustNewConstMetric(c.objSeconds, prometheus.GaugeValue, o.Behind.Seconds(), string(n), string(cons.Tier), "lag")
		ch <- prometheus.MustNewConstMetric(c.objRecords, prometheus.GaugeValue, float64(o.Backlog), string(n), string(cons.Tier))
	}
}
