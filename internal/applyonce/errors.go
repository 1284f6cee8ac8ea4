package applyonce

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// IsPgDataError reports whether err is Postgres refusing the data itself:
// class 22 (data exception), 23 (integrity constraint violation) or a
// RAISE from a function (P0001). Everything else Postgres says (connection
// loss, deadlock, serialization failure, missing table, shutdown) is about
// the environment, and retrying is the right answer: sending records to the
// DLQ because the database was down would lose nothing but help nobody.
func IsPgDataError(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23") || pe.Code == "P0001"
}

// IsUniqueViolation reports whether err is Postgres refusing a duplicate
// key (23505).
func IsUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}
