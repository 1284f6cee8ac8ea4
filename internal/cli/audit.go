package cli

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/opsaudit"
)

// auditSource is the ce_source of the CLI's operator audit records.
const auditSource = "mailplane/cli"

// cliAction is one operator action of a CLI command, recorded in the
// operator audit when the command ends: exactly one record, whether it
// went well, was refused or failed. The CLI holds the brokers' and the
// database's own credentials, so a record it cannot write does not undo
// the action: it warns on stderr and the command's result
// stands (opsaudit's package doc).
type cliAction struct {
	kcfg    kafka.Config
	action  domain.OpsActionName
	params  domain.OpsParams
	started bool // the action began changing things: an error now is a failure, not a refusal
	set     bool
}

// begin names the action, once its flags are parsed.
func (a *cliAction) begin(kcfg kafka.Config, action domain.OpsActionName, params domain.OpsParams) {
	a.kcfg, a.action, a.params, a.set = kcfg, action, params, true
}

// finish records the action with err, its outcome, and returns err.
func (a *cliAction) finish(ctx context.Context, err error) error {
	if !a.set {
		return err
	}
	e := opsaudit.Entry{Actor: opsaudit.CLI(a.kcfg), Action: a.action, Params: &a.params, Err: err, Code: cliCode(err)}
	e.Refused = err != nil && !a.started && refusal(err)
	// The warning below is the one line an operator sees; the recorder
	// logs nothing of its own here.
	rec, rerr := opsaudit.New(a.kcfg.WithClientID("mailplane-ops-audit"), auditSource, nil, nil)
	if rerr == nil {
		rerr = rec.Record(ctx, e)
		rec.Close()
	}
	if rerr != nil {
		fmt.Fprintf(os.Stderr, "warning: %v\n", rerr)
	}
	return err
}

// cliCode is the stable code recorded for a command's error: the exit
// code's name for the CLI's own refusals, else the error's domain code.
func cliCode(err error) domain.Code {
	if errors.Is(err, errNothingConfirmed) {
		return "not_confirmed"
	}
	var re *refusedError
	if errors.As(err, &re) {
		return re.code
	}
	var ec *ExitCodeError
	if errors.As(err, &ec) && domain.ErrorCode(ec.Err) == domain.CodeInternal {
		switch ec.Code {
		case ExitUsage:
			return "usage"
		case ExitVerifyFailed:
			return "verify_failed"
		case ExitPartial:
			return "partial"
		}
	}
	return ""
}

// refusal reports whether err refused an action (bad input, a rule, a
// failed verify) rather than failing it (a broker or a database down, a
// bug): only the former are recorded as refused.
func refusal(err error) bool { return cliCode(err) != "" || opsaudit.Refusal(err) }

// refusedError marks an error that refuses an action (a rule said no)
// with the stable code the audit records; it unwraps to the error.
type refusedError struct {
	code domain.Code
	err  error
}

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

// refused marks err as a refusal with code (nil stays nil).
func refused(code domain.Code, err error) error {
	if err == nil {
		return nil
	}
	return &refusedError{code, err}
}
