package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Exit codes of mailplane's commands, so that a script tells a finding
// (drift, a failed verify) from a failure (a broker or a database down).
// docs/operating.md lists them.
const (
	ExitOK           = 0 // done
	ExitError        = 1 // the command failed (unreachable broker or database, bad input)
	ExitUsage        = 2 // unknown command, subcommand or flag
	ExitDrift        = 3 // topics apply: a topic differs from the catalog
	ExitVerifyFailed = 4 // rebuild --verify: the rebuild differs from the live projection
	ExitPartial      = 5 // dlq redrive: some selected dead letters were refused or left pending; import: some rows were refused
	ExitIncompatible = 6 // schemas register: the registry holds a schema the new one is incompatible with
)

// ExitCodeError is an error with the exit code it stands for.
type ExitCodeError struct {
	Code int
	Err  error
}

func (e *ExitCodeError) Error() string { return e.Err.Error() }
func (e *ExitCodeError) Unwrap() error { return e.Err }

// ExitCode is the exit code of a command that returned err.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var ec *ExitCodeError
	if errors.As(err, &ec) {
		return ec.Code
	}
	return ExitError
}

// usageError is a usage mistake: ExitUsage.
func usageError(msg string) error { return &ExitCodeError{Code: ExitUsage, Err: errors.New(msg)} }

// Output formats of the list and show commands (--format).
const (
	FormatText = "text"
	FormatJSON = "json"
)

// checkFormat refuses an unknown --format.
func checkFormat(f string) error {
	if f != FormatText && f != FormatJSON {
		return usageError(fmt.Sprintf("--format must be %s or %s, not %q", FormatText, FormatJSON, f))
	}
	return nil
}

// writeJSON writes v as indented JSON, for scripts (--format json).
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
