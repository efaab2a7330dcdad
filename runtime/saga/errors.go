package saga

import (
	"errors"
	"fmt"
)

// ErrNotFound is returned (wrapped) when no instance has the requested id or
// business key. Handle marks it permanent: a message for a saga that does not
// exist is parked with the reason.
var ErrNotFound = errors.New("saga instance not found")

// ErrUnreadableData is matched (errors.Is) by the error of a transition on
// an instance whose stored saga data cannot be decoded (written by hand,
// or by a data message the contract has since changed incompatibly). No
// retry can help: a message for it is parked at once, and a due timeout is
// deferred until the scanner sends the saga to manual review
// (sagadef.TriggerStuck); a passed deadline sends it there at once. Cancel
// and resolve, which need no data, still work, and keep the stored bytes as
// they are; Status reports the problem in Status.DataError.
var ErrUnreadableData = errors.New("saga data cannot be decoded")

// UnreadableDataHint follows the error of an instance whose data cannot be
// decoded wherever an operator reads it.
const UnreadableDataHint = "only cancel and resolve apply until it is repaired"

// ErrVersionConflict is returned (wrapped in a [*VersionConflictError]) when
// an operator action names a version the instance no longer has: something
// else (a reply, a timeout, another operator) changed it first. Reload the
// status and decide again.
var ErrVersionConflict = errors.New("saga version conflict")

// ErrRejected is returned (wrapped in a [*RejectedError]) when the saga's
// state machine refuses an operator action in the instance's current state.
var ErrRejected = errors.New("saga operation rejected")

// VersionConflictError says which version an operator expected and which the
// instance has. errors.Is(err, ErrVersionConflict) matches it.
type VersionConflictError struct {
	SagaID   string
	Expected int64
	// Actual is the instance's current version; 0 when unknown (the guard
	// of an update found the row changed).
	Actual int64
	State  string
}

func (e *VersionConflictError) Error() string {
	if e.Actual == 0 {
		return fmt.Sprintf("saga %s: instance moved past version %d (state %s) concurrently", e.SagaID, e.Expected, e.State)
	}
	return fmt.Sprintf("saga %s: expected version %d, instance is at version %d (state %s)",
		e.SagaID, e.Expected, e.Actual, e.State)
}

// Is reports whether target is ErrVersionConflict.
func (e *VersionConflictError) Is(target error) bool { return target == ErrVersionConflict }

// RejectedError says why the state machine refused an operator action.
// errors.Is(err, ErrRejected) matches it.
type RejectedError struct {
	SagaID  string
	State   string
	Trigger string
	// Err is the machine's reason (often matching sagadef.ErrInvalidTrigger
	// or sagadef.ErrTerminal).
	Err error
}

func (e *RejectedError) Error() string {
	msg := fmt.Sprintf("saga %s: %s not allowed in state %s", e.SagaID, e.Trigger, e.State)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrRejected.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected }

// Unwrap returns the machine's reason.
func (e *RejectedError) Unwrap() error { return e.Err }
