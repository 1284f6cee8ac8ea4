package projections

import "github.com/mailplane/mailplane/internal/applyonce"

// isPgDataError and isUniqueViolation are internal/applyonce's rules of
// what Postgres says about data, by their names in this package.
var (
	isPgDataError     = applyonce.IsPgDataError
	isUniqueViolation = applyonce.IsUniqueViolation
)
