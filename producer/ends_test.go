package producer_test

import (
	"context"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/topics"
)

// eventTopics are the topics domain events go to: the domain topics and
// the observations topic (warmup_observed), which is not one of them.
func eventTopics() []string {
	ts := topics.DomainTopics()
	if !slices.Contains(ts, topics.MailboxObservations) {
		ts = append(ts, topics.MailboxObservations)
	}
	return ts
}

// kadmEnds sums the end offsets of each topic domain events go to, in
// namespace ns; a topic the broker does not know is an error, not zero.
func kadmEnds(ctx context.Context, kc *kgo.Client, ns topics.Namespace) (map[string]int64, error) {
	ends, err := kadm.NewClient(kc).ListEndOffsets(ctx, ns.Topics(eventTopics()...)...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	ends.Each(func(o kadm.ListedOffset) { out[o.Topic] += o.Offset })
	return out, nil
}
