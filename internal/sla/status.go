package sla

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Status is what one process's registry says of one consumer: its lag per
// partition owned there and its latency so far.
type Status struct {
	Consumer   Consumer
	Partitions []PartitionLag // by topic, then partition
	// Applied counts the records whose latency was measured.
	Applied uint64
	// P95 estimates the 95th percentile latency from the histogram's
	// buckets, as Prometheus's histogram_quantile does (0 before any
	// record).
	P95 time.Duration
}

// PartitionLag is one owned partition's lag.
type PartitionLag struct {
	Topic     string
	Partition int32
	Records   int64
	Seconds   float64
}

// Statuses reads the consumers reported on g, in the table's order. It is
// for tests and for pages that show one process's consumers; dashboards
// read the same series from Prometheus.
func Statuses(g prometheus.Gatherer) ([]Status, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, err
	}
	by := map[Name]*Status{}
	get := func(m *dto.Metric) *Status {
		n := Name(label(m, "consumer"))
		if by[n] == nil {
			c, err := Lookup(n)
			if err != nil {
				return nil
			}
			by[n] = &Status{Consumer: c}
		}
		return by[n]
	}
	lags := map[Name]map[topicPartition]*PartitionLag{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			st := get(m)
			if st == nil {
				continue
			}
			switch mf.GetName() {
			case "mailplane_consumer_latency_seconds":
				st.Applied = m.GetHistogram().GetSampleCount()
				st.P95 = quantile(0.95, m.GetHistogram())
			case "mailplane_consumer_lag_records", "mailplane_consumer_lag_seconds":
				p, _ := strconv.ParseInt(label(m, "partition"), 10, 32)
				k := topicPartition{label(m, "topic"), int32(p)}
				if lags[st.Consumer.Name] == nil {
					lags[st.Consumer.Name] = map[topicPartition]*PartitionLag{}
				}
				pl := lags[st.Consumer.Name][k]
				if pl == nil {
					pl = &PartitionLag{Topic: k.topic, Partition: k.partition}
					lags[st.Consumer.Name][k] = pl
				}
				if mf.GetName() == "mailplane_consumer_lag_records" {
					pl.Records = int64(m.GetGauge().GetValue())
				} else {
					pl.Seconds = m.GetGauge().GetValue()
				}
			}
		}
	}
	var out []Status
	for _, c := range consumers {
		st := by[c.Name]
		if st == nil {
			continue
		}
		for _, pl := range lags[c.Name] {
			st.Partitions = append(st.Partitions, *pl)
		}
		slices.SortFunc(st.Partitions, func(a, b PartitionLag) int {
			return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
		})
		out = append(out, *st)
	}
	return out, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// quantile interpolates q within the cumulative buckets of h, linearly, as
// histogram_quantile does; past the last finite bound it returns that
// bound.
func quantile(q float64, h *dto.Histogram) time.Duration {
	total := h.GetSampleCount()
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	lower, below := 0.0, uint64(0)
	for _, b := range h.GetBucket() {
		upper, count := b.GetUpperBound(), b.GetCumulativeCount()
		if float64(count) >= rank && !math.IsInf(upper, 1) {
			in := float64(count - below)
			frac := 1.0
			if in > 0 {
				frac = (rank - float64(below)) / in
			}
			return time.Duration((lower + (upper-lower)*frac) * float64(time.Second))
		}
		lower, below = upper, count
	}
	return time.Duration(lower * float64(time.Second))
}
