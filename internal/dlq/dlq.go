// Package dlq builds and reads dead letters: records a consumer could not
// apply, copied to the DLQ topic with headers naming where they came from and
// why they failed, so that the partition they came from keeps moving.
//
// A dead letter keeps the original key and headers. Its value is the
// original value, except when the value holds (or may hold) a plain-text
// secret: then the value is withheld (empty) and the
// mailplane_dlq_value_withheld header says why, so the DLQ never stores a
// secret that the log refused.
package dlq

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/topics"
)

// Header names of a dead letter. Every one starts with HeaderPrefix.
const (
	HeaderPrefix          = "mailplane_dlq_"
	HeaderSourceTopic     = "mailplane_dlq_source_topic"
	HeaderSourcePartition = "mailplane_dlq_source_partition"
	HeaderSourceOffset    = "mailplane_dlq_source_offset"
	HeaderConsumer        = "mailplane_dlq_consumer"
	HeaderErrorCode       = "mailplane_dlq_error_code"
	HeaderError           = "mailplane_dlq_error"
	HeaderAttempts        = "mailplane_dlq_attempts"
	HeaderValueWithheld   = "mailplane_dlq_value_withheld"
)

// Reasons a value is withheld (values of HeaderValueWithheld).
const (
	// WithheldPlaintextSecret: the consumer found a plain-text secret.
	WithheldPlaintextSecret = string(domain.CodePlaintextSecret)
	// WithheldPossibleSecret: the record failed for another reason, but
	// its value looks like it may carry a secret, so it is not copied.
	WithheldPossibleSecret = "possible_secret"
)

// MaxErrorLen bounds the error header: a dead letter says why, it does not
// carry a stack of wrapped messages.
const MaxErrorLen = 1024

// Failure says why a record became a dead letter.
type Failure struct {
	// Consumer names the consumer that gave up (a projector's name).
	Consumer string
	// Code is the stable error code.
	Code domain.Code
	// Err is the human-readable error.
	Err string
	// Attempts is how many times the consumer tried to apply the record.
	Attempts int
}

// NewRecord returns the dead letter of src for the DLQ topic of namespace
// ns, the namespace src was read in.
func NewRecord(ns topics.Namespace, src *kgo.Record, f Failure) *kgo.Record {
	withheld := ""
	switch {
	case f.Code == domain.CodePlaintextSecret:
		withheld = WithheldPlaintextSecret
	case MayHoldSecret(src.Value):
		withheld = WithheldPossibleSecret
	}
	hs := make([]kgo.RecordHeader, 0, 8+len(src.Headers))
	add := func(k, v string) { hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	add(HeaderSourceTopic, src.Topic)
	add(HeaderSourcePartition, strconv.FormatInt(int64(src.Partition), 10))
	add(HeaderSourceOffset, strconv.FormatInt(src.Offset, 10))
	add(HeaderConsumer, f.Consumer)
	add(HeaderErrorCode, string(f.Code))
	add(HeaderError, truncate(f.Err, MaxErrorLen))
	add(HeaderAttempts, strconv.Itoa(f.Attempts))
	if withheld != "" {
		add(HeaderValueWithheld, withheld)
	}
	for _, h := range src.Headers {
		// A record redriven from the DLQ and failing again gets fresh
		// dead-letter headers, not two sets.
		if strings.HasPrefix(h.Key, HeaderPrefix) {
			continue
		}
		hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: bytes.Clone(h.Value)})
	}
	var value []byte
	if withheld == "" {
		value = bytes.Clone(src.Value)
	}
	return &kgo.Record{
		Topic:   ns.Topic(topics.DLQ),
		Key:     bytes.Clone(src.Key),
		Value:   value,
		Headers: hs,
	}
}

// secretKeys are JSON object keys whose values are secrets. Matching is
// case-insensitive because encoding/json matches field names that way: a
// "Credentials" key would decode into MailboxAdded.Credentials.
var secretKeys = []string{"credentials", "password", "oauth_refresh_token", "refresh_token", "access_token", "secret"}

// secretWords are looked for in values that are not JSON at all.
var secretWords = [][]byte{[]byte("credential"), []byte("password"), []byte("token"), []byte("secret")}

// MayHoldSecret reports whether value may carry a plain-text secret: a JSON
// value with a non-null secret-named key at any depth, or a non-JSON value
// mentioning one. It errs on the side of withholding.
func MayHoldSecret(value []byte) bool {
	if len(value) == 0 {
		return false
	}
	var v any
	if err := json.Unmarshal(value, &v); err != nil {
		lower := bytes.ToLower(value)
		for _, w := range secretWords {
			if bytes.Contains(lower, w) {
				return true
			}
		}
		return false
	}
	return holdsSecret(v)
}

