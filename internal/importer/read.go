// Package importer streams a customer's fleet of mailboxes (JSON lines or
// CSV, with credentials) to a running mailplane's ingest API as
// mailbox.added events, in batches, with bounded concurrency, and accounts
// for every row: accepted, refused (line, field, stable code) or not
// delivered. The API does the validation and sealing, as for any producer;
// rows are only read here (docs/architecture.md §4 and §9;
// docs/producers.md, "Importing a fleet").
package importer

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/mailplane/mailplane/domain"
)

// Format is an input format.
type Format string

// Input formats.
const (
	// JSONL is one JSON object a line: a mailbox.added CloudEvent
	// (structured mode, it has "specversion") sent as it is, or a plain
	// mailbox object (the event's data) wrapped in one.
	JSONL Format = "jsonl"
	// CSV has a header naming its columns (Columns).
	CSV Format = "csv"
)

// MaxRowBytes bounds one input row: a longer one is refused (too_large)
// without being kept.
const MaxRowBytes = 64 << 10

// Columns are the CSV columns, each the mailbox.added data field it fills
// (imap_host is imap.host, password is credentials.password). Only
// mailbox_id is required in the header; empty cells are left out of the
// data.
var Columns = []string{
	"mailbox_id", "org_id", "user_id", "address", "provider", "warmup_enabled",
	"imap_host", "imap_port", "imap_tls", "imap_username", "password", "oauth_refresh_token",
}

// row is one input row on its way: the CloudEvent to send, or why it is
// refused before sending.
type row struct {
	line    int
	id      string
	event   []byte // a structured CloudEvent, JSON
	refusal *Problem
}

// Problem is one problem of a row: the input line, the event id (when
// one was made), the field (CloudEvent paths, data fields under "data.")
// and its stable code. Messages never carry credentials.
type Problem struct {
	Line    int         `json:"line"`
	ID      string      `json:"id,omitempty"`
	Field   string      `json:"field,omitempty"`
	Code    domain.Code `json:"code"`
	Message string      `json:"message"`
}

func refused(line int, field string, code domain.Code, msg string) row {
	return row{line: line, refusal: &Problem{Line: line, Field: field, Code: code, Message: msg}}
}

// reader turns input rows into rows to send. Event ids of plain rows are
// derived from their content without the credentials (eventID), so a
// re-run of the same input sends the same ids.
type reader struct {
	source string
	seed   string
	read   func() (row, bool, error)
	bytes  atomic.Int64 // input bytes read so far (read by Run's progress)
}

func newReader(r io.Reader, f Format, source, seed string) (*reader, error) {
	rd := &reader{source: source, seed: seed}
	cr := &countingReader{r: r, n: &rd.bytes}
	switch f {
	case JSONL:
		rd.read = rd.jsonl(bufio.NewReaderSize(cr, 64<<10))
	case CSV:
		read, err := rd.csv(cr)
		if err != nil {
			return nil, err
		}
		rd.read = read
	default:
		return nil, fmt.Errorf("unknown input format %q (jsonl or csv)", f)
	}
	return rd, nil
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// jsonl reads one line at a time; a line over MaxRowBytes is skipped to
// its end and refused. Blank lines are skipped.
func (rd *reader) jsonl(br *bufio.Reader) func() (row, bool, error) {
	line := 0
	return func() (row, bool, error) {
		for {
			b, err := br.ReadSlice('\n')
			line++
			if errors.Is(err, bufio.ErrBufferFull) || (len(b) > MaxRowBytes) {
				for errors.Is(err, bufio.ErrBufferFull) {
					_, err = br.ReadSlice('\n')
				}
				if err != nil && !errors.Is(err, io.EOF) {
					return row{}, false, err
				}
				return refused(line, "", domain.CodeTooLarge, fmt.Sprintf("the row is longer than %d bytes", MaxRowBytes)), true, nil
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return row{}, false, err
			}
			if t := bytes.TrimSpace(b); len(t) > 0 {
				// ReadSlice's bytes are the reader's: the row gets a copy.
				return rd.jsonRow(line, slices.Clone(t)), true, nil
			}
			if err != nil { // io.EOF
				return row{}, false, nil
			}
		}
	}
}

// jsonRow makes the event of one JSON line.
func (rd *reader) jsonRow(line int, b []byte) row {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		// encoding/json's messages quote the input: not repeated here.
		return refused(line, "", domain.CodeMalformedJSON, "the line is not a JSON object")
	}
	if _, ok := top["specversion"]; !ok {
		return rd.plainRow(line, b, top)
	}
	// A CloudEvent: sent as it is; its id is its own.
	var typ, id string
	_ = json.Unmarshal(top["type"], &typ)
	_ = json.Unmarshal(top["id"], &id)
	if t, ok := domain.ResolveType(typ); !ok || t != domain.TypeMailboxAdded {
		return refused(line, "type", domain.CodeInvalid, "mailplane import sends mailbox.added events only")
	}
	return row{line: line, id: id, event: b}
}

