package projections

import "github.com/mailplane/mailplane/internal/applyonce"

// isUniqueViolation is internal/applyonce's rule of a duplicate key, by
// its name in this package.
var isUniqueViolation = applyonce.IsUniqueViolation
