package projections

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// isPgDataError reports whether err is Postgres refusing the data itself:
// class 22 (data exception), 23 (integrity constraint violation) or a
// RAISE from a function (P0001). Everything else Postgres says (connection
// loss, deadlock, serialization failure, missing table, shutdown) is about
// the environment, and retrying is the right answer: sending records to the
// DLQ because the database was down would lose nothing but help nobody.
func isPgDataError(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23") || pe.Code == "P0001"
}

// errFenced says the partition's offset row changed under this member:
// another member (or an operator) moved it. The batch is rolled back and
// re-examined against the new offset.
var errFenced = errors.New("projector offset moved under this member")

// errStopping says the partition is being stopped (revoked, lost, or the
// projector is shutting down).
var errStopping = errors.New("partition stopping")

// reseekError asks for the partition to be read again from offset, which
// Postgres says is next although the member had read further: someone
// rewound the projector.
type reseekError struct{ offset int64 }

func (e *reseekError) Error() string { return "projector offset rewound; reseeking" }
