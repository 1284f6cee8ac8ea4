package mailboxstate

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/sla"
)

// fetched hands the meter the partitions of a poll: their records are
// held, not applied until the transaction commits. It returns each
// partition's end as fetched.
func (p *Processor) fetched(fs kgo.Fetches) map[int32]int64 {
	ends := map[int32]int64{}
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		if len(fp.Records) == 0 {
			return
		}
		end := kafka.FetchEnd(fp)
		ends[fp.Partition] = end
		p.meter.Set(fp.Topic, fp.Partition, sla.Position{Next: fp.Records[0].Offset, End: end, Oldest: fp.Records[0].Timestamp})
	})
	return ends
}

// applied measures a committed batch: each record's latency to its state
// record, and each partition caught up to after its last record.
func (p *Processor) applied(recs []*kgo.Record, ends map[int32]int64) {
	now := time.Now()
	next := map[int32]int64{}
	for _, r := range recs {
		p.meter.Applied(now, r.Timestamp)
		next[r.Partition] = max(next[r.Partition], r.Offset+1)
	}
	for part, n := range next {
		p.meter.Set(recs[0].Topic, part, sla.Position{Next: n, End: max(ends[part], n)})
	}
}

// forget drops revoked or lost partitions from the meter.
func (p *Processor) forget(m map[string][]int32) {
	for t, parts := range m {
		for _, part := range parts {
			p.meter.Forget(t, part)
		}
	}
}
