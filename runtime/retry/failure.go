package retry

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// Class is how a failure is handled.
type Class int

// Failure classes. The zero value is ClassUnknown.
const (
	// ClassUnknown is a failure nobody classified: retried with a bounded
	// budget, then parked.
	ClassUnknown Class = iota
	// ClassTransient is a failure that may go away: retried after a delay,
	// then parked when the attempt budget is spent.
	ClassTransient
	// ClassPermanent is a failure that cannot go away: parked at once.
	ClassPermanent
)

// String returns the lower-case name of the class: "unknown", "transient" or
// "permanent". These names are stored and sent in headers; never change them.
func (c Class) String() string {
	switch c {
	case ClassTransient:
		return "transient"
	case ClassPermanent:
		return "permanent"
	default:
		return "unknown"
	}
}

// classified marks an error with a class.
type classified struct {
	class Class
	early bool // Early: the message came before what it waits for
	err   error
}

func (e *classified) Error() string { return e.class.String() + ": " + e.err.Error() }

func (e *classified) Unwrap() error { return e.err }

// Permanent marks err as permanent: the message that caused it is parked
// without retries. It returns nil when err is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &classified{class: ClassPermanent, err: err}
}

// Transient marks err as transient: the message that caused it is retried
// after a delay, within the retry policy's budget. It returns nil when err is
// nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &classified{class: ClassTransient, err: err}
}

// Early marks err as transient and expected: the message arrived before
// what it waits for (an event for a saga step not reached yet, a message
// for a saga whose start is still on its way). It is retried like any
// transient failure, and parked when the budget is spent; consumers log its
// retries at INFO rather than WARN, since messages published in order are
// not always handled in order. It returns nil when err is nil.
func Early(err error) error {
	if err == nil {
		return nil
	}
	return &classified{class: ClassTransient, early: true, err: err}
}

// IsEarly reports whether the outermost class mark in err's chain is
// [Early].
func IsEarly(err error) bool {
	var c *classified
	return errors.As(err, &c) && c.early
}

// ClassOf returns the class of err. The rules, first match wins:
//
//  1. nil is ClassUnknown (there is no failure to route; callers check nil
//     first).
//  2. The outermost [Permanent] or [Transient] mark in err's chain.
//  3. context.DeadlineExceeded and context.Canceled are transient.
//  4. A PostgreSQL error by SQLSTATE: 40001 serialization failure, 40P01
//     deadlock, 55P03 lock not available, 57014 query canceled (statement
//     timeout), 57P01..57P03 shutdown/cannot connect now, class 08
//     connection exceptions and class 53 insufficient resources are
//     transient; class 23 integrity constraint violations and class 22 data
//     exceptions are permanent (the same input violates them again); any
//     other SQLSTATE is unknown.
//  5. Connection failures are transient: a failed connect
//     (*pgconn.ConnectError), an error pgconn reports as safe to retry or as
//     a timeout, a closed connection, a network error, an unexpected EOF,
//     connection reset/refused/aborted and broken pipe.
//  6. Anything else is ClassUnknown.
func ClassOf(err error) Class {
	if err == nil {
		return ClassUnknown
	}
	var c *classified
	if errors.As(err, &c) {
		return c.class
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return ClassTransient
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return classOfSQLState(pgErr.Code)
	}
	if isConnectionError(err) {
		return ClassTransient
	}
	return ClassUnknown
}

// classOfSQLState maps a SQLSTATE code to a class.
func classOfSQLState(code string) Class {
	switch code {
	case "40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03":
		return ClassTransient
	}
	switch {
	case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "53"):
		return ClassTransient
	case strings.HasPrefix(code, "23"), strings.HasPrefix(code, "22"):
		return ClassPermanent
	}
	return ClassUnknown
}

// isConnectionError reports whether err says the connection to a server
// failed or went away.
func isConnectionError(err error) bool {
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	if errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return true
	}
	for _, errno := range []syscall.Errno{syscall.ECONNRESET, syscall.ECONNREFUSED, syscall.ECONNABORTED, syscall.EPIPE} {
		if errors.Is(err, errno) {
			return true
		}
	}
	var netErr net.Error
	return errors.As(err, &netErr)
}
