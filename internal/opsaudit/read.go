package opsaudit

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/topics"
)

// Record is an operator audit record as read back: its data, its
// ce_source and where it is on the log.
type Record struct {
	domain.OpsAction
	Source    string
	Partition int32
	Offset    int64
}

// readTimeout bounds Recent.
const readTimeout = 15 * time.Second

// Recent returns at most the limit newest operator audit records on cfg's
// brokers, newest first: the last limit of each partition, merged by
// time. A record that does not decode is skipped (another writer's): the
// audit is read by humans, who must still see the rest.
func Recent(ctx context.Context, cfg kafka.Config, limit int) ([]Record, error) {
	var out []Record
	_, err := kafka.ReadToEnd(ctx, cfg, kafka.ReadSpec{
		Topics:   []string{cfg.Topic(topics.OpsAudit)},
		ClientID: "ops-audit-read",
		Timeout:  readTimeout,
		From: func(_ kafka.Partition, b kafka.Bounds) (int64, error) {
			return max(b.Start, b.End-int64(limit)), nil
		},
	}, func(r *kgo.Record) error {
		if t, _ := topics.Header(r, topics.HeaderType); t != domain.TypeOpsAction {
			return nil
		}
		var a domain.OpsAction
		if json.Unmarshal(r.Value, &a) != nil || len(a.Validate()) > 0 {
			return nil
		}
		src, _ := topics.Header(r, topics.HeaderSource)
		out = append(out, Record{OpsAction: a, Source: src, Partition: r.Partition, Offset: r.Offset})
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(out, func(a, b Record) int {
		if c := b.At.Compare(a.At); c != 0 {
			return c
		}
		return cmp.Compare(b.Offset, a.Offset)
	})
	return out[:min(len(out), limit)], nil
}
