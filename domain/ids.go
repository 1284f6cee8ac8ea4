package domain

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"sync"
	"time"
)

// DerivedID derives a deterministic event id: a UUIDv7 whose 48-bit
// millisecond timestamp is at and whose 74 "random" bits are the leading
// bits of SHA-256(separator, 0, parts joined by 0). The same inputs give the
// same id in every process and every replay, so an event decided again (a
// failover, a rebuild, a restart) is recognised by every consumer that
// dedupes by event id; different inputs collide with probability 2^-74.
// separator names the derivation (e.g. "mailplane.placement.decision-id.v1")
// so two derivations never share ids.
func DerivedID(at time.Time, separator string, parts ...string) string {
	h := sha256.New()
	h.Write([]byte(separator))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])

	var u [16]byte
	ms := max(at.UnixMilli(), 0)
	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], uint64(ms)&(1<<48-1))
	copy(u[0:6], ts[2:8])
	copy(u[6:16], sum[0:10])
	u[6] = 0x70 | u[6]&0x0f // version 7
	u[8] = 0x80 | u[8]&0x3f // variant 10

	return FormatUUID(u)
}

// NewEventID returns a fresh event id: a UUIDv7 (RFC 9562) from the wall
// clock and crypto/rand. Ids from one process increase with time; within
// one millisecond the 12 bits after the timestamp count up (method 3 of
// RFC 9562 section 6.2), so ids minted in a burst keep their order.
func NewEventID() string {
	var u [16]byte
	if _, err := rand.Read(u[6:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	idClock.Lock()
	ms := time.Now().UnixMilli()
	if ms > idClock.ms {
		idClock.ms, idClock.seq = ms, 0
	} else {
		// Same millisecond (or the clock stepped back): keep counting
		// from the last id's time so order holds.
		idClock.seq++
		if idClock.seq > 0xfff {
			idClock.ms, idClock.seq = idClock.ms+1, 0
		}
		ms = idClock.ms
	}
	seq := idClock.seq
	idClock.Unlock()
	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], uint64(ms)&(1<<48-1))
	copy(u[0:6], ts[2:8])
	u[6] = 0x70 | byte(seq>>8)&0x0f // version 7, counter high bits
	u[7] = byte(seq)
	u[8] = 0x80 | u[8]&0x3f // variant 10
	return FormatUUID(u)
}

var idClock struct {
	sync.Mutex
	ms  int64
	seq uint16
}

// FormatUUID renders a UUID's 16 bytes in the canonical lower-case
// 8-4-4-4-12 form.
func FormatUUID(u [16]byte) string {
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

// MaxEventID bounds an event id a producer sends, in characters.
const MaxEventID = 256

// EventKey is the identity of the event with source and id for
// deduplication: a UUIDv7. CloudEvents identify an event by source and id
// together, and let id be any string. When id is a canonical lower-case
// UUIDv7 (mailplane's own) it is the key itself; any other id (the SDKs'
// UUIDv4s, a producer's order number) gets a UUIDv7 derived from SHA-256
// of source and id with a zero timestamp (DerivedID), the same in every
// process and every replay. Keys stay UUIDv7s, so every record that names
// an event by key (mailbox.state's source_event_id, the decision log's
// ce_causeid) keeps its released schema. The producer's id stays on the
// event's own record (ce_id).
func EventKey(source, id string) string {
	if IsUUIDv7(id) {
		return id
	}
	return DerivedID(time.UnixMilli(0), "mailplane.event-key.v1", source, id)
}

// Key is EventKey of the event: what consumers deduplicate it by.
func (e Event) Key() string { return EventKey(e.Source, e.ID) }
