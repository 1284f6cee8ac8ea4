package projections

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailplane/mailplane/domain"
)

// The registry COPYs its rows in PostgreSQL's binary COPY format, written
// here straight from the row changes, column by column, rather than through
// pgx's general encoder (which boxes every value and looks up an encode
// plan for it, several times the cost): the registry's columns are few
// types, each written by one of the append functions below.

// copySQL is the COPY statement for columns of table.
func copySQL(table string, columns []string) string {
	quoted := make([]string, len(columns))
	for i, c := range columns {
		quoted[i] = pgx.Identifier{c}.Sanitize()
	}
	return fmt.Sprintf("COPY %s (%s) FROM STDIN (FORMAT binary)", pgx.Identifier{table}.Sanitize(), strings.Join(quoted, ", "))
}

// copyHeader starts binary COPY data: signature, flags, header extension.
const copyHeader = "PGCOPY\n\377\r\n\000" + "\000\000\000\000" + "\000\000\000\000"

// tuples is the binary COPY data of a table's rows, each keyed by a UUID,
// in the order they were added.
type tuples struct {
	buf  []byte // copyHeader, then the tuples
	ends []int  // ends[i] is where tuple i ends in buf
	keys [][16]byte
	// ended: buf holds the end-of-data marker after the last tuple.
	ended bool
}

func newTuples(n, rowSize int) *tuples {
	buf := make([]byte, 0, len(copyHeader)+n*rowSize+2)
	return &tuples{buf: append(buf, copyHeader...), ends: make([]int, 0, n), keys: make([][16]byte, 0, n)}
}

func (t *tuples) len() int { return len(t.keys) }

// row starts a tuple of n columns keyed by key, which it writes as the
// first column; the caller appends the other n-1 to t.buf, then calls done.
func (t *tuples) row(key [16]byte, n int) {
	t.buf = binary.BigEndian.AppendUint16(t.buf, uint16(n))
	t.buf = appendUUID(t.buf, key)
	t.keys = append(t.keys, key)
}

func (t *tuples) done() { t.ends = append(t.ends, len(t.buf)) }

// data returns the COPY data of the tuples pick selects, or of all of them
// when pick is nil: then it ends t's buffer, which no row is added to
// afterwards, and returns it.
func (t *tuples) data(pick func(i int) bool) []byte {
	if pick == nil {
		if !t.ended {
			t.buf = binary.BigEndian.AppendUint16(t.buf, math.MaxUint16) // -1: end of data
			t.ended = true
		}
		return t.buf
	}
	out := make([]byte, 0, len(t.buf)+2)
	out = append(out, copyHeader...)
	start := len(copyHeader)
	for i, end := range t.ends {
		if pick(i) {
			out = append(out, t.buf[start:end]...)
		}
		start = end
	}
	return binary.BigEndian.AppendUint16(out, math.MaxUint16)
}

// copyData runs sql (from copySQL, perhaps after other statements) with
// data as its input.
func copyData(ctx context.Context, tx pgx.Tx, sql string, data []byte) error {
	_, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(data), sql)
	return err
}

// Column values, each a length (-1 for NULL) and the value in PostgreSQL's
// binary send format.

func appendNull(b []byte) []byte { return binary.BigEndian.AppendUint32(b, math.MaxUint32) }

func appendUUID(b []byte, u [16]byte) []byte {
	b = binary.BigEndian.AppendUint32(b, 16)
	return append(b, u[:]...)
}

func appendText(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

func appendBool(b []byte, x bool) []byte {
	b = binary.BigEndian.AppendUint32(b, 1)
	if x {
		return append(b, 1)
	}
	return append(b, 0)
}

func appendInt4(b []byte, n int32) []byte {
	b = binary.BigEndian.AppendUint32(b, 4)
	return binary.BigEndian.AppendUint32(b, uint32(n))
}

func appendInt8(b []byte, n int64) []byte {
	b = binary.BigEndian.AppendUint32(b, 8)
	return binary.BigEndian.AppendUint64(b, uint64(n))
}

func appendFloat8(b []byte, f float64) []byte {
	b = binary.BigEndian.AppendUint32(b, 8)
	return binary.BigEndian.AppendUint64(b, math.Float64bits(f))
}

// Microseconds from the Unix epoch to PostgreSQL's, 2000-01-01 UTC.
const microsecFromUnixEpochToY2K = 946_684_800 * 1_000_000

// appendTimestamptz writes t truncated to the microsecond, as pgx does.
func appendTimestamptz(b []byte, t time.Time) []byte {
	us := t.Unix()*1_000_000 + int64(t.Nanosecond())/1000 - microsecFromUnixEpochToY2K
	b = binary.BigEndian.AppendUint32(b, 8)
	return binary.BigEndian.AppendUint64(b, uint64(us))
}

// appendJSONB writes JSON text as jsonb.
func appendJSONB(b []byte, j []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(1+len(j)))
	b = append(b, 1) // jsonb binary format version
	return append(b, j...)
}

// appendSealedJSONB writes json.Marshal(s) as jsonb, byte for byte, written
// directly when no field needs escaping (Validate allows only such fields),
// which it does for every mailbox row.
func appendSealedJSONB(b []byte, s *domain.SealedSecret) ([]byte, error) {
	if !plainJSON(s.KeyID) || !plainJSON(s.Alg) || !plainJSON(s.Nonce) || !plainJSON(s.Ciphertext) {
		j, err := json.Marshal(s)
		if err != nil {
			return nil, err
		}
		return appendJSONB(b, j), nil
	}
	n := len(`{"key_id":"","alg":"","nonce":"","ciphertext":""}`) + len(s.KeyID) + len(s.Alg) + len(s.Nonce) + len(s.Ciphertext)
	b = binary.BigEndian.AppendUint32(b, uint32(1+n))
	b = append(b, 1)
	b = append(b, `{"key_id":"`...)
	b = append(b, s.KeyID...)
	b = append(b, `","alg":"`...)
	b = append(b, s.Alg...)
	b = append(b, `","nonce":"`...)
	b = append(b, s.Nonce...)
	b = append(b, `","ciphertext":"`...)
	b = append(b, s.Ciphertext...)
	b = append(b, `"}`...)
	return b, nil
}

// plainJSON reports whether encoding/json writes s between quotes as it is.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// appendHealthEvidence writes the evidence of the health decision h as
// jsonb: NULL without a decision, or for one without evidence (the merge
// then clears the stored evidence with the rest of the health group).
func appendHealthEvidence(b []byte, h *domain.MailboxHealthScored) ([]byte, error) {
	if h == nil || h.Evidence == nil {
		return appendNull(b), nil
	}
	j, err := json.Marshal(h.Evidence)
	if err != nil {
		return nil, fmt.Errorf("registry: marshal health evidence: %w", err)
	}
	return appendJSONB(b, j), nil
}
