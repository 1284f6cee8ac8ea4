package topics

import (
	"context"
	"fmt"
	"sort"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Drift is one difference between the catalog and the cluster.
type Drift struct {
	Topic  string
	Field  string
	Want   string
	Actual string
}

func (d Drift) String() string {
	return fmt.Sprintf("%s: %s is %s, catalog says %s", d.Topic, d.Field, d.Actual, d.Want)
}

// Report is what Apply did and found.
type Report struct {
	Created []string
	OK      []string
	Drift   []Drift
}

// Err returns an error when the cluster drifts from the catalog.
func (r Report) Err() error {
	if len(r.Drift) == 0 {
		return nil
	}
	return fmt.Errorf("%d topic setting(s) drift from the catalog (first: %s)", len(r.Drift), r.Drift[0])
}

// Apply creates missing topics and reports drift in existing ones. It never
// alters an existing topic: changing partitions or cleanup of a live topic
// is an operator's decision. It is idempotent.
func Apply(ctx context.Context, kc *kgo.Client, specs []Spec) (Report, error) {
	var rep Report
	adm := kadm.NewClient(kc)
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	details, err := describeTopics(ctx, kc, names)
	if err != nil {
		return rep, fmt.Errorf("list topics: %w", err)
	}
	var existing []string
	for _, s := range specs {
		if _, ok := details[s.Name]; ok {
			existing = append(existing, s.Name)
			continue
		}
		configs := map[string]*string{}
		for k, v := range s.Configs() {
			configs[k] = &v
		}
		resp, err := adm.CreateTopic(ctx, s.Partitions, -1, configs, s.Name)
		if err != nil {
			return rep, fmt.Errorf("create topic %s: %w", s.Name, err)
		}
		if resp.Err != nil {
			return rep, fmt.Errorf("create topic %s: %w", s.Name, resp.Err)
		}
		rep.Created = append(rep.Created, s.Name)
	}
	if len(existing) == 0 {
		return rep, nil
	}
	cfgs, err := adm.DescribeTopicConfigs(ctx, existing...)
	if err != nil {
		return rep, fmt.Errorf("describe topic configs: %w", err)
	}
	byName := map[string]kadm.ResourceConfig{}
	for _, rc := range cfgs {
		byName[rc.Name] = rc
	}
	for _, s := range specs {
		n, ok := details[s.Name]
		if !ok {
			continue
		}
		before := len(rep.Drift)
		if n != s.Partitions {
			rep.Drift = append(rep.Drift, Drift{s.Name, "partitions", fmt.Sprint(s.Partitions), fmt.Sprint(n)})
		}
		rc := byName[s.Name]
		if rc.Err != nil {
			return rep, fmt.Errorf("describe configs of %s: %w", s.Name, rc.Err)
		}
		want := s.Configs()
		keys := make([]string, 0, len(want))
		for k := range want {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			actual := "(unset)"
			for _, c := range rc.Configs {
				if c.Key == k {
					actual = c.MaybeValue()
				}
			}
			if actual != want[k] {
				rep.Drift = append(rep.Drift, Drift{s.Name, k, want[k], actual})
			}
		}
		if len(rep.Drift) == before {
			rep.OK = append(rep.OK, s.Name)
		}
	}
	return rep, nil
}

// describeTopics returns the partition counts of the named topics that
// exist. It asks the broker directly: kadm's cached metadata can still say
// "unknown topic" for seconds after a create.
func describeTopics(ctx context.Context, kc *kgo.Client, names []string) (map[string]int32, error) {
	req := kmsg.NewPtrMetadataRequest()
	for _, n := range names {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(n)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, kc)
	if err != nil {
		return nil, err
	}
	out := map[string]int32{}
	for _, t := range resp.Topics {
		if t.Topic == nil || t.ErrorCode != 0 {
			continue
		}
		out[*t.Topic] = int32(len(t.Partitions))
	}
	return out, nil
}
