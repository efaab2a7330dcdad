package sagadef

import (
	"fmt"
	"strings"
	"unicode"
)

// compensatingPrefix starts the name of every compensating state.
const compensatingPrefix = "COMPENSATING_"

// StateName returns the name of the state in which a saga waits for the
// reply (or event) of the named step: the step name in upper snake case,
// "ReserveInventory" → "RESERVE_INVENTORY". Acronyms stay whole
// ("HTTPCall" → "HTTP_CALL"), digits stay with what precedes them
// ("ApproveV2" → "APPROVE_V2"), existing underscores are kept. State names
// are stored in the database, so this function never changes its output for
// a given input.
func StateName(step string) string {
	runes := []rune(step)
	var b strings.Builder
	b.Grow(len(step) + 4)
	for i, r := range runes {
		if i > 0 && unicode.IsUpper(r) {
			prev := runes[i-1]
			nextLower := i+1 < len(runes) && unicode.IsLower(runes[i+1])
			if unicode.IsLower(prev) || unicode.IsDigit(prev) || (unicode.IsUpper(prev) && nextLower) {
				b.WriteByte('_')
			}
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// CompensatingStateName returns the name of the state in which a saga waits
// for the reply to the named step's compensation:
// "ReserveInventory" → "COMPENSATING_RESERVE_INVENTORY".
func CompensatingStateName(step string) string {
	return compensatingPrefix + StateName(step)
}

// IsTerminal reports whether state is one of the terminal states COMPLETED,
// FAILED and CANCELLED. MANUAL_REVIEW is not terminal: it waits for an
// operator.
func IsTerminal(state string) bool {
	switch state {
	case StateCompleted, StateFailed, StateCancelled:
		return true
	}
	return false
}

// String returns the lower-case name of the role.
func (r Role) String() string {
	switch r {
	case RoleCompensatable:
		return "compensatable"
	case RolePivot:
		return "pivot"
	case RoleRetriable:
		return "retriable"
	case RoleCheck:
		return "check"
	default:
		return fmt.Sprintf("role(%d)", int(r))
	}
}

// String returns the lower-case name of the action.
func (a TimeoutAction) String() string {
	switch a {
	case TimeoutCompensate:
		return "compensate"
	case TimeoutRetry:
		return "retry"
	case TimeoutManualReview:
		return "manual review"
	default:
		return fmt.Sprintf("timeout_action(%d)", int(a))
	}
}

// String returns the lower-case name of the policy.
func (p LatePolicy) String() string {
	switch p {
	case LateIgnore:
		return "ignore"
	case LateManualReview:
		return "manual review"
	case LateApplyIfWaiting:
		return "apply if waiting"
	default:
		return fmt.Sprintf("late_policy(%d)", int(p))
	}
}

// String returns the lower-case name of the kind.
func (k StateKind) String() string {
	switch k {
	case StateKindStep:
		return "step"
	case StateKindCompensating:
		return "compensating"
	case StateKindManualReview:
		return "manual review"
	case StateKindTerminal:
		return "terminal"
	case StateKindGroup:
		return "group"
	default:
		return fmt.Sprintf("state_kind(%d)", int(k))
	}
}

// String returns the class as stored in the audit trail's class column:
// new, duplicate, late, conflicting, invalid or early.
func (c Class) String() string {
	switch c {
	case ClassNew:
		return "new"
	case ClassDuplicate:
		return "duplicate"
	case ClassLate:
		return "late"
	case ClassConflicting:
		return "conflicting"
	case ClassInvalid:
		return "invalid"
	case ClassEarly:
		return "early"
	default:
		return fmt.Sprintf("class(%d)", int(c))
	}
}
