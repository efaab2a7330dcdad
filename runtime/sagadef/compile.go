package sagadef

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// MessageUse is the part a message type plays in a saga definition.
type MessageUse int

// Message uses.
const (
	UseUnspecified MessageUse = iota
	// UseStart: the message that starts an instance.
	UseStart
	// UseCommand: a step's command (sent).
	UseCommand
	// UseSuccess: a step's success reply or event.
	UseSuccess
	// UseFailure: a step's business-failure reply or event.
	UseFailure
	// UseCompensation: a step's compensating command (sent).
	UseCompensation
	// UseCompensationReply: the reply that confirms a compensation.
	UseCompensationReply
	// UseCompensationFailure: a reply saying a compensation cannot be applied.
	UseCompensationFailure
	// UseCancel: the saga's business cancel message (Definition.Cancel).
	UseCancel
	// UseChildReview: a child step's child saying it is in manual review
	// (Step.ChildReview).
	UseChildReview
)

// String returns the lower-case name of the use.
func (u MessageUse) String() string {
	switch u {
	case UseStart:
		return "start"
	case UseCommand:
		return "command"
	case UseSuccess:
		return "success reply"
	case UseFailure:
		return "failure reply"
	case UseCompensation:
		return "compensation"
	case UseCompensationReply:
		return "compensation reply"
	case UseCompensationFailure:
		return "compensation failure reply"
	case UseCancel:
		return "cancel message"
	case UseChildReview:
		return "child review reply"
	default:
		return fmt.Sprintf("use(%d)", int(u))
	}
}

// incoming reports whether messages of this use are received by the saga.
func (u MessageUse) incoming() bool {
	switch u {
	case UseStart, UseSuccess, UseFailure, UseCompensationReply, UseCompensationFailure, UseCancel, UseChildReview:
		return true
	}
	return false
}

// MessageRef says which step a message type belongs to and how.
type MessageRef struct {
	// Step is the step's name; empty for UseStart and UseCancel.
	Step string
	Use  MessageUse
}

// msgRef is MessageRef with the step's index.
type msgRef struct {
	step int // -1 for the start and cancel messages
	use  MessageUse
}

// index is what Compile derives from the steps; Apply reads only this and
// the steps.
type index struct {
	messages  map[string]msgRef // every message full name the definition names
	steps     map[string]int    // step name → position
	states    map[string]State
	stateRank map[string]int  // position in Definition.States
	groups    map[string]span // group name → its members' positions
	trigRank  map[string]int  // order of triggers in the table
}

// Compile validates the definition and fills States and Transitions. It
// reports every problem it finds at once (errors.Join of
// [*DefinitionError], each naming the saga and step). On error the
// definition stays uncompiled. Calling Compile again recomputes everything.
func (d *Definition) Compile() error {
	d.compiled = nil
	d.States, d.Transitions = nil, nil
	ix, errs := d.validate()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	d.States = d.states()
	ix.states = make(map[string]State, len(d.States))
	ix.stateRank = make(map[string]int, len(d.States))
	for i, s := range d.States {
		ix.states[s.Name] = s
		ix.stateRank[s.Name] = i
	}
	ix.trigRank = d.triggerRanks()
	d.compiled = ix
	d.Transitions = d.derive()
	return nil
}

// Compile is [Definition.Compile] as a function, for callers that hold a
// *Definition in a variable initialiser or a table of definitions.
func Compile(d *Definition) error {
	if d == nil {
		return fmt.Errorf("compile saga definition: nil definition: %w", ErrInvalidDefinition)
	}
	return d.Compile()
}

// Compiled reports whether Compile has accepted the definition.
func (d *Definition) Compiled() bool { return d.compiled != nil }

// Lookup returns which step a message type belongs to and how. It reports
// false for names the definition does not mention, and before Compile.
func (d *Definition) Lookup(fullName string) (MessageRef, bool) {
	if d.compiled == nil {
		return MessageRef{}, false
	}
	r, ok := d.compiled.messages[fullName]
	if !ok {
		return MessageRef{}, false
	}
	if r.step < 0 {
		return MessageRef{Use: r.use}, true
	}
	return MessageRef{Step: d.Steps[r.step].Name, Use: r.use}, true
}

