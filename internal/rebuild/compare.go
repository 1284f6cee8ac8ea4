package rebuild

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Table is one table that defines a projection: moved by a swap, compared
// row for row by a verify.
type Table struct {
	Name string
	// Key and Skip leave rows out of the comparison: a row whose Key
	// columns match on both sides and for which the SQL predicate Skip
	// (over the live row l and the rebuilt row r) holds is counted in
	// TableReport.Skipped instead, for SkipWhy.
	Key     []string
	Skip    string
	SkipWhy string
}

// TableReport is one table's comparison.
type TableReport struct {
	Table string `json:"table"`
	// Rows in the live table and in the rebuild.
	LiveRows    int64 `json:"live_rows"`
	RebuiltRows int64 `json:"rebuilt_rows"`
	// OnlyLive and OnlyRebuilt count the rows found on one side only
	// (EXCEPT both ways); Samples shows a few of them, as JSON.
	OnlyLive    int64    `json:"only_live"`
	OnlyRebuilt int64    `json:"only_rebuilt"`
	Samples     []string `json:"samples,omitempty"`
	// Skipped counts the rows not compared, for SkipWhy.
	Skipped int64  `json:"skipped_rows,omitempty"`
	SkipWhy string `json:"skipped_why,omitempty"`
}

// Equal reports whether the table matched row for row.
func (t TableReport) Equal() bool { return t.OnlyLive == 0 && t.OnlyRebuilt == 0 }

// AllEqual reports whether every table matched.
func AllEqual(ts []TableReport) bool {
	for _, t := range ts {
		if !t.Equal() {
			return false
		}
	}
	return true
}

// CompareTables compares each table of the live schema with the rebuilt
// schema's in tx (one snapshot), with EXCEPT both ways over the compared
// columns.
func CompareTables(ctx context.Context, tx pgx.Tx, live, rebuilt string, tables []Table) ([]TableReport, error) {
	var out []TableReport
	for _, t := range tables {
		tr, err := compareTable(ctx, tx, live, rebuilt, t)
		if err != nil {
			return nil, err
		}
		out = append(out, tr)
	}
	return out, nil
}

func compareTable(ctx context.Context, tx pgx.Tx, live, rebuilt string, t Table) (TableReport, error) {
	l, r := pgx.Identifier{live, t.Name}.Sanitize(), pgx.Identifier{rebuilt, t.Name}.Sanitize()
	tr := TableReport{Table: t.Name, SkipWhy: t.SkipWhy}
	if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+l+`), (SELECT count(*) FROM `+r+`)`).
		Scan(&tr.LiveRows, &tr.RebuiltRows); err != nil {
		return TableReport{}, fmt.Errorf("rebuild: count %s: %w", t.Name, err)
	}
	// Every column: the tables that define a projection hold no wall-clock
	// bookkeeping (times are events', ids the log's), so none is left out.
	const cols = "*"
	// side selects one side's compared rows, leaving out the skipped ones.
	side := func(self, other, selfAlias, otherAlias string) string {
		q := `SELECT ` + cols + ` FROM ` + self + ` AS ` + selfAlias
		if t.Skip != "" {
			var on []string
			for _, k := range t.Key {
				id := pgx.Identifier{k}.Sanitize()
				on = append(on, otherAlias+"."+id+" = "+selfAlias+"."+id)
			}
			q += ` WHERE NOT EXISTS (SELECT 1 FROM ` + other + ` AS ` + otherAlias + ` WHERE ` + strings.Join(on, " AND ") + ` AND (` + t.Skip + `))`
		}
		return q
	}
	liveRows, rebuiltRows := side(l, r, "l", "r"), side(r, l, "r", "l")
	if t.Skip != "" {
		var on []string
		for _, k := range t.Key {
			id := pgx.Identifier{k}.Sanitize()
			on = append(on, "r."+id+" = l."+id)
		}
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+l+` AS l JOIN `+r+` AS r ON `+strings.Join(on, " AND ")+` WHERE `+t.Skip).
			Scan(&tr.Skipped); err != nil {
			return TableReport{}, fmt.Errorf("rebuild: rows of %s not compared: %w", t.Name, err)
		}
	}
	for i, dir := range [][2]string{{liveRows, rebuiltRows}, {rebuiltRows, liveRows}} {
		rows, _ := tx.Query(ctx, `SELECT count(*) OVER (), row_to_json(x)::text
FROM (`+dir[0]+` EXCEPT ALL `+dir[1]+`) x LIMIT 3`)
		var n int64
		var s string
		if _, err := pgx.ForEachRow(rows, []any{&n, &s}, func() error {
			which := "only live"
			if i == 1 {
				tr.OnlyRebuilt = n
				which = "only rebuilt"
			} else {
				tr.OnlyLive = n
			}
			tr.Samples = append(tr.Samples, which+": "+s)
			return nil
		}); err != nil {
			return TableReport{}, fmt.Errorf("rebuild: compare %s: %w", t.Name, err)
		}
	}
	return tr, nil
}
