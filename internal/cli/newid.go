package cli

import (
	"fmt"
	"io"

	"github.com/mailplane/mailplane/domain"
)

// NewID is `mailplane newid`: a new event id (UUIDv7).
func NewID(out io.Writer) {
	fmt.Fprintln(out, domain.NewEventID())
}
