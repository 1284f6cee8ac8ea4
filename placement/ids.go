package placement

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/mailplane/mailplane/topics"
)

// DecisionID derives a decision's ce_id from its cause: a UUIDv7 whose
// 48-bit millisecond timestamp is the decision's time (the input's time)
// and whose 74 "random" bits are the leading bits of
// SHA-256(domain separator, cause key, index). The cause key names the input
// uniquely and identically across engines (see causeKey), so re-deciding an
// input after a failover yields the same ids, while two different inputs,
// or two decisions of one input, never share one (up to 2^-74 collisions).
func DecisionID(at time.Time, key string, index int) string {
	h := sha256.New()
	h.Write([]byte("mailplane.placement.decision-id.v1\x00"))
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write(strconv.AppendInt(nil, int64(index), 10))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])

	var u [16]byte
	ms := at.UnixMilli()
	if ms < 0 {
		ms = 0
	}
	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], uint64(ms)&(1<<48-1))
	copy(u[0:6], ts[2:8])
	copy(u[6:16], sum[0:10])
	u[6] = 0x70 | u[6]&0x0f // version 7
	u[8] = 0x80 | u[8]&0x3f // variant 10

	var out [36]byte
	hex.Encode(out[0:8], u[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], u[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], u[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], u[8:10])
	out[23] = '-'
	hex.Encode(out[24:36], u[10:16])
	return string(out[:])
}

// causeKey names an input for DecisionID. An event input is named by its
// position on its domain topic and its event id: the position makes it
// unique even when a producer's retry put the same event id on the log
// twice, and it is the same for every engine that reads the record. A tick
// is named by its time and the id of the last decision in the log before
// it: a tick that decides anything changes that last id, so no two ticks
// whose decisions reach the log share a key.
func causeKey(c topics.Cause, at time.Time, lastDecisionID string) string {
	if c.IsTick() {
		return "tick/" + strconv.FormatInt(at.UnixNano(), 10) + "/" + lastDecisionID
	}
	return "event/" + c.Position() + "/" + c.ID
}