// plainRow wraps a mailbox object (mailbox.added data) in a CloudEvent.
// The data is sent as read, so the API sees exactly the producer's bytes
// (a repeated or unknown field is refused there, as from any producer).
func (rd *reader) plainRow(line int, data []byte, top map[string]json.RawMessage) row {
	id := rd.eventID(top)
	var ev bytes.Buffer
	ev.Grow(len(data) + 192)
	ev.WriteString(`{"specversion":"1.0","id":`)
	writeJSONString(&ev, id)
	ev.WriteString(`,"type":"` + domain.TypeMailboxAdded + `","source":`)
	writeJSONString(&ev, rd.source)
	ev.WriteString(`,"data":`)
	ev.Write(data)
	ev.WriteByte('}')
	return row{line: line, id: id, event: ev.Bytes()}
}

func writeJSONString(b *bytes.Buffer, s string) {
	q, _ := json.Marshal(s) // a string always marshals
	b.Write(q)
}

// eventID derives a plain row's event id from the source, the seed and
// the row's members but credentials (compacted, in name order): the same
// row sends the same id on every run, so the fleet's projections apply it
// once however often the import is re-run. Credentials are left out so no
// digest of a password reaches the log; rows that differ only in
// credentials therefore share an id (a later one is refused as a
// duplicate), and re-sending changed credentials takes another seed.
func (rd *reader) eventID(top map[string]json.RawMessage) string {
	h := sha256.New()
	h.Write([]byte("mailplane-import\x00" + rd.source + "\x00" + rd.seed + "\x00"))
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range top {
			if k != "credentials" && !yield(k) {
				return
			}
		}
	}) {
		var c bytes.Buffer
		if json.Compact(&c, top[k]) != nil {
			c.Write(top[k])
		}
		fmt.Fprintf(h, "%q:%d:", k, c.Len())
		h.Write(c.Bytes())
	}
	return "imp-" + hex.EncodeToString(h.Sum(nil)[:16])
}

// csv reads the header, then one record at a time.
func (rd *reader) csv(r io.Reader) (func() (row, bool, error), error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the CSV input is empty: it needs a header line naming its columns")
		}
		return nil, fmt.Errorf("the CSV header: %w", err)
	}
	cols := make([]string, len(header))
	for i, h := range header {
		h = strings.ToLower(strings.TrimSpace(strings.TrimPrefix(h, "\ufeff")))
		if !slices.Contains(Columns, h) {
			return nil, fmt.Errorf("the CSV header names an unknown column %q; the columns are %s", h, strings.Join(Columns, ", "))
		}
		if slices.Contains(cols[:i], h) {
			return nil, fmt.Errorf("the CSV header names column %q twice", h)
		}
		cols[i] = h
	}
	if !slices.Contains(cols, "mailbox_id") {
		return nil, errors.New("the CSV header must name the mailbox_id column")
	}
	return func() (row, bool, error) {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return row{}, false, nil
		}
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			if errors.Is(pe.Err, csv.ErrFieldCount) {
				return refused(pe.StartLine, "", domain.CodeInvalid, fmt.Sprintf("the row has %d fields, the header %d", len(rec), len(cols))), true, nil
			}
			return refused(pe.StartLine, "", domain.CodeInvalid, "malformed CSV: "+pe.Err.Error()), true, nil
		}
		if err != nil {
			return row{}, false, err
		}
		line, _ := cr.FieldPos(0)
		return rd.csvRow(line, cols, rec), true, nil
	}, nil
}

// csvRow makes the event of one CSV record.
func (rd *reader) csvRow(line int, cols, rec []string) row {
	size := 0
	for _, c := range rec {
		size += len(c)
	}
	if size > MaxRowBytes {
		return refused(line, "", domain.CodeTooLarge, fmt.Sprintf("the row is longer than %d bytes", MaxRowBytes))
	}
	data := map[string]any{}
	imap := map[string]any{}
	creds := map[string]any{}
	for i, col := range cols {
		v := rec[i]
		if v == "" {
			continue
		}
		switch col {
		case "warmup_enabled":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return refused(line, "data.warmup_enabled", domain.CodeInvalidType, "must be true or false")
			}
			data[col] = b
		case "imap_port":
			n, err := strconv.Atoi(v)
			if err != nil {
				return refused(line, "data.imap.port", domain.CodeInvalidType, "must be an integer")
			}
			imap["port"] = n
		case "imap_host", "imap_tls", "imap_username":
			imap[strings.TrimPrefix(col, "imap_")] = v
		case "password", "oauth_refresh_token":
			creds[col] = v
		default:
			data[col] = v
		}
	}
	if len(imap) > 0 {
		data["imap"] = imap
	}
	b, err := json.Marshal(data)
	if err != nil {
		return refused(line, "", domain.CodeInvalid, "the row cannot be encoded")
	}
	top := map[string]json.RawMessage{}
	_ = json.Unmarshal(b, &top) // for the id, which leaves credentials out
	if len(creds) > 0 {
		data["credentials"] = creds
		if b, err = json.Marshal(data); err != nil {
			return refused(line, "", domain.CodeInvalid, "the row cannot be encoded")
		}
	}
	return rd.plainRow(line, b, top)
}
