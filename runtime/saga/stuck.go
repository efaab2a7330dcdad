package saga

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/protosaga/saga/runtime/sagadef"
)

// DefaultStuckGrace is how far past due an instance must be to count as
// stuck, unless configured otherwise (telemetry.WithStuckGrace, the admin server's
// Config.StuckGrace): the timeout scanner should have acted long before.
const DefaultStuckGrace = time.Minute

// StuckRule is the one definition of a stuck saga instance, behind the
// saga.instances.stuck gauge and the admin server's stuck filter and
// verdict. An instance is stuck when it waits on a step or a compensation
// and
//
//   - the child saga it waits on is in manual review (the parent recorded
//     the child's manual-review reply, sagadef.Progress.ChildReview): the
//     step cannot finish until an operator resolves the child, or
//   - by more than the grace, its step timeout (timeout_at) or the saga's deadline (deadline_at) is
//     past due without having been applied (no timeout scanner runs, or
//     its transition keeps failing), or
//   - by more than the grace, it has not changed (updated_at) for longer than the step's timeout
//     (a deferred timeout moves timeout_at on, but not updated_at).
//
// Instances in manual review or a terminal state are never stuck: they
// wait for an operator, or for nothing.
type StuckRule struct {
	states []string        // the waiting states
	limits []time.Duration // per state: the step's timeout + grace
	grace  time.Duration
}

// NewStuckRule returns the rule for the instances of def with grace (0 or
// more).
func NewStuckRule(def *sagadef.Definition, grace time.Duration) StuckRule {
	r := StuckRule{grace: max(grace, 0)}
	for _, s := range def.States {
		var timeout time.Duration
		switch s.Kind {
		case sagadef.StateKindStep, sagadef.StateKindCompensating:
			step, _ := def.LookupStep(s.Step) // Compile requires every step's timeout
			timeout = step.Timeout
		case sagadef.StateKindGroup:
			// A group waits at most its own timeout (Compile requires one).
			for _, g := range def.Groups {
				if g.Name == s.Group {
					timeout = g.Timeout
				}
			}
		default:
			continue
		}
		r.states = append(r.states, s.Name)
		r.limits = append(r.limits, timeout+r.grace)
	}
	return r
}

// Waits reports whether state is one the rule can find stuck.
func (r StuckRule) Waits(state string) bool { return slices.Contains(r.states, state) }

// StatesSQL is the SQL condition that the instance table aliased t is in
// one of states, with the states written into the statement rather than
// passed: they are few and fixed (a definition's), and PostgreSQL then
// plans each statement with what it knows of those states' share of the
// table, reading a rare state through the state index and a common one by
// a scan. The saga gauges and the admin server's lists use it.
func StatesSQL(states ...string) string {
	quoted := make([]string, len(states))
	for i, s := range states {
		quoted[i] = "'" + strings.ReplaceAll(s, "'", "''") + "'"
	}
	return "t.state IN (" + strings.Join(quoted, ", ") + ")"
}

// StuckSQL is the rule as an SQL condition on the instance table aliased
// t. now, states, limits and grace are the SQL expressions (placeholders)
// of the clock (timestamptz) and of [StuckRule.Args]: the waiting states
// (text[]), their limits and the grace in microseconds (bigint[], bigint).
//
// It is an expression of the row alone: the state's limit is read from
// the limits array by the state's position in states. The saga gauge
// evaluates it on every in-flight instance at every scrape; written as a
// subquery over unnest(states, limits), it ran a set-returning function
// scan per row and kept the scan from running in parallel (a million
// in-flight instances: 1.2 s per scrape; 0.3 s as an expression, on three
// workers).
func StuckSQL(now, states, limits, grace string) string {
	now = "(" + now + ")::timestamptz"
	return `coalesce(t.state = ANY(` + states + `::text[]) AND (
    t.progress->'child_review' IS NOT NULL
    OR t.timeout_at < ` + now + ` - ` + grace + `::bigint * interval '1 microsecond'
    OR t.deadline_at < ` + now + ` - ` + grace + `::bigint * interval '1 microsecond'
    OR t.updated_at < ` + now + ` - (` + limits + `::bigint[])[array_position(` + states + `::text[], t.state)] * interval '1 microsecond'), false)`
}

// Args returns the values of StuckSQL's states, limits and grace.
func (r StuckRule) Args() (states []string, limitsMicros []int64, graceMicros int64) {
	limits := make([]int64, len(r.limits))
	for i, l := range r.limits {
		limits[i] = l.Microseconds()
	}
	return r.states, limits, r.grace.Microseconds()
}

// Reason says why an instance in state, with the record of its child in
// manual review (nil: none), its timeout, deadline (nil: none) and last
// change, is stuck at now, or "" when it is not: the same verdict as
// StuckSQL. A child in manual review comes first: it is what an operator
// must act on, and the step's timeout only ends the wait.
func (r StuckRule) Reason(state string, review *sagadef.ChildReview, timeoutAt, deadlineAt *time.Time, updatedAt, now time.Time) string {
	i := slices.Index(r.states, state)
	if i < 0 {
		return ""
	}
	due := now.Add(-r.grace)
	switch {
	case review != nil:
		return fmt.Sprintf("step %s waits on a child in manual review: %s", review.Step, orUnknownReason(review.Reason))
	case timeoutAt != nil && timeoutAt.Before(due):
		return fmt.Sprintf("timeout due %s ago and not fired (is a timeout scanner running?)", age(now.Sub(*timeoutAt)))
	case deadlineAt != nil && deadlineAt.Before(due):
		return fmt.Sprintf("saga deadline passed %s ago", age(now.Sub(*deadlineAt)))
	case updatedAt.Before(now.Add(-r.limits[i])):
		return fmt.Sprintf("no progress for %s; the step's timeout is %s", age(now.Sub(updatedAt)), r.limits[i]-r.grace)
	}
	return ""
}

// orUnknownReason returns reason, or a placeholder when the child gave none.
func orUnknownReason(reason string) string {
	if reason == "" {
		return "(the child gave no reason)"
	}
	return reason
}

// age formats a duration for people: whole seconds (or milliseconds below
// one second).
func age(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
