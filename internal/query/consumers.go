package query

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/internal/sla"
)

// Consumer is one consumer of the SLA table (internal/sla) with what one
// process can know of it. Two sources, because lag and latency are
// measured where a consumer runs:
//
//   - Positions: a projector's position per partition is in Postgres
//     (projector_offsets), so any process compares it with the partition's
//     end on the broker. Only projectors (registry, health, placement)
//     have one; the engine, the mailbox.state processor and sync keep
//     their offsets in Kafka transactions and groups.
//   - Local: the consumer's own meters, when it runs in this process (dev
//     mode runs them all; an api process none). Seconds of lag and the
//     append-to-effect latency exist only there and in Prometheus.
type Consumer struct {
	Name      string             `json:"name"`
	Tier      string             `json:"tier"`
	Objective ConsumerObjective  `json:"objective"`
	Effect    string             `json:"effect"`
	Positions []ConsumerPosition `json:"positions"`
	Local     *LocalStatus       `json:"local"`
}

// ConsumerObjective is the tier's promise.
type ConsumerObjective struct {
	LatencySeconds float64 `json:"latency_seconds"`
	BehindSeconds  float64 `json:"behind_seconds"`
	BacklogRecords int64   `json:"backlog_records"`
}

// ConsumerPosition is a projector's position on one partition against
// the partition's end (End and Behind are nil when the broker did not
// answer for it).
type ConsumerPosition struct {
	Topic       string    `json:"topic"`
	Partition   int32     `json:"partition"`
	Next        int64     `json:"next"`
	End         *int64    `json:"end"`
	Behind      *int64    `json:"behind"`
	OverBacklog bool      `json:"over_backlog"`
	UpdatedAt   time.Time `json:"updated_at"`
}

// LocalStatus is what this process's meters say of a consumer.
type LocalStatus struct {
	Applied     uint64         `json:"applied"`
	P95Seconds  float64        `json:"p95_seconds"`
	OverLatency bool           `json:"over_latency"`
	Partitions  []LocalLagPart `json:"partitions"`
}

// LocalLagPart is one owned partition's lag as metered here.
type LocalLagPart struct {
	Topic       string  `json:"topic"`
	Partition   int32   `json:"partition"`
	Records     int64   `json:"records"`
	Seconds     float64 `json:"seconds"`
	OverBehind  bool    `json:"over_behind"`
	OverBacklog bool    `json:"over_backlog"`
}

// projectorOf names the projector_offsets rows of a consumer that has
// them.
func projectorOf(n sla.Name) string {
	switch n {
	case sla.Registry, sla.Health:
		return string(n)
	case sla.PlacementProjection:
		return postgres.Name
	}
	return ""
}

// EndLister lists partition ends; *kadm.Client is one.
type EndLister interface {
	ListEndOffsets(ctx context.Context, topics ...string) (kadm.ListedOffsets, error)
}

// ConsumerReader reads the consumers' standing.
type ConsumerReader struct {
	pool     *pgxpool.Pool
	ends     EndLister
	gatherer prometheus.Gatherer
}

// NewConsumerReader reads positions through pool, partition ends through
// ends and this process's meters from g (nil: none).
func NewConsumerReader(pool *pgxpool.Pool, ends EndLister, g prometheus.Gatherer) *ConsumerReader {
	return &ConsumerReader{pool: pool, ends: ends, gatherer: g}
}

// endsTimeout bounds the broker's answer.
const endsTimeout = 5 * time.Second

// Consumers reads every consumer of the table, in its order. A broker
// that does not answer leaves End and Behind nil; Postgres failing is an
// error.
func (c *ConsumerReader) Consumers(ctx context.Context) ([]Consumer, error) {
	pos, err := projections.Positions(ctx, c.pool, "")
	if err != nil {
		return nil, err
	}
	var ends kadm.ListedOffsets
	if c.ends != nil {
		if tps := projections.PositionTopics(pos); len(tps) > 0 {
			lctx, cancel := context.WithTimeout(ctx, endsTimeout)
			ends, _ = c.ends.ListEndOffsets(lctx, tps...) // partial answers are shown as unknown
			cancel()
		}
	}
	local := map[sla.Name]sla.Status{}
	if c.gatherer != nil {
		sts, err := sla.Statuses(c.gatherer)
		if err != nil {
			return nil, fmt.Errorf("query: consumer meters: %w", err)
		}
		for _, st := range sts {
			local[st.Consumer.Name] = st
		}
	}
	var out []Consumer
	for _, sc := range sla.Consumers() {
		obj := sc.Tier.Objective()
		co := Consumer{
			Name: string(sc.Name), Tier: string(sc.Tier), Effect: sc.Effect,
			Objective: ConsumerObjective{LatencySeconds: obj.Latency.Seconds(), BehindSeconds: obj.Behind.Seconds(), BacklogRecords: obj.Backlog},
			Positions: []ConsumerPosition{},
		}
		if proj := projectorOf(sc.Name); proj != "" {
			for _, p := range pos {
				if p.Projector != proj {
					continue
				}
				cp := ConsumerPosition{Topic: p.Topic, Partition: p.Partition, Next: p.Next, UpdatedAt: p.UpdatedAt}
				if o, ok := ends.Lookup(p.Topic, p.Partition); ok && o.Err == nil {
					end, behind := o.Offset, max(0, o.Offset-p.Next)
					cp.End, cp.Behind, cp.OverBacklog = &end, &behind, behind > obj.Backlog
				}
				co.Positions = append(co.Positions, cp)
			}
		}
		if st, ok := local[sc.Name]; ok {
			ls := &LocalStatus{Applied: st.Applied, P95Seconds: st.P95.Seconds(), OverLatency: st.P95 > obj.Latency, Partitions: []LocalLagPart{}}
			for _, pl := range st.Partitions {
				ls.Partitions = append(ls.Partitions, LocalLagPart{Topic: pl.Topic, Partition: pl.Partition, Records: pl.Records, Seconds: pl.Seconds,
					OverBehind: pl.Seconds > obj.Behind.Seconds(), OverBacklog: pl.Records > obj.Backlog})
			}
			co.Local = ls
		}
		out = append(out, co)
	}
	return out, nil
}
