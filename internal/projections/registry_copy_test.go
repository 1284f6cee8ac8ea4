package projections

import (
	"context"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/mailplane/mailplane/internal/pgtest"
)

// TestEncodeCopyIsPgxCopy COPYs the same rows with the append functions
// and with pgx's CopyFrom, into one table each, and finds the same values.
// It also COPYs a selection of the rows.
func TestEncodeCopyIsPgxCopy(t *testing.T) {
	t.Parallel()
	pool := pgtest.Schema(t)
	ctx := context.Background()
	const cols = `(k uuid, s text, b bool, i4 integer, i8 bigint, f float8, ts timestamptz, j jsonb)`
	if _, err := pool.Exec(ctx, `CREATE TABLE enc_ours `+cols+`; CREATE TABLE enc_pgx `+cols+`; CREATE TABLE enc_some `+cols); err != nil {
		t.Fatal(err)
	}
	columns := []string{"k", "s", "b", "i4", "i8", "f", "ts", "j"}
	key := func(n byte) pgtype.UUID { return pgtype.UUID{Bytes: [16]byte{n, 2, 3, 15: 0xff}, Valid: true} }
	rows := [][]any{
		{key(1), "héllo \"q\"", true, int32(math.MinInt32), int64(math.MaxInt64), 12.5,
			time.Date(2024, 7, 12, 7, 0, 0, 123456789, time.FixedZone("x", 3600)), []byte(`{"a": [1, "b"]}`)},
		{key(2), "", false, int32(-1), int64(math.MinInt64), math.Inf(-1),
			time.Date(1969, 12, 31, 23, 59, 59, 999999999, time.UTC), []byte(`"s"`)},
		{key(3), nil, nil, nil, nil, nil, nil, nil},
		{key(4), "x", nil, int32(0), int64(0), math.Copysign(0, -1), time.Date(1, 1, 1, 0, 0, 0, 1000, time.UTC), []byte(`null`)},
	}
	tup := newTuples(0, 0)
	for _, row := range rows {
		tup.row(row[0].(pgtype.UUID).Bytes, len(row))
		b := tup.buf
		for _, v := range row[1:] {
			switch v := v.(type) {
			case nil:
				b = appendNull(b)
			case string:
				b = appendText(b, v)
			case bool:
				b = appendBool(b, v)
			case int32:
				b = appendInt4(b, v)
			case int64:
				b = appendInt8(b, v)
			case float64:
				b = appendFloat8(b, v)
			case time.Time:
				b = appendTimestamptz(b, v)
			case []byte:
				b = appendJSONB(b, v)
			default:
				t.Fatalf("no append function for %T", v)
			}
		}
		tup.buf = b
		tup.done()
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := copyData(ctx, tx, copySQL("enc_some", columns), tup.data(func(i int) bool { return i%2 == 1 })); err != nil {
		t.Fatal(err)
	}
	if err := copyData(ctx, tx, copySQL("enc_ours", columns), tup.data(nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"enc_pgx"}, columns, pgx.CopyFromRows(rows)); err != nil {
		t.Fatal(err)
	}
	read := func(table string) [][]any {
		rs, err := tx.Query(ctx, `SELECT k, s, b, i4, i8, f, ts, j::text FROM `+table+` ORDER BY k`)
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
		t.Fatalf("the append functions wrote\n%v\npgx\n%v", ours, theirs)
	}
	if some := read("enc_some"); !reflect.DeepEqual(some, [][]any{theirs[1], theirs[3]}) {
		t.Fatalf("a selection wrote\n%v\nwant rows 1 and 3 of\n%v", some, theirs)
	}
}
