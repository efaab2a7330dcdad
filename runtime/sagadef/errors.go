package sagadef

import (
	"errors"
	"fmt"
)

// Sentinel errors, for use with errors.Is.
var (
	// ErrInvalidDefinition is matched by every error Compile reports.
	ErrInvalidDefinition = errors.New("invalid saga definition")
	// ErrNotCompiled is returned by Begin and Apply on a
	// Definition that Compile has not accepted.
	ErrNotCompiled = errors.New("saga definition not compiled")
	// ErrInvalidTrigger is returned for a trigger that is malformed (an
	// operator trigger without operator or reason, a message that does not
	// match its Kind, an unknown trigger kind) or that the current state does
	// not allow (resolve outside MANUAL_REVIEW, retry with nothing to retry).
	ErrInvalidTrigger = errors.New("invalid saga trigger")
	// ErrTerminal is returned for an operator trigger on an instance in a
	// terminal state.
	ErrTerminal = errors.New("saga is in a terminal state")
	// ErrMisaddressed is matched by the [CausationError] Apply returns for
	// a reply whose causation id names no command this saga sent for the
	// step (or compensation) its type answers: a participant that answers
	// without the command's message id, or with another command's. It
	// changes nothing; the engine marks it permanent, so the consumer parks
	// it with the reason instead of letting it pass as an audited no-op.
	ErrMisaddressed = errors.New("misaddressed reply")
	// ErrUnknownState is returned when an instance's state is not a state of
	// the definition (e.g. a state removed while instances still occupy it).
	ErrUnknownState = errors.New("unknown saga state")
)

// CausationError is a reply whose causation id (Trigger.CausationID) names
// no command this saga sent for what its type answers. It matches
// [ErrMisaddressed] with errors.Is.
type CausationError struct {
	// Reply is the reply's full name; Step the step its type answers, and
	// Compensation whether it answers that step's compensation rather than
	// its command.
	Reply        string
	Step         string
	Compensation bool
	// CausationID is the causation id the reply carries (empty: none).
	CausationID string
	// NamedStep is the step whose command (NamedCompensation: whose
	// compensating command) the causation id names, when it names one of
	// this saga's commands; empty otherwise.
	NamedStep         string
	NamedCompensation bool
}

// Expected says which command the reply must name: "the command of step S"
// or "the compensation of step S".
func (e *CausationError) Expected() string { return what(e.Step, e.Compensation) }

func what(step string, compensation bool) string {
	if compensation {
		return "the compensation of step " + step
	}
	return "the command of step " + step
}

// Error says what the causation id names and what the reply answers.
func (e *CausationError) Error() string {
	reply := shortName(e.Reply)
	switch {
	case e.CausationID == "":
		return fmt.Sprintf("%s carries no causation id; it answers %s", reply, e.Expected())
	case e.NamedStep == "":
		return fmt.Sprintf("%s names causation %q, which is no command this saga sent; it answers %s",
			reply, e.CausationID, e.Expected())
	default:
		return fmt.Sprintf("%s names causation %q, which is %s; it answers %s",
			reply, e.CausationID, what(e.NamedStep, e.NamedCompensation), e.Expected())
	}
}

// Is reports whether target is ErrMisaddressed.
func (e *CausationError) Is(target error) bool { return target == ErrMisaddressed }

// DefinitionError is one problem Compile found. It matches
// [ErrInvalidDefinition] with errors.Is.
type DefinitionError struct {
	// Saga is the saga's name; Step the step's name, empty for problems of
	// the saga as a whole.
	Saga string
	Step string
	// Problem says what is wrong.
	Problem string
}

// Error returns "saga NAME: step STEP: PROBLEM".
func (e *DefinitionError) Error() string {
	saga := e.Saga
	if saga == "" {
		saga = "(unnamed)"
	}
	if e.Step != "" {
		return fmt.Sprintf("saga %s: step %s: %s", saga, e.Step, e.Problem)
	}
	return fmt.Sprintf("saga %s: %s", saga, e.Problem)
}

// Is reports whether target is ErrInvalidDefinition.
func (e *DefinitionError) Is(target error) bool { return target == ErrInvalidDefinition }
