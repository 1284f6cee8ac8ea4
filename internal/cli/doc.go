// Package cli holds mailplane's operator commands and what they print:
// topics, migrate, publish, token, credentials, acls, dlq, replay
// placement, placement show and newid. Each command parses its own flags
// (settings from package config) and returns an error for the exit code;
// cmd/mailplane only dispatches to them.
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
