package producer_test

import (
	"context"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/topics"
)

// kadmEnds sums the end offsets of each domain topic.
func kadmEnds(ctx context.Context, kc *kgo.Client) (map[string]int64, error) {
	ends, err := kadm.NewClient(kc).ListEndOffsets(ctx, topics.DomainTopics()...)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	ends.Each(func(o kadm.ListedOffset) { out[o.Topic] += o.Offset })
	return out, nil
}
