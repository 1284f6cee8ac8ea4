package projections

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The registry COPYs its rows in PostgreSQL's binary COPY format, written
// here from the rows' Go values rather than through pgx's general encoder,
// which looks up an encode plan for every value and costs several times
// more: the registry's rows are few Go types, each for one column type.

// colType is a column's type, as the registry's migrations declare it.
type colType uint8

const (
	colUUID        colType = iota // pgtype.UUID
	colText                       // string
	colBool                       // bool
	colInt4                       // int32
	colInt8                       // int64
	colFloat8                     // float64
	colTimestamptz                // time.Time
	colJSONB                      // []byte holding JSON
)

var (
	mailboxTypes = []colType{
		colUUID, colUUID, colUUID, colText, colText, colBool,
		colText, colInt4, colText, colText, colJSONB,
		colText, colFloat8, colText, colTimestamptz,
		colTimestamptz, colText, colTimestamptz, colTimestamptz, colUUID,
	}
	orgTypes    = []colType{colUUID, colText, colInt4, colBool, colText, colTimestamptz}
	userTypes   = []colType{colUUID, colTimestamptz, colText}
	workerTypes = []colType{
		colUUID, colText, colText, colText, colBool, colTimestamptz,
		colInt8, colInt8, colInt8, colInt8, colTimestamptz,
	}
)

// copySQL is the COPY statement for columns of table.
func copySQL(table string, columns []string) string {
	quoted := make([]string, len(columns))
	for i, c := range columns {
		quoted[i] = pgx.Identifier{c}.Sanitize()
	}
	return fmt.Sprintf("COPY %s (%s) FROM STDIN (FORMAT binary)", pgx.Identifier{table}.Sanitize(), strings.Join(quoted, ", "))
}

// copyRows COPYs rows, whose values have the Go types of types, with sql
// (from copySQL).
func copyRows(ctx context.Context, tx pgx.Tx, sql string, types []colType, rows [][]any) error {
	buf, err := encodeCopy(types, rows)
	if err != nil {
		return err
	}
	_, err = tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(buf), sql)
	return err
}

const (
	// Microseconds from the Unix epoch to PostgreSQL's, 2000-01-01 UTC.
	microsecFromUnixEpochToY2K = 946_684_800 * 1_000_000
)

// encodeCopy renders rows as binary COPY data.
func encodeCopy(types []colType, rows [][]any) ([]byte, error) {
	size := 19 + 2
	for _, row := range rows {
		size += 2 + 4*len(row) + 16*len(row)
	}
	b := make([]byte, 0, size)
	b = append(b, "PGCOPY\n\377\r\n\000"...)
	b = binary.BigEndian.AppendUint32(b, 0) // flags
	b = binary.BigEndian.AppendUint32(b, 0) // header extension
	for _, row := range rows {
		if len(row) != len(types) {
			return nil, fmt.Errorf("registry: copy: %d values for %d columns", len(row), len(types))
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(row)))
		for i, v := range row {
			if v == nil {
				b = binary.BigEndian.AppendUint32(b, math.MaxUint32) // -1: NULL
				continue
			}
			ok := false
			switch types[i] {
			case colUUID:
				var u pgtype.UUID
				if u, ok = v.(pgtype.UUID); ok {
					if !u.Valid {
						b = binary.BigEndian.AppendUint32(b, math.MaxUint32)
						continue
					}
					b = binary.BigEndian.AppendUint32(b, 16)
					b = append(b, u.Bytes[:]...)
				}
			case colText:
				var s string
				if s, ok = v.(string); ok {
					b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
					b = append(b, s...)
				}
			case colBool:
				var x bool
				if x, ok = v.(bool); ok {
					b = binary.BigEndian.AppendUint32(b, 1)
					if x {
						b = append(b, 1)
					} else {
						b = append(b, 0)
					}
				}
			case colInt4:
				var n int32
				if n, ok = v.(int32); ok {
					b = binary.BigEndian.AppendUint32(b, 4)
					b = binary.BigEndian.AppendUint32(b, uint32(n))
				}
			case colInt8:
				var n int64
				if n, ok = v.(int64); ok {
					b = binary.BigEndian.AppendUint32(b, 8)
					b = binary.BigEndian.AppendUint64(b, uint64(n))
				}
			case colFloat8:
				var f float64
				if f, ok = v.(float64); ok {
					b = binary.BigEndian.AppendUint32(b, 8)
					b = binary.BigEndian.AppendUint64(b, math.Float64bits(f))
				}
			case colTimestamptz:
				var t time.Time
				if t, ok = v.(time.Time); ok {
					// As pgx encodes it: truncated to the microsecond.
					us := t.Unix()*1_000_000 + int64(t.Nanosecond())/1000 - microsecFromUnixEpochToY2K
					b = binary.BigEndian.AppendUint32(b, 8)
					b = binary.BigEndian.AppendUint64(b, uint64(us))
				}
			case colJSONB:
				var j []byte
				if j, ok = v.([]byte); ok {
					b = binary.BigEndian.AppendUint32(b, uint32(1+len(j)))
					b = append(b, 1) // jsonb binary format version
					b = append(b, j...)
				}
			}
			if !ok {
				return nil, fmt.Errorf("registry: copy: column %d: unexpected %T", i, v)
			}
		}
	}
	b = binary.BigEndian.AppendUint16(b, math.MaxUint16) // -1: end of data
	return b, nil
}
