package applyonce

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailplane/mailplane/domain"
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

// Permanent marks err as caused by the records being applied, not by the
// environment: retrying will not help, and the record at fault is poison.
// code is reported with it (in the DLQ); empty means domain.CodeInvalid.
func Permanent(code domain.Code, err error) error {
	if err == nil {
		return nil
	}
	if code == "" {
		code = domain.CodeInvalid
	}
	return &permanentError{code: code, err: err}
}

type permanentError struct {
	code domain.Code
	err  error
}

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// IsPermanent is the rule of which errors of a projection say the records
// cannot be applied, and the code to report for them: an error marked
// Permanent, a *domain.Error other than unavailable or internal, or
// Postgres refusing the data (IsPgDataError). Any other error is transient
// (a database restart, a deadlock, a timeout): retrying is the answer.
func IsPermanent(err error) (domain.Code, bool) {
	var pe *permanentError
	if errors.As(err, &pe) {
		return pe.code, true
	}
	var de *domain.Error
	if errors.As(err, &de) {
		switch de.Code {
		case domain.CodeUnavailable, domain.CodeInternal:
			return "", false
		}
		return de.Code, true
	}
	if IsPgDataError(err) {
		return domain.CodeInvalid, true
	}
	return "", false
}

// RefusedError is the projection refusing the records of a batch: what Run
// returns for an error of apply that IsPermanent says is the records'
// fault. Isolate takes such a batch apart to find the record at fault.
type RefusedError struct {
	// Code is the error's code (IsPermanent).
	Code domain.Code
	// Err is the error as the projection returned it.
	Err error
}

func (e *RefusedError) Error() string { return e.Err.Error() }
func (e *RefusedError) Unwrap() error { return e.Err }

// Refuse returns err as a *RefusedError when IsPermanent says the records
// are at fault, else err itself. Run does this to apply's errors; a caller
// that does a projection's work before Run (the projector's prepare) does
// it to its own.
func Refuse(err error) error {
	var re *RefusedError
	if err == nil || errors.As(err, &re) {
		return err
	}
	if code, ok := IsPermanent(err); ok {
		return &RefusedError{Code: code, Err: err}
	}
	return err
}
