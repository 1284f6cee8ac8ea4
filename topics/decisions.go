package topics

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
)

// Decision-log records are CloudEvents in Kafka binary mode, like domain
// events: the value is the decision's JSON, ce_* headers carry the
// attributes (ce_time is the decision's time, ce_subject and the key its
// aggregate id), and five extension attributes say which input caused the
// decision, so that any reader can tell every input's decisions apart:
//
//	ce_causeid        the input event's ce_id; for a tick, "tick"
//	ce_causetype      the input event's ce_type; for a tick, "tick"
//	ce_causeposition  where the input was read, "topic/partition/offset"
//	                  (absent for a tick)
//	ce_causeindex     the decision's index among its input's decisions (0-based)
//	ce_causecount     how many decisions the input made
//
// Every header value is a pure function of the decision and its cause, so
// the engine re-deciding an input from the same state writes byte-identical
// records (key, value, headers and timestamp, which is the decision's time).
const (
	HeaderCauseID       = "ce_causeid"
	HeaderCauseType     = "ce_causetype"
	HeaderCausePosition = "ce_causeposition"
	HeaderCauseIndex    = "ce_causeindex"
	HeaderCauseCount    = "ce_causecount"
)

// CauseTick is the cause id and type of decisions made by a tick.
const CauseTick = "tick"

// Cause is the input a decision was made on.
type Cause struct {
	// ID is the input event's id, or CauseTick.
	ID string
	// Type is the input event's type, or CauseTick.
	Type string
	// Topic, Partition and Offset locate the input on its domain topic;
	// Topic is empty for a tick.
	Topic     string
	Partition int32
	Offset    int64
	// Index is the decision's index among the input's decisions, Count
	// their number.
	Index int
	Count int
}

// IsTick reports whether the cause is a tick.
func (c Cause) IsTick() bool { return c.Type == CauseTick }

// Position renders the input's position as "topic/partition/offset", or
// "" for a tick.
func (c Cause) Position() string {
	if c.Topic == "" {
		return ""
	}
	return c.Topic + "/" + strconv.FormatInt(int64(c.Partition), 10) + "/" + strconv.FormatInt(c.Offset, 10)
}

// Decision is one record of the decision log.
type Decision struct {
	ID     string // UUIDv7, derived from the cause (see package placement)
	Source string // ce_source
	Data   domain.PlacementDecision
	Cause  Cause
}

// Time is the decision's time (ce_time).
func (d Decision) Time() time.Time { return d.Data.Meta().At }

// EncodeDecision renders a decision as a binary-mode record on the decision
// log (its catalog name: a producer in a namespace sets the record's Topic).
// It refuses a decision that does not validate.
func EncodeDecision(d Decision) (*kgo.Record, error) {
	if d.Data == nil {
		return nil, domain.Errorf(domain.CodeRequired, "decision has no data")
	}
	if !domain.IsUUIDv7(d.ID) {
		return nil, domain.Errorf(domain.CodeInvalid, "decision id %q is not a lower-case UUIDv7", d.ID)
	}
	if ps := d.Data.Validate(); len(ps) > 0 {
		return nil, ps.Err()
	}
	if err := d.Cause.check(); err != nil {
		return nil, err
	}
	at := d.Data.Meta().At.UTC()
	r, err := EncodeTo(PlacementDecisions, domain.Event{
		ID: d.ID, Type: d.Data.EventType(), Source: d.Source, Time: at,
		Subject: d.Data.AggregateID(), Data: d.Data,
	})
	if err != nil {
		return nil, err
	}
	r.Timestamp = at
	r.Headers = append(r.Headers,
		kgo.RecordHeader{Key: HeaderCauseID, Value: []byte(d.Cause.ID)},
		kgo.RecordHeader{Key: HeaderCauseType, Value: []byte(d.Cause.Type)},
	)
	if pos := d.Cause.Position(); pos != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderCausePosition, Value: []byte(pos)})
	}
	r.Headers = append(r.Headers,
		kgo.RecordHeader{Key: HeaderCauseIndex, Value: strconv.AppendInt(nil, int64(d.Cause.Index), 10)},
		kgo.RecordHeader{Key: HeaderCauseCount, Value: strconv.AppendInt(nil, int64(d.Cause.Count), 10)},
	)
	return r, nil
}

func (c Cause) check() error {
	switch {
	case c.ID == "" || c.Type == "":
		return domain.Errorf(domain.CodeRequired, "decision cause needs an id and a type")
	case c.IsTick() != (c.ID == CauseTick):
		return domain.Errorf(domain.CodeInvalid, "a tick cause has id and type %q", CauseTick)
	case !c.IsTick() && (c.Topic == "" || c.Partition < 0 || c.Offset < 0):
		return domain.Errorf(domain.CodeInvalid, "an event cause needs its position")
	case c.IsTick() && c.Topic != "":
		return domain.Errorf(domain.CodeInvalid, "a tick cause has no position")
	case c.Count < 1 || c.Index < 0 || c.Index >= c.Count:
		return domain.Errorf(domain.CodeInvalid, "decision index %d of %d", c.Index, c.Count)
	}
	return nil
}