// LookupState returns the state of the given name. It reports false for
// names that are not states of the definition, and before Compile.
func (d *Definition) LookupState(name string) (State, bool) {
	if d.compiled == nil {
		return State{}, false
	}
	s, ok := d.compiled.states[name]
	return s, ok
}

// LookupStep returns the step of the given name.
func (d *Definition) LookupStep(name string) (Step, bool) {
	for _, s := range d.Steps {
		if s.Name == name {
			return s, true
		}
	}
	return Step{}, false
}

// states lists the states in a fixed order: step states (a group's one
// state in place of its members') in contract order, compensating states
// in compensation (reverse) order, then MANUAL_REVIEW and the terminal
// states.
func (d *Definition) states() []State {
	var out []State
	for _, s := range d.Steps {
		switch {
		case s.Group == "":
			out = append(out, State{Name: StateName(s.Name), Kind: StateKindStep, Step: s.Name})
		case !slices.ContainsFunc(out, func(st State) bool { return st.Group == s.Group }):
			out = append(out, State{Name: StateName(s.Group), Kind: StateKindGroup, Group: s.Group})
		}
	}
	for i := len(d.Steps) - 1; i >= 0; i-- {
		if s := d.Steps[i]; s.Role == RoleCompensatable {
			out = append(out, State{Name: CompensatingStateName(s.Name), Kind: StateKindCompensating, Step: s.Name})
		}
	}
	out = append(out,
		State{Name: StateManualReview, Kind: StateKindManualReview},
		State{Name: StateCompleted, Kind: StateKindTerminal},
		State{Name: StateFailed, Kind: StateKindTerminal},
		State{Name: StateCancelled, Kind: StateKindTerminal},
	)
	return out
}

// operatorTriggers lists the operator triggers in table order.
var operatorTriggers = []string{TriggerOperatorRetry, TriggerOperatorCompensate, TriggerOperatorResolve, TriggerOperatorCancel}

// triggerRanks orders triggers for the table: the start message, then every
// incoming message in step order, the cancel message, then timeout,
// deadline, stuck and the operator triggers.
func (d *Definition) triggerRanks() map[string]int {
	rank := map[string]int{TriggerStart: 0}
	add := func(names ...string) {
		for _, n := range names {
			if _, ok := rank[n]; !ok {
				rank[n] = len(rank)
			}
		}
	}
	for _, s := range d.Steps {
		add(s.SuccessReplies...)
		add(s.FailureReplies...)
		if s.CompensationReply != "" {
			add(s.CompensationReply)
		}
		add(s.CompensationFailureReplies...)
	}
	if d.Cancel.Message != "" {
		add(d.Cancel.Message)
	}
	add(TriggerTimeout, TriggerDeadline, TriggerStuck)
	add(operatorTriggers...)
	return rank
}

// reservedTriggers are trigger names no message may take.
var reservedTriggers = []string{TriggerStart, TriggerTimeout, TriggerDeadline, TriggerStuck,
	TriggerOperatorRetry, TriggerOperatorCompensate, TriggerOperatorResolve, TriggerOperatorCancel}

