package sagadef

import "fmt"

// A late message is a reply or event for a wait the saga no longer has, or
// no longer has for that message: the answer to an earlier attempt of a
// resent command (or compensation), anything for a step that stopped
// waiting (a timeout, a business cancel, an operator's compensate, cancel
// or resolve), and anything that arrives while the saga is in manual
// review. What it does depends on what it is (lateMessage), on where the
// saga is (lateWhen) and on the step's LatePolicy; lateRule is that table,
// and docs/options.md prints it (a test derives the printed table from
// Apply by exploring every reachable instance).
//
// The step's role and timeout action decide which of these situations can
// arise, never what a late message does in one.

// lateMessage is what a late message is.
type lateMessage int

// Late messages.
const (
	// lateSuccessReply and lateFailureReply answer a step's command.
	lateSuccessReply lateMessage = iota + 1
	lateFailureReply
	// lateSuccessEvent and lateFailureEvent are an External step's events.
	lateSuccessEvent
	lateFailureEvent
	// lateCompensated confirms a compensation; lateCompensationFailed says
	// it cannot be applied.
	lateCompensated
	lateCompensationFailed
)

// lateMessages lists the late messages in table order.
var lateMessages = []lateMessage{lateSuccessReply, lateFailureReply, lateSuccessEvent, lateFailureEvent, lateCompensated, lateCompensationFailed}

// lateForward returns the late message a step's reply or event is.
func lateForward(s *Step, success bool) lateMessage {
	switch {
	case s.External && success:
		return lateSuccessEvent
	case s.External:
		return lateFailureEvent
	case success:
		return lateSuccessReply
	default:
		return lateFailureReply
	}
}

// lateCompensation returns the late message a compensation reply is.
func lateCompensation(success bool) lateMessage {
	if success {
		return lateCompensated
	}
	return lateCompensationFailed
}

// compensation reports whether m answers a compensation.
func (m lateMessage) compensation() bool {
	return m == lateCompensated || m == lateCompensationFailed
}

// says reports whether m says that its step's effect is in place: a
// success, or a compensation that could not be applied.
func (m lateMessage) says() bool {
	switch m {
	case lateSuccessReply, lateSuccessEvent, lateCompensationFailed:
		return true
	}
	return false
}

// lateWhen is where the saga is when a late message arrives.
type lateWhen int

// Situations of a late message.
const (
	// lateWaiting: the saga still waits on the message's step (or
	// compensation), for a later attempt: the message answers an earlier
	// one (resent on timeout, or by an operator's retry).
	lateWaiting lateWhen = iota + 1
	// lateInReview: the saga is in MANUAL_REVIEW.
	lateInReview
	// lateUndone: the step (or compensation) stopped waiting, and the saga
	// compensates or ended FAILED or CANCELLED: it counts on the step's
	// effect not being in place.
	lateUndone
	// lateDone: the step (or compensation) stopped waiting, and the saga
	// ended COMPLETED (an operator resolved it): it counts on the step's
	// effect being in place.
	lateDone
)

// lateSituations lists the situations in table order.
var lateSituations = []lateWhen{lateWaiting, lateInReview, lateUndone, lateDone}

// lateAction is what a late message does.
type lateAction int

// Late actions.
const (
	// lateAudit acknowledges the message with an audit row; nothing else
	// changes.
	lateAudit lateAction = iota + 1
	// lateRecord folds the message into the saga data and records it as
	// its step's (or compensation's) outcome, without a state change; an
	// operator's retry, or the saga reaching the step, continues from it.
	lateRecord
	// lateApply applies the message as the answer the saga waits for.
	lateApply
	// lateReview records the message and sends the saga to MANUAL_REVIEW.
	lateReview
)

