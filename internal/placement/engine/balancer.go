package engine

import (
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// BalancerProtocol is the group protocol name of SingleOwnerBalancer.
const BalancerProtocol = "mailplane-single-owner"

// SingleOwnerBalancer is a cooperative group balancer (classic protocol;
// Redpanda has no KIP-848) that gives every partition of every topic to one
// member, so that group membership elects the one active engine and every
// other member is a standby with nothing assigned.
//
// The owner is sticky: a member that owns partitions keeps all of them when
// others join or leave, so a standby (re)joining never moves the engine.
// Ownership claimed in a member's join metadata counts only at the highest
// generation any claimant reports, so a member that was kicked out (and
// missed the generation that handed its partitions on) cannot win them
// back. With no owner (first start, or the owner died or left), the first
// member in the coordinator's order wins.
//
// Being cooperative (KIP-429), a partition never moves straight from one
// member to another within a rebalance: the plan is adjusted so the old
// owner revokes first and the new one is assigned in the follow-up
// rebalance. Joins and leaves of standbys therefore cost the active engine
// nothing: it is never asked to revoke, so its transaction goes on.
type SingleOwnerBalancer struct{}

var _ kgo.GroupBalancer = SingleOwnerBalancer{}

// ProtocolName implements kgo.GroupBalancer.
func (SingleOwnerBalancer) ProtocolName() string { return BalancerProtocol }

// IsCooperative implements kgo.GroupBalancer.
func (SingleOwnerBalancer) IsCooperative() bool { return true }

// JoinGroupMetadata implements kgo.GroupBalancer: the consumer protocol's
// member metadata with the partitions owned and the generation they were
// owned in.
func (SingleOwnerBalancer) JoinGroupMetadata(interests []string, current map[string][]int32, generation int32) []byte {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 3
	meta.Topics = interests
	meta.Generation = generation
	for topic, partitions := range current {
		owned := kmsg.NewConsumerMemberMetadataOwnedPartition()
		owned.Topic = topic
		owned.Partitions = slices.Clone(partitions)
		slices.Sort(owned.Partitions)
		meta.OwnedPartitions = append(meta.OwnedPartitions, owned)
	}
	slices.SortFunc(meta.OwnedPartitions, func(a, b kmsg.ConsumerMemberMetadataOwnedPartition) int {
		switch {
		case a.Topic < b.Topic:
			return -1
		case a.Topic > b.Topic:
			return 1
		}
		return 0
	})
	return meta.AppendTo(nil)
}

// ParseSyncAssignment implements kgo.GroupBalancer.
func (SingleOwnerBalancer) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	return kgo.ParseConsumerSyncAssignment(assignment)
}

// MemberBalancer implements kgo.GroupBalancer.
func (b SingleOwnerBalancer) MemberBalancer(members []kmsg.JoinGroupResponseMember) (kgo.GroupMemberBalancer, map[string]struct{}, error) {
	cb, err := kgo.NewConsumerBalancer(b, members)
	if err != nil {
		return nil, nil, err
	}
	return cb, cb.MemberTopics(), nil
}

// Balance implements kgo.ConsumerBalancerBalance.
func (SingleOwnerBalancer) Balance(b *kgo.ConsumerBalancer, topics map[string]int32) kgo.IntoSyncAssignment {
	owner, meta := singleOwner(b)
	plan := b.NewPlan()
	if owner == nil {
		return plan
	}
	interested := make(map[string]bool, len(meta.Topics))
	for _, t := range meta.Topics {
		interested[t] = true
	}
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	slices.Sort(names)
	for _, t := range names {
		if !interested[t] {
			continue
		}
		ps := make([]int32, topics[t])
		for i := range ps {
			ps[i] = int32(i)
		}
		plan.AddPartitions(owner, t, ps)
	}
	plan.AdjustCooperative(b)
	return plan
}

// singleOwner picks the member to own everything (see SingleOwnerBalancer).
func singleOwner(b *kgo.ConsumerBalancer) (*kmsg.JoinGroupResponseMember, *kmsg.ConsumerMemberMetadata) {
	var (
		first, best         *kmsg.JoinGroupResponseMember
		firstMeta, bestMeta *kmsg.ConsumerMemberMetadata
		bestOwned           int
		topGen              int32 = -1
	)
	owned := func(m *kmsg.ConsumerMemberMetadata) int {
		n := 0
		for _, o := range m.OwnedPartitions {
			n += len(o.Partitions)
		}
		return n
	}
	b.EachMember(func(member *kmsg.JoinGroupResponseMember, meta *kmsg.ConsumerMemberMetadata) {
		if first == nil {
			first, firstMeta = member, meta
		}
		if n := owned(meta); n > 0 && meta.Generation > topGen {
			topGen = meta.Generation
		}
	})
	b.EachMember(func(member *kmsg.JoinGroupResponseMember, meta *kmsg.ConsumerMemberMetadata) {
		if n := owned(meta); n > 0 && meta.Generation == topGen && n > bestOwned {
			best, bestMeta, bestOwned = member, meta, n
		}
	})
	if best != nil {
		return best, bestMeta
	}
	return first, firstMeta
}
