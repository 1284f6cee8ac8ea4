package engine

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

type testMember struct {
	id    string
	owned map[string][]int32
	gen   int32
}

// balance runs SingleOwnerBalancer as a group leader would and returns each
// member's assignment.
func balance(t *testing.T, topics map[string]int32, members ...testMember) map[string]map[string][]int32 {
	t.Helper()
	b := SingleOwnerBalancer{}
	var interests []string
	for tp := range topics {
		interests = append(interests, tp)
	}
	var jm []kmsg.JoinGroupResponseMember
	for _, m := range members {
		j := kmsg.NewJoinGroupResponseMember()
		j.MemberID = m.id
		j.ProtocolMetadata = b.JoinGroupMetadata(interests, m.owned, m.gen)
		jm = append(jm, j)
	}
	mb, _, err := b.MemberBalancer(jm)
	if err != nil {
		t.Fatal(err)
	}
	into, err := mb.(kgo.GroupMemberBalancerOrError).BalanceOrError(topics)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]int32{}
	for _, a := range into.IntoSyncAssignment() {
		got, err := b.ParseSyncAssignment(a.MemberAssignment)
		if err != nil {
			t.Fatal(err)
		}
		out[a.MemberID] = got
	}
	return out
}

func partitions(a map[string][]int32) int {
	n := 0
	for _, ps := range a {
		n += len(ps)
	}
	return n
}

func TestSingleOwnerBalancer(t *testing.T) {
	t.Parallel()
	tps := map[string]int32{"x": 4, "y": 2}
	all := map[string][]int32{"x": {0, 1, 2, 3}, "y": {0, 1}}

	t.Run("no owner: the first member takes everything", func(t *testing.T) {
		got := balance(t, tps, testMember{id: "m1"}, testMember{id: "m2"}, testMember{id: "m3"})
		if partitions(got["m1"]) != 6 || partitions(got["m2"]) != 0 || partitions(got["m3"]) != 0 {
			t.Fatalf("assignment %v", got)
		}
	})
	t.Run("the owner keeps everything when others join", func(t *testing.T) {
		got := balance(t, tps, testMember{id: "m1"}, testMember{id: "m2", owned: all, gen: 7}, testMember{id: "m3"})
		if partitions(got["m2"]) != 6 || partitions(got["m1"]) != 0 || partitions(got["m3"]) != 0 {
			t.Fatalf("assignment %v", got)
		}
	})
	t.Run("a stale claim loses to the current generation", func(t *testing.T) {
		got := balance(t, tps, testMember{id: "m1", owned: all, gen: 3}, testMember{id: "m2", owned: all, gen: 5})
		if partitions(got["m2"]) != 6 || partitions(got["m1"]) != 0 {
			t.Fatalf("assignment %v", got)
		}
	})
	t.Run("new partitions go to the owner", func(t *testing.T) {
		got := balance(t, map[string]int32{"x": 4, "y": 3}, testMember{id: "m1"}, testMember{id: "m2", owned: all, gen: 2})
		if partitions(got["m2"]) != 7 {
			t.Fatalf("assignment %v", got)
		}
	})
	t.Run("protocol", func(t *testing.T) {
		b := SingleOwnerBalancer{}
		if !b.IsCooperative() || b.ProtocolName() != BalancerProtocol {
			t.Fatal("the balancer must be cooperative with its own protocol name")
		}
		var _ kgo.GroupBalancer = b
	})
}