// validate checks the definition and builds its message index.
func (d *Definition) validate() (*index, []error) {
	var errs []error
	fail := func(step, format string, args ...any) {
		errs = append(errs, &DefinitionError{Saga: d.Name, Step: step, Problem: fmt.Sprintf(format, args...)})
	}
	if err := validateCallback(d.Callback); err != nil {
		fail("", "%s", err)
	}
	for _, problem := range d.validateReplies() {
		fail("", "%s", problem)
	}
	ix := &index{messages: map[string]msgRef{}, steps: map[string]int{}, groups: map[string]span{}}
	// uses records every message name with where it was used, so a second
	// use names the first.
	type use struct {
		step string
		use  MessageUse
	}
	uses := map[string]use{}
	claim := func(step string, stepIdx int, name string, u MessageUse) {
		if name == "" {
			return
		}
		if !isFullName(name) {
			fail(step, "%s %q is not a valid proto full name", u, name)
			return
		}
		if slices.Contains(reservedTriggers, name) {
			fail(step, "%s %q collides with the built-in trigger of that name", u, name)
			return
		}
		if prev, ok := uses[name]; ok {
			where := "the start message"
			if prev.step != "" {
				where = fmt.Sprintf("the %s of step %s", prev.use, prev.step)
			}
			fail(step, "%s %s is already %s: every message may play one part only, or replies could not be classified", u, name, where)
			return
		}
		uses[name] = use{step: step, use: u}
		ix.messages[name] = msgRef{step: stepIdx, use: u}
	}

	if d.Name == "" {
		fail("", "name is empty")
	}
	if d.StartMessage == "" {
		fail("", "start message is empty")
	}
	claim("", -1, d.StartMessage, UseStart)
	if d.DataMessage != "" && !isFullName(d.DataMessage) {
		fail("", "data message %q is not a valid proto full name", d.DataMessage)
	}
	if d.Deadline < 0 {
		fail("", "deadline %s is negative", d.Deadline)
	}
	if d.Cancel.Message == "" {
		if d.Cancel.RequestedBy != "" || d.Cancel.Reason != "" {
			fail("", "cancel names fields (requested by %q, reason %q) but no cancel message", d.Cancel.RequestedBy, d.Cancel.Reason)
		}
	}
	for _, fp := range []struct{ what, path string }{{"requested by", d.Cancel.RequestedBy}, {"reason", d.Cancel.Reason}} {
		if fp.path != "" && !isFieldPath(fp.path) {
			fail("", "cancel %s field path %q is not proto field names joined with dots", fp.what, fp.path)
		}
	}
	if len(d.Steps) == 0 {
		fail("", "has no steps")
	}

	stateOwner := map[string]string{
		StateCompleted: "built-in", StateFailed: "built-in", StateCancelled: "built-in", StateManualReview: "built-in",
	}
	claimState := func(step, state string) {
		if prev, ok := stateOwner[state]; ok {
			owner := "the built-in state"
			if prev != "built-in" {
				owner = "a state of step " + prev
			}
			fail(step, "state name %s collides with %s", state, owner)
			return
		}
		stateOwner[state] = step
	}

	pivot, lastRank := "", 0
	for i, s := range d.Steps {
		name := s.Name
		label := name
		if label == "" {
			label = fmt.Sprintf("#%d", i+1)
		}
		switch {
		case name == "":
			fail(label, "name is empty")
		case !isIdent(name):
			fail(label, "name %q is not an identifier (letters, digits, underscores; starting with a letter)", name)
		default:
			if _, dup := ix.steps[name]; dup {
				fail(label, "name is used by two steps")
			} else {
				ix.steps[name] = i
				if s.Group == "" {
					claimState(label, StateName(name))
				}
				if s.Role == RoleCompensatable {
					claimState(label, CompensatingStateName(name))
				}
			}
		}

		rank := 0
		switch s.Role {
		case RoleCompensatable, RoleCheck:
			rank = 1
		case RolePivot:
			rank = 2
			if pivot != "" {
				fail(label, "is a second pivot (step %s is the pivot); a saga has at most one point of no return", pivot)
			}
			pivot = label
		case RoleRetriable:
			rank = 3
		default:
			fail(label, "role is unspecified (want compensatable, check, pivot or retriable)")
		}
		if rank != 0 {
			if rank < lastRank {
				switch s.Role {
				case RoleCompensatable, RoleCheck:
					fail(label, "%s step follows the pivot or a retriable step; compensatable and check steps must come first", s.Role)
				case RolePivot:
					fail(label, "pivot follows a retriable step; retriable steps must come after the pivot")
				}
			} else {
				lastRank = rank
			}
		}

		if s.External {
			if s.Command != "" {
				fail(label, "external step declares command %s; an external step waits for an event and sends nothing", s.Command)
			}
		} else if s.Command == "" {
			fail(label, "has no command (mark it External if it waits for an event)")
		}
		claim(label, i, s.Command, UseCommand)
		if len(s.SuccessReplies) == 0 {
			fail(label, "has no success reply")
		}
		for _, r := range s.SuccessReplies {
			if r == "" {
				fail(label, "has an empty success reply name")
			}
			claim(label, i, r, UseSuccess)
		}
		for _, r := range s.FailureReplies {
			if r == "" {
				fail(label, "has an empty failure reply name")
			}
			claim(label, i, r, UseFailure)
		}

		if s.Role == RoleCompensatable {
			if s.Compensation == "" {
				fail(label, "compensatable step has no compensation command")
			}
			if s.CompensationReply == "" {
				fail(label, "compensatable step has no compensation reply")
			}
		} else if s.Compensation != "" || s.CompensationReply != "" || len(s.CompensationFailureReplies) > 0 {
			fail(label, "%s step declares a compensation; only compensatable steps are compensated", s.Role)
		}
		claim(label, i, s.Compensation, UseCompensation)
		claim(label, i, s.CompensationReply, UseCompensationReply)
		if s.ChildReview != "" && s.Child == "" {
			fail(label, "names a child review reply %s but no child", s.ChildReview)
		}
		claim(label, i, s.ChildReview, UseChildReview)
		for _, r := range s.CompensationFailureReplies {
			if r == "" {
				fail(label, "has an empty compensation failure reply name")
			}
			claim(label, i, r, UseCompensationFailure)
		}

		if s.Timeout <= 0 {
			fail(label, "timeout %s is not positive; every wait needs a bound", s.Timeout)
		}
		switch s.OnTimeout {
		case TimeoutCompensate:
			if s.Role == RoleRetriable {
				fail(label, "retriable step compensates on timeout; it follows the pivot, so it must retry or go to manual review")
			}
		case TimeoutRetry:
			if s.External {
				fail(label, "external step retries on timeout, but it has no command to resend")
			}
		case TimeoutManualReview:
		default:
			fail(label, "timeout action is unspecified (want compensate, retry or manual review)")
		}
		if s.Conditional && s.Role == RolePivot {
			fail(label, "the pivot is conditional; the point of no return cannot be skipped")
		}
		if s.MaxAttempts < 0 {
			fail(label, "max attempts %d is negative", s.MaxAttempts)
		}
		switch s.Late {
		case LateIgnore, LateManualReview, LateApplyIfWaiting:
		default:
			fail(label, "late-reply policy is unspecified (want ignore, manual review or apply if waiting)")
		}
	}
	if len(d.Steps) > 0 && !slices.ContainsFunc(d.Steps, func(s Step) bool { return !s.Conditional }) {
		fail("", "every step is conditional; a saga runs at least one step")
	}
	d.validateGroups(ix, fail, claimState)
	// Claimed after the steps' messages, so that a cancel message that is
	// also a step's message is reported naming that step.
	claim("", -1, d.Cancel.Message, UseCancel)
	return ix, errs
}

// isIdent reports whether s is a letter followed by letters, digits and
// underscores.
func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case i > 0 && (r == '_' || (r >= '0' && r <= '9')):
		default:
			return false
		}
	}
	return true
}

// isFieldPath reports whether s is proto field names joined with dots.
func isFieldPath(s string) bool { return isFullName(s) }

// isFullName reports whether s is a dot-separated sequence of proto
// identifiers.
func isFullName(s string) bool {
	if s == "" {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		if part == "" {
			return false
		}
		for i, r := range part {
			switch {
			case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r == '_':
			case i > 0 && r >= '0' && r <= '9':
			default:
				return false
			}
		}
	}
	return true
}

// maxAttempts is the step's send budget (0 means 1).
func (s *Step) maxAttempts() int {
	if s.MaxAttempts < 1 {
		return 1
	}
	return s.MaxAttempts
}
