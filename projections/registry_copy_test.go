package projections

import (
	"context"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/mailplane/mailplane/pgtest"
)

// TestEncodeCopyIsPgxCopy COPYs the same rows with encodeCopy and with
// pgx's CopyFrom, into one table each, and finds the same values.
func TestEncodeCopyIsPgxCopy(t *testing.T) {
	pool := pgtest.Schema(t)
	ctx := context.Background()
	const cols = `(k int4, u uuid, s text, b bool, i4 integer, i8 bigint, f float8, ts timestamptz, j jsonb)`
	if _, err := pool.Exec(ctx, `CREATE TABLE enc_ours `+cols+`; CREATE TABLE enc_pgx `+cols); err != nil {
		t.Fatal(err)
	}
	columns := []string{"k", "u", "s", "b", "i4", "i8", "f", "ts", "j"}
	types := []colType{colInt4, colUUID, colText, colBool, colInt4, colInt8, colFloat8, colTimestamptz, colJSONB}
	rows := [][]any{
		{int32(1), pgtype.UUID{Bytes: [16]byte{1, 2, 3, 15: 0xff}, Valid: true}, "héllo \"q\"", true, int32(math.MinInt32), int64(math.MaxInt64), 12.5,
			time.Date(2024, 7, 12, 7, 0, 0, 123456789, time.FixedZone("x", 3600)), []byte(`{"a": [1, "b"]}`)},
		{int32(2), nil, "", false, int32(-1), int64(math.MinInt64), math.Inf(-1),
			time.Date(1969, 12, 31, 23, 59, 59, 999999999, time.UTC), []byte(`"s"`)},
		{int32(3), pgtype.UUID{}, nil, nil, nil, nil, nil, nil, nil},
		{int32(4), nil, "x", nil, int32(0), int64(0), math.Copysign(0, -1), time.Date(1, 1, 1, 0, 0, 0, 1000, time.UTC), []byte(`null`)},
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := copyRows(ctx, tx, copySQL("enc_ours", columns), types, rows); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"enc_pgx"}, columns, pgx.CopyFromRows(rows)); err != nil {
		t.Fatal(err)
	}
	read := func(table string) [][]any {
		rs, err := tx.Query(ctx, `SELECT k, u, s, b, i4, i8, f, ts, j::text FROM `+table+` ORDER BY k`)
		if err != nil {
			t.Fatal(err)
		}
		var out [][]any
		for rs.Next() {
			v, err := rs.Values()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, v)
		}
		if rs.Err() != nil {
			t.Fatal(rs.Err())
		}
		return out
	}
	ours, theirs := read("enc_ours"), read("enc_pgx")
	if len(ours) != len(rows) || !reflect.DeepEqual(ours, theirs) {
		t.Fatalf("encodeCopy wrote\n%v\npgx\n%v", ours, theirs)
	}
	// A value of the wrong Go type is refused before anything is sent.
	if _, err := encodeCopy([]colType{colInt4}, [][]any{{int64(1)}}); err == nil {
		t.Error("int64 for an int4 column was encoded")
	}
}