// lateRule is the late-reply table: what late message m, arriving in
// situation when, does for a step whose policy is p.
//
//   - In manual review everything is recorded for the operator, whatever
//     the policy: the operator holds the saga, and a retry continues from
//     what was recorded. (An External step's event that comes before the
//     saga reached its step, in review or not, is early, not late: see
//     recordEarly.)
//   - The answer to an earlier attempt of a compensation is applied:
//     every attempt sends the same compensating command (same idempotency
//     key), so any attempt's answer is the compensation's.
//   - The answer to an earlier attempt of a step's command follows the
//     policy: applied (apply if waiting), sent to review, or audited while
//     the saga waits for the answer to the later attempt (ignore).
//   - Once the step stopped waiting, a message that agrees with what the
//     saga does is audited: a failure (nothing happened) while it
//     compensates or after it failed, a success after it completed. One that
//     contradicts it is an effect nobody will undo (a success the saga
//     does not count on), or a missing effect the saga counts on: the
//     policy decides between review (manual review) and an audit row
//     (ignore, and apply if waiting: the saga no longer waits). A failed
//     compensation is never only audited: it goes to review whatever the
//     policy.
func lateRule(m lateMessage, when lateWhen, p LatePolicy) lateAction {
	switch when {
	case lateInReview:
		return lateRecord
	case lateWaiting:
		switch {
		case m.compensation(), p == LateApplyIfWaiting:
			return lateApply
		case p == LateManualReview:
			return lateReview
		default:
			return lateAudit
		}
	}
	// The wait ended: compensating or FAILED or CANCELLED counts on the
	// effect not being in place, COMPLETED on its being in place.
	if m.says() == (when == lateDone) {
		return lateAudit // agrees
	}
	if m == lateCompensationFailed || p == LateManualReview {
		return lateReview
	}
	return lateAudit
}

// LatePolicyInert reports whether the step's late-reply policy cannot take
// effect without an operator: LateApplyIfWaiting differs from LateIgnore only
// for the answer to an earlier attempt while the step still waits, and only
// a step that resends its command on timeout (TimeoutRetry; never an
// External step) makes earlier attempts by itself. After an operator's
// retry, the answer to the resent command settles the step anyway.
func (s Step) LatePolicyInert() bool {
	return s.Late == LateApplyIfWaiting && (s.External || s.OnTimeout != TimeoutRetry)
}

// lateSituation returns where the saga is for a late message of the step
// (or compensation) the saga waits on when waiting is set.
func (w *work) lateSituation(waiting bool) lateWhen {
	switch st := w.state(); {
	case waiting:
		return lateWaiting
	case st.Kind == StateKindManualReview:
		return lateInReview
	case st.Kind == StateKindCompensating, st.Name == StateFailed, st.Name == StateCancelled:
		return lateUndone
	default:
		// COMPLETED; a saga on its forward path counts on the steps
		// before it too.
		return lateDone
	}
}

// lateWhat describes a late message for subject ("step X", "the
// compensation of step X") for the audit note or review reason.
func (w *work) lateWhat(subject string, when lateWhen) string {
	name := shortName(w.kind)
	switch when {
	case lateWaiting:
		return fmt.Sprintf("late %s answers an earlier attempt of %s", name, subject)
	case lateInReview:
		return fmt.Sprintf("late %s for %s while in manual review", name, subject)
	default:
		return fmt.Sprintf("late %s for %s, which stopped waiting; the saga is %s", name, subject, w.lateState())
	}
}

// lateState names what the saga does, for notes.
func (w *work) lateState() string {
	switch st := w.state(); st.Kind {
	case StateKindCompensating:
		return "compensating step " + st.Step
	case StateKindTerminal:
		return st.Name
	case StateKindGroup:
		return "waiting on group " + st.Group
	default:
		return "waiting on step " + st.Step
	}
}

// lateRisk says, for a late message m of step s that the saga no longer
// waits for, whether it agrees with what the saga does, or what it may
// leave wrong (for a review reason when review is set, for an audit note
// otherwise); "" while the saga waits or is in review.
func (w *work) lateRisk(s *Step, m lateMessage, when lateWhen, review bool) string {
	if when != lateUndone && when != lateDone {
		return ""
	}
	switch {
	case m.says() == (when == lateDone):
		return ": it agrees with what the saga does"
	case m.compensation() && when == lateDone:
		return ": the step is undone though the saga completed"
	case m.compensation():
		return ": the step's effect is still in place"
	case !m.says():
		return ": the saga counts on the step's effect, which did not happen"
	case s.Role == RoleCheck:
		return ": a check step leaves nothing to undo"
	case s.Role != RoleCompensatable || !sentFor(w.in.Progress.SentCompensations, s.Name):
		return ": its effect stands and nothing undoes it"
	case s.External:
		return fmt.Sprintf(": its compensation %s was sent before it came", shortName(s.Compensation))
	case review:
		return fmt.Sprintf(": check that its compensation %s undid it (the compensation names the command, x-saga-compensates, which a participant on runtime/participant honours; the saga cannot tell whether this one did)",
			shortName(s.Compensation))
	default:
		return fmt.Sprintf(": its compensation %s was sent naming the command (x-saga-compensates), so a participant that honours it undid the effect or never applied it",
			shortName(s.Compensation))
	}
}

// sentFor reports whether sent (message id → step) holds a message for step.
func sentFor(sent map[string]string, step string) bool {
	for _, s := range sent {
		if s == step {
			return true
		}
	}
	return false
}