func holdsSecret(v any) bool {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if x == nil {
				continue
			}
			for _, s := range secretKeys {
				if strings.EqualFold(k, s) {
					return true
				}
			}
			if holdsSecret(x) {
				return true
			}
		}
	case []any:
		for _, x := range v {
			if holdsSecret(x) {
				return true
			}
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// Entry is a dead letter as read back from the DLQ topic.
type Entry struct {
	// Partition, Offset and Time locate the dead letter in the DLQ topic;
	// Time is when it was written.
	Partition int32
	Offset    int64
	Time      time.Time

	SourceTopic     string
	SourcePartition int32
	SourceOffset    int64
	Consumer        string
	ErrorCode       domain.Code
	Error           string
	Attempts        int
	// ValueWithheld is empty when Value is the original value, else the
	// reason it was withheld (Value is then empty).
	ValueWithheld string

	Key   []byte
	Value []byte
	// Headers are the original record's headers (ce_* and the like),
	// without the dead-letter headers.
	Headers []kgo.RecordHeader
}

// Parse reads a dead letter. It is lenient: a missing or malformed
// dead-letter header leaves its field zero (a record written by another
// tool still lists).
func Parse(r *kgo.Record) Entry {
	e := Entry{
		Partition: r.Partition, Offset: r.Offset, Time: r.Timestamp,
		Key: r.Key, Value: r.Value,
	}
	for _, h := range r.Headers {
		v := string(h.Value)
		switch h.Key {
		case HeaderSourceTopic:
			e.SourceTopic = v
		case HeaderSourcePartition:
			p, _ := strconv.ParseInt(v, 10, 32)
			e.SourcePartition = int32(p)
		case HeaderSourceOffset:
			e.SourceOffset, _ = strconv.ParseInt(v, 10, 64)
		case HeaderConsumer:
			e.Consumer = v
		case HeaderErrorCode:
			e.ErrorCode = domain.Code(v)
		case HeaderError:
			e.Error = v
		case HeaderAttempts:
			e.Attempts, _ = strconv.Atoi(v)
		case HeaderValueWithheld:
			e.ValueWithheld = v
		default:
			if !strings.HasPrefix(h.Key, HeaderPrefix) {
				e.Headers = append(e.Headers, h)
			}
		}
	}
	return e
}

// Header returns the value of the original record's header key.
func (e Entry) Header(key string) (string, bool) {
	for _, h := range e.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// DefaultListTimeout bounds List when ctx has no deadline.
const DefaultListTimeout = 30 * time.Second

// List reads the DLQ topic up to its current end, without joining a group,
// and returns its dead letters oldest first: all of them when limit <= 0,
// else the newest limit. It stops at the end offsets it saw when it started,
// so a DLQ being written to does not keep it reading. When ctx has no
// deadline, DefaultListTimeout applies.
func List(ctx context.Context, cfg kafka.Config, limit int) ([]Entry, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultListTimeout)
		defer cancel()
	}
	// read_committed, so dead letters of aborted transactions (the
	// placement engine writes them inside its transactions) are not shown;
	// up to the last stable offset, what read_committed can reach.
	spec := kafka.ReadSpec{
		Topics:   []string{cfg.Topic(topics.DLQ)},
		ClientID: "dlq-list",
		From: func(_ kafka.Partition, b kafka.Bounds) (int64, error) {
			if limit > 0 && b.End-int64(limit) > b.Start {
				// No partition contributes more than limit entries to the
				// newest limit overall.
				return b.End - int64(limit), nil
			}
			return b.Start, nil
		},
	}
	var out []Entry
	if _, err := kafka.ReadToEnd(ctx, cfg, spec, func(r *kgo.Record) error {
		out = append(out, Parse(r))
		return nil
	}); err != nil {
		return nil, fmt.Errorf("dlq: %w", err)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if !a.Time.Equal(b.Time) {
			return a.Time.Before(b.Time)
		}
		if a.Partition != b.Partition {
			return a.Partition < b.Partition
		}
		return a.Offset < b.Offset
	})
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}

// Format writes entries as a table for operators: where each dead letter
// came from, which consumer gave up, why, whether its value was kept, and
// whether it was redriven (redrives, from Redrives; nil: unknown, "?").
func Format(w io.Writer, entries []Entry, redrives map[Location]Redriven) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DLQ OFFSET\tTIME\tSOURCE\tKEY\tCONSUMER\tCODE\tATTEMPTS\tVALUE\tREDRIVEN\tERROR")
	for _, e := range entries {
		value := fmt.Sprintf("%d bytes", len(e.Value))
		if e.ValueWithheld != "" {
			value = "withheld (" + e.ValueWithheld + ")"
		}
		redriven := "?"
		if redrives != nil {
			redriven = "no"
			if r, ok := redrives[e.location()]; ok {
				redriven = "pending " + r.RequestedAt.UTC().Format(time.RFC3339)
				if r.Done {
					redriven = fmt.Sprintf("yes @%d %s", r.Offset, r.RequestedAt.UTC().Format(time.RFC3339))
				}
			}
		}
		fmt.Fprintf(tw, "%d/%d\t%s\t%s[%d]@%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n",
			e.Partition, e.Offset,
			e.Time.UTC().Format(time.RFC3339),
			e.SourceTopic, e.SourcePartition, e.SourceOffset,
			Printable(string(e.Key), 40),
			e.Consumer, e.ErrorCode, e.Attempts, value, redriven,
			Printable(e.Error, 120))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("dlq: write table: %w", err)
	}
	return nil
}

// Printable keeps a table cell on one line and bounded to n runes.
func Printable(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' || !strconv.IsPrint(r) {
			return ' '
		}
		return r
	}, s)
	if utf8.RuneCountInString(s) > n {
		rs := []rune(s)
		s = string(rs[:n-1]) + "…"
	}
	if s == "" {
		return "-"
	}
	return s
}