// DecodeDecision reads a decision from a decision-log record. Missing or
// malformed headers, unknown types, bad JSON, an invalid decision, and a
// key or ce_time that disagree with the decision are errors with a code.
// Unknown fields are tolerated (a newer engine may add some).
func DecodeDecision(r *kgo.Record) (Decision, error) {
	var ps domain.Problems
	get := func(key string, required bool) string {
		v, ok := Header(r, key)
		if !ok && required {
			ps.Add(key, domain.CodeMissingHeader, "header %s is missing", key)
		}
		return v
	}
	spec := get(HeaderSpecVersion, true)
	id := get(HeaderID, true)
	typ := get(HeaderType, true)
	source := get(HeaderSource, true)
	ts := get(HeaderTime, true)
	subject := get(HeaderSubject, false)
	ct := get(HeaderContentType, false)
	causeID := get(HeaderCauseID, true)
	causeType := get(HeaderCauseType, true)
	pos := get(HeaderCausePosition, false)
	idx := get(HeaderCauseIndex, true)
	count := get(HeaderCauseCount, true)
	if len(ps) > 0 {
		return Decision{}, ps.Err()
	}
	if spec != domain.SpecVersion {
		ps.Add(HeaderSpecVersion, domain.CodeMalformedHeader, "unsupported specversion %q", spec)
	}
	if ct != "" && ct != ContentTypeJSON {
		ps.Add(HeaderContentType, domain.CodeMalformedHeader, "content-type must be %s", ContentTypeJSON)
	}
	if !domain.IsUUIDv7(id) {
		ps.Add(HeaderID, domain.CodeMalformedHeader, "ce_id is not a lower-case UUIDv7")
	}
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		ps.Add(HeaderTime, domain.CodeMalformedHeader, "ce_time is not RFC 3339")
	}
	c := Cause{ID: causeID, Type: causeType, Partition: -1, Offset: -1}
	if c.Index, err = strconv.Atoi(idx); err != nil {
		ps.Add(HeaderCauseIndex, domain.CodeMalformedHeader, "ce_causeindex is not an integer")
	}
	if c.Count, err = strconv.Atoi(count); err != nil {
		ps.Add(HeaderCauseCount, domain.CodeMalformedHeader, "ce_causecount is not an integer")
	}
	if pos != "" {
		if c.Topic, c.Partition, c.Offset, err = parsePosition(pos); err != nil {
			ps.Add(HeaderCausePosition, domain.CodeMalformedHeader, "%v", err)
		}
	} else if !c.IsTick() {
		ps.Add(HeaderCausePosition, domain.CodeMissingHeader, "header %s is missing", HeaderCausePosition)
	}
	if len(ps) > 0 {
		return Decision{}, ps.Err()
	}
	if c.IsTick() {
		c.Partition, c.Offset = 0, 0
	}
	if err := c.check(); err != nil {
		return Decision{}, err
	}
	data, err := domain.DecodePlacementDecision(typ, r.Value)
	if err != nil {
		return Decision{}, err
	}
	switch {
	case string(r.Key) != data.AggregateID():
		return Decision{}, domain.Errorf(domain.CodeKeyMismatch, "record key %q is not the aggregate id %q", r.Key, data.AggregateID())
	case subject != "" && subject != data.AggregateID():
		return Decision{}, domain.Errorf(domain.CodeKeyMismatch, "ce_subject %q is not the aggregate id %q", subject, data.AggregateID())
	case !t.Equal(data.Meta().At):
		return Decision{}, domain.Errorf(domain.CodeMalformedHeader, "ce_time %s is not the decision's time %s", ts, data.Meta().At.Format(time.RFC3339Nano))
	}
	return Decision{ID: id, Source: source, Data: data, Cause: c}, nil
}

// parsePosition parses "topic/partition/offset". Topic names cannot hold a
// slash, so the last two slashes separate the numbers.
func parsePosition(s string) (string, int32, int64, error) {
	i := strings.LastIndexByte(s, '/')
	if i <= 0 {
		return "", 0, 0, fmt.Errorf("ce_causeposition %q is not topic/partition/offset", s)
	}
	j := strings.LastIndexByte(s[:i], '/')
	if j <= 0 {
		return "", 0, 0, fmt.Errorf("ce_causeposition %q is not topic/partition/offset", s)
	}
	p, err1 := strconv.ParseInt(s[j+1:i], 10, 32)
	o, err2 := strconv.ParseInt(s[i+1:], 10, 64)
	if err1 != nil || err2 != nil || p < 0 || o < 0 {
		return "", 0, 0, fmt.Errorf("ce_causeposition %q is not topic/partition/offset", s)
	}
	return s[:j], int32(p), o, nil
}
