package engine

import (
	"strconv"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

// DecisionID derives a decision's ce_id from its cause: a UUIDv7 whose
// 48-bit millisecond timestamp is the decision's time (the input's time)
// and whose 74 "random" bits are the leading bits of
// SHA-256(domain separator, cause key, index). The cause key names the input
// uniquely and identically across engines (see CauseKey), so re-deciding an
// input after a failover yields the same ids, while two different inputs,
// or two decisions of one input, never share one (up to 2^-74 collisions).
func DecisionID(at time.Time, key string, index int) string {
	return domain.DerivedID(at, "mailplane.placement.decision-id.v1", key, strconv.Itoa(index))
}

// CauseKey names an input for DecisionID. An event input is named by its
// position on its domain topic and its event id: the position makes it
// unique even when a producer's retry put the same event id on the log
// twice, and it is the same for every engine that reads the record. A tick
// is named by its time and the id of the last decision in the log before
// it: a tick that decides anything changes that last id, so no two ticks
// whose decisions reach the log share a key.
func CauseKey(c topics.Cause, at time.Time, lastDecisionID string) string {
	if c.IsTick() {
		return "tick/" + strconv.FormatInt(at.UnixNano(), 10) + "/" + lastDecisionID
	}
	return "event/" + c.Position() + "/" + c.ID
}
