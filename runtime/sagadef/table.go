package sagadef

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// The transition table is derived from the steps by the rules below, which
// mirror Apply case by case. A test (explore_test.go) checks the derivation
// against an exhaustive exploration of Apply itself — every reachable
// instance shape, every trigger — on many definitions, so that the table
// holds exactly the transitions Apply can take, no more and no fewer.

// rowSet collects table rows without duplicates.
type rowSet map[string]Transition

func (r rowSet) add(from, trigger, to string, emits []string) {
	key := from + "\x00" + trigger + "\x00" + to + "\x00" + strings.Join(emits, "\x00")
	if _, ok := r[key]; !ok {
		r[key] = Transition{From: from, Trigger: trigger, To: to, Emits: slices.Clone(emits)}
	}
}

// derive computes the transition table.
func (d *Definition) derive() []Transition {
	steps := d.Steps
	rows := rowSet{}
	type dest struct {
		state string
		emits []string
	}
	// enter is where waiting for step i begins.
	enter := func(i int) dest {
		s := steps[i]
		if s.Group != "" {
			sp := d.compiled.groups[s.Group]
			var cmds []string
			for _, m := range steps[sp.first : sp.last+1] {
				cmds = append(cmds, m.Command)
			}
			return dest{StateName(s.Group), cmds}
		}
		if s.External {
			return dest{StateName(s.Name), nil}
		}
		return dest{StateName(s.Name), []string{s.Command}}
	}
	// failed is where a failure of step i, waited on, leads.
	// compensateOver is where compensation starts when the steps up to k
	// completed or stopped: the last compensatable one of them, or FAILED;
	// may(j) says whether step j may have run (it was not surely skipped)
	// and must(j) whether it surely ran (conditional steps may have been
	// skipped), so the compensation may start at any compensatable step
	// that may have run, down to the first that surely did.
	compensateOver := func(k int, may, must func(j int) bool) []dest {
		var out []dest
		for j := min(k, len(steps)-1); j >= 0; j-- {
			if steps[j].Role != RoleCompensatable || !may(j) {
				continue
			}
			out = append(out, dest{CompensatingStateName(steps[j].Name), []string{steps[j].Compensation}})
			if must(j) {
				return out
			}
		}
		return append(out, dest{StateFailed, nil})
	}
	always := func(int) bool { return true }
	// compensateRan is compensateOver when step ran surely ran.
	compensateRan := func(k, ran int) []dest {
		return compensateOver(k, always, func(j int) bool { return !steps[j].Conditional || j == ran })
	}
	compensateFrom := func(k int) []dest { return compensateRan(k, -1) }
	// failed is where a failure of step i, waited on, leads.
	failed := func(i int) []dest {
		if steps[i].Role == RoleRetriable {
			return []dest{{StateManualReview, nil}}
		}
		return compensateFrom(i - 1)
	}
	// failedPast is where a recorded failure of External step m leads when
	// the saga went forward to it from step i, which ran: the steps
	// between were skipped, or (External ones) settled by events recorded
	// before.
	failedPast := func(i, m int) []dest {
		if steps[m].Role == RoleRetriable {
			return []dest{{StateManualReview, nil}}
		}
		return compensateOver(m-1,
			func(j int) bool { return j <= i || steps[j].External },
			func(j int) bool { return !steps[j].Conditional || j == i })
	}
	// forward lists where the saga goes forward after step i: the next
	// step, or past the conditional steps after it the decider skips, and,
	// when recorded, past the External steps after it whose event was
	// recorded in manual review before the saga reached them (the saga was
	// in review from a step up to i), or where such a recorded failure
	// leads.
	forward := func(i int, recorded bool) []dest {
		var out []dest
		for m := i + 1; ; m++ {
			if m == len(steps) {
				return append(out, dest{StateCompleted, nil})
			}
			out = append(out, enter(m))
			past := steps[m].Conditional
			if recorded && steps[m].External {
				past = true
				if len(steps[m].FailureReplies) > 0 {
					out = append(out, failedPast(i, m)...)
				}
			}
			if !past {
				return out
			}
		}
	}
	// advances lists where the saga goes after step i succeeded.
	advances := func(i int) []dest { return forward(i, true) }
	// compensateAt is where compensation starts when the saga stops
	// waiting on step i, which ran.
	compensateAt := func(i int) []dest { return compensateRan(i, i) }
	// cancelled is where a compensation ends for a saga a business cancel
	// stopped: CANCELLED where a failed one ends FAILED.
	cancel := d.Cancel.Message
	cancelled := func(to []dest) []dest {
		out := make([]dest, len(to))
		for i, t := range to {
			out[i] = t
			if t.state == StateFailed {
				out[i] = dest{StateCancelled, nil}
			}
		}
		return out
	}
	add := func(from, trigger string, to ...dest) {
		for _, t := range to {
			rows.add(from, trigger, t.state, t.emits)
		}
	}
	addAll := func(from, trigger string, to []dest) { add(from, trigger, to...) }
	// addEnd adds a row to a compensation's next destinations, and, when a
	// business cancel may have started the compensation, the rows it takes
	// then.
	addEnd := func(from, trigger string, to ...dest) {
		add(from, trigger, to...)
		if cancel != "" {
			add(from, trigger, cancelled(to)...)
		}
	}
	toReview := func(from string, triggers ...string) {
		for _, t := range triggers {
			rows.add(from, t, StateManualReview, nil)
		}
	}
	replies := func(s Step) []string { return append(slices.Clone(s.SuccessReplies), s.FailureReplies...) }
	// conflictsWithSuccess lists the replies of s that conflict with a
	// recorded success; conflictsWithAny those that can conflict with some
	// recorded outcome.
	conflictsWithSuccess := func(s Step) []string {
		out := slices.Clone(s.FailureReplies)
		if len(s.SuccessReplies) > 1 {
			out = append(out, s.SuccessReplies...)
		}
		return out
	}
	conflictsWithAny := func(s Step) []string {
		if r := replies(s); len(r) > 1 {
			return r
		}
		return nil
	}
	// conflictsPassed lists the replies of step k, which the saga passed,
	// that can conflict with its recorded outcome: a success, or, for a
	// conditional External step after the first, any event recorded in
	// review at an earlier step before the decider skipped it.
	conflictsPassed := func(k int) []string {
		if s := steps[k]; k > 0 && s.External && s.Conditional {
			return conflictsWithAny(s)
		}
		return conflictsWithSuccess(steps[k])
	}
	compensationConflicts := func(s Step) []string {
		if len(s.CompensationFailureReplies) == 0 {
			return nil
		}
		return append([]string{s.CompensationReply}, s.CompensationFailureReplies...)
	}
	// Late replies (lateRule). lateReview lists the replies of s that go
	// to review when they answer an earlier attempt; lateSuccessReview
	// those that do after s stopped waiting while the saga compensates or
	// ended FAILED or CANCELLED, lateFailureReview after it ended
	// COMPLETED.
	lateReview := func(s Step) []string {
		if s.Late == LateManualReview {
			return replies(s)
		}
		return nil
	}
	lateSuccessReview := func(s Step) []string {
		if s.Late == LateManualReview {
			return s.SuccessReplies
		}
		return nil
	}
	lateFailureReview := func(s Step) []string {
		if s.Late == LateManualReview {
			return s.FailureReplies
		}
		return nil
	}
	// undoneCompensationReview lists the compensation replies that send
	// the saga to review when its compensation was abandoned (an
	// operator's cancel or resolve) and it ended FAILED or CANCELLED;
	// doneCompensationReview when it ended COMPLETED.
	undoneCompensationReview := func(s Step) []string {
		return s.CompensationFailureReplies
	}
	doneCompensationReview := func(s Step) []string {
		if s.Late != LateManualReview || s.Role != RoleCompensatable {
			return nil
		}
		return []string{s.CompensationReply}
	}

	// Members of a parallel group: compensating member j, the members
	// before it may have failed (or had a failure recorded in review), so
	// none of them surely ran.
	memberOf := func(j int, group string) bool { return group != "" && steps[j].Group == group }
	compensateBelow := func(j int) []dest {
		g := steps[j].Group
		return compensateOver(j-1, always, func(k int) bool { return !steps[k].Conditional && !memberOf(k, g) })
	}
	// addEndBelow adds the rows of a compensation of step j that ends:
	// compensateBelow, and, when a business cancel started it (from the
	// group's state, where every member ran) or was recorded in manual
	// review before an operator started it (compensateBelow), where it
	// then goes.
	addEndBelow := func(from, trigger string, j int) {
		add(from, trigger, compensateBelow(j)...)
		if cancel != "" {
			add(from, trigger, cancelled(compensateFrom(j-1))...)
			add(from, trigger, cancelled(compensateBelow(j))...)
		}
	}
	// compensateReview adds the rows of an operator's compensation from
	// manual review: a business cancel recorded in review (Progress.Cancel)
	// ends it CANCELLED where it would end FAILED.
	compensateReview := func(rev string, to ...dest) { addEnd(rev, TriggerOperatorCompensate, to...) }
	// memberSubsets lists the commands of every non-empty subset of a
	// group's members, in contract order: what an operator's retry
	// resends to the members still waiting.
	memberSubsets := func(sp span) [][]string {
		var out [][]string
		for m := sp.first; m <= sp.last; m++ {
			n := len(out)
			out = append(out, []string{steps[m].Command})
			for _, c := range out[:n] {
				out = append(out, append(slices.Clone(c), steps[m].Command))
			}
		}
		return out
	}
	groupRows := func(g Group) {
		sp := d.compiled.groups[g.Name]
		st := StateName(g.Name)
		retriable := steps[sp.first].Role == RoleRetriable
		all := compensateFrom(sp.last)
		cmds := memberSubsets(sp)
		for m := sp.first; m <= sp.last; m++ {
			s := steps[m]
			for _, r := range s.SuccessReplies {
				add(st, r, dest{st, nil})
				addAll(st, r, advances(sp.last))
			}
			for _, r := range s.FailureReplies {
				if retriable {
					toReview(st, r)
					continue
				}
				add(st, r, compensateOver(sp.last, func(j int) bool { return j != m },
					func(j int) bool { return j != m && !steps[j].Conditional })...)
			}
			toReview(st, lateReview(s)...)           // a reply to an earlier attempt
			toReview(st, conflictsWithSuccess(s)...) // a member that completed
			switch s.OnTimeout {
			case TimeoutCompensate:
				add(st, TriggerTimeout, all...)
			case TimeoutRetry:
				if s.maxAttempts() > 1 {
					add(st, TriggerTimeout, dest{st, []string{s.Command}})
				}
				toReview(st, TriggerTimeout)
			default:
				toReview(st, TriggerTimeout)
			}
		}
		if retriable {
			toReview(st, TriggerTimeout)
		} else {
			add(st, TriggerTimeout, all...)
		}
		for k := range steps[:sp.first] {
			toReview(st, conflictsPassed(k)...)
		}
		for _, next := range steps[sp.last+1:] {
			if next.External {
				toReview(st, conflictsWithAny(next)...)
			}
		}
		if d.Deadline > 0 {
			toReview(st, TriggerDeadline)
		}
		toReview(st, TriggerStuck)
		for _, c := range cmds {
			add(st, TriggerOperatorRetry, dest{st, c})
		}
		add(st, TriggerOperatorCompensate, all...)
		add(st, TriggerOperatorCancel, dest{StateCancelled, nil})
		if cancel != "" && !retriable {
			add(st, cancel, cancelled(all)...)
		}
	}
	// groupReviewRows adds the operator's rows from a review entered from
	// the group's state.
	groupReviewRows := func(g Group, rev string) {
		sp := d.compiled.groups[g.Name]
		st := StateName(g.Name)
		cmds := memberSubsets(sp)
		for _, c := range cmds {
			add(rev, TriggerOperatorRetry, dest{st, c})
		}
		addAll(rev, TriggerOperatorRetry, advances(sp.last))
		compensateReview(rev, compensateOver(sp.last, always,
			func(k int) bool { return !steps[k].Conditional && !memberOf(k, g.Name) })...)
	}

	addAll("", TriggerStart, forward(-1, false))
	for _, g := range d.Groups {
		groupRows(g)
	}
	// Waiting for step i: steps before it succeeded, External steps after
	// it may hold an event recorded in review, nothing else is settled.
	for i, s := range steps {
		if s.Group != "" {
			continue // see groupRows
		}
		st := StateName(s.Name)
		for _, r := range s.SuccessReplies {
			addAll(st, r, advances(i))
		}
		for _, r := range s.FailureReplies {
			add(st, r, failed(i)...)
		}
		if !s.External {
			toReview(st, lateReview(s)...) // a reply to an earlier attempt
		}
		for k := range steps[:i] {
			toReview(st, conflictsPassed(k)...)
		}
		for _, next := range steps[i+1:] {
			if next.External {
				toReview(st, conflictsWithAny(next)...) // an event recorded early
			}
		}
		switch s.OnTimeout {
		case TimeoutCompensate:
			add(st, TriggerTimeout, compensateAt(i)...)
		case TimeoutRetry:
			if s.maxAttempts() > 1 {
				add(st, TriggerTimeout, enter(i))
			}
			toReview(st, TriggerTimeout)
		default:
			toReview(st, TriggerTimeout)
		}
		if d.Deadline > 0 {
			toReview(st, TriggerDeadline)
		}
		toReview(st, TriggerStuck)
		add(st, TriggerOperatorRetry, enter(i))
		add(st, TriggerOperatorCompensate, compensateAt(i)...)
		add(st, TriggerOperatorCancel, dest{StateCancelled, nil})
		if cancel != "" && s.Role != RoleRetriable {
			// Before the point of no return: stop and compensate.
			add(st, cancel, cancelled(compensateAt(i))...)
		}
	}
	// Compensating step j: any step may be settled (by any reply, for steps
	// at or after j), later compensations succeeded, stopped steps after
	// the compensatable ones are not covered by a compensation.
	for j, s := range steps {
		if s.Role != RoleCompensatable {
			continue
		}
		st := CompensatingStateName(s.Name)
		resend := dest{st, []string{s.Compensation}}
		addEndBelow(st, s.CompensationReply, j)
		toReview(st, s.CompensationFailureReplies...)
		// A compensation failure recorded before the saga was resolved and
		// an operator compensated it again.
		toReview(st, compensationConflicts(s)...)
		for k, o := range steps {
			if k < j && memberOf(k, s.Group) {
				// A member before j may have stopped, and be
				// compensated after j.
				toReview(st, lateSuccessReview(o)...)
			}
			if k < j && !memberOf(k, s.Group) {
				toReview(st, conflictsPassed(k)...)
			} else {
				toReview(st, conflictsWithAny(o)...)
			}
			if k > j && o.Role == RoleCompensatable {
				toReview(st, o.CompensationFailureReplies...)
			}
			if k >= j {
				// A late success of a step that stopped waiting: not
				// yet compensated, compensated, or never to be (the
				// steps before j completed before j ran).
				toReview(st, lateSuccessReview(o)...)
			}
		}
		if s.maxAttempts() > 1 {
			add(st, TriggerTimeout, resend)
		}
		toReview(st, TriggerTimeout)
		toReview(st, TriggerStuck)
		add(st, TriggerOperatorRetry, resend)
		add(st, TriggerOperatorCancel, dest{StateCancelled, nil})
	}
	if d.CompensableAfterCompletion() {
		// A child's parent compensates it after it completed: from any
		// compensatable step that may have run (an operator's resolve
		// reaches COMPLETED from anywhere), or straight to CANCELLED.
		add(StateCompleted, cancel, cancelled(compensateOver(len(steps)-1, always, func(int) bool { return false }))...)
	}
	// Terminal states.
	for k, s := range steps {
		toReview(StateCompleted, conflictsPassed(k)...)
		// An operator's cancel stops any step, or abandons a
		// compensation; any step may stop before a saga fails.
		toReview(StateCancelled, lateSuccessReview(s)...)
		toReview(StateCancelled, undoneCompensationReview(s)...)
		toReview(StateFailed, lateSuccessReview(s)...)
	}
	sources := map[string]bool{}
	for _, r := range rows {
		if r.To == StateManualReview {
			sources[r.From] = true
		}
	}
	if len(sources) == 0 {
		return d.sortRows(rows)
	}
	rev := StateManualReview
	// stoppedInReview reports whether the saga can be in review with step
	// k stopped and unsettled, so that a resolve leaves it stopped: always
	// when compensations exist (stop k by an operator compensation, let
	// the compensation time out), otherwise when review can be entered from
	// step k without settling it, or from a later state by a conflict.
	hasCompensation := compensateFrom(len(steps))[0].state != StateFailed
	stoppedInReview := func(k int) bool {
		if hasCompensation {
			return true
		}
		st := StateName(steps[k].Name)
		for _, r := range rows {
			if r.From == st && r.To == rev && !slices.Contains(replies(steps[k]), r.Trigger) {
				return true
			}
		}
		for prev := range steps[:k] {
			if len(conflictsPassed(prev)) > 0 {
				return true
			}
		}
		return false
	}
	// Manual review is reachable; through resolve, any terminal state may
	// hold any outcome.
	for _, t := range []string{StateCompleted, StateFailed, StateCancelled} {
		for k, s := range steps {
			toReview(t, conflictsWithAny(s)...)
			toReview(t, compensationConflicts(s)...)
			if t == StateCompleted {
				if stoppedInReview(k) {
					toReview(t, lateFailureReview(s)...)
				}
				toReview(t, doneCompensationReview(s)...)
			} else {
				if stoppedInReview(k) {
					toReview(t, lateSuccessReview(s)...)
				}
				toReview(t, undoneCompensationReview(s)...)
			}
		}
	}
	for _, s := range steps {
		toReview(rev, conflictsWithAny(s)...)
		toReview(rev, compensationConflicts(s)...)
	}
	if d.Deadline > 0 {
		for _, r := range rows {
			// The deadline fires once, and stuck clears it: review
			// entered by either has no deadline armed; any other way
			// from the forward path keeps it (an event of a later step
			// conflicting with one recorded early included).
			from := d.compiled.states[r.From]
			if r.To == rev && r.Trigger != TriggerDeadline && r.Trigger != TriggerStuck &&
				(from.Kind == StateKindStep || from.Kind == StateKindGroup) {
				toReview(rev, TriggerDeadline)
				break
			}
		}
	}
	terminalSource := false
	for _, g := range d.Groups {
		if sources[StateName(g.Name)] {
			groupReviewRows(g, rev)
		}
	}
	for i, s := range steps {
		if st := StateName(s.Name); sources[st] && s.Group == "" {
			// Review entered from step i: a success of step i recorded in
			// review lets a retry continue; a review entered without
			// recording a success lets it resend, and lets a failure be
			// recorded, which leaves step i out of the compensation.
			addAll(rev, TriggerOperatorRetry, advances(i))
			compensateReview(rev, compensateAt(i)...)
			for _, r := range rows {
				if r.From == st && r.To == rev && !slices.Contains(s.SuccessReplies, r.Trigger) {
					add(rev, TriggerOperatorRetry, enter(i))
					if len(s.FailureReplies) > 0 {
						compensateReview(rev, compensateFrom(i-1)...)
					}
					break
				}
			}
		}
		if s.Role == RoleCompensatable && sources[CompensatingStateName(s.Name)] {
			resend := dest{CompensatingStateName(s.Name), []string{s.Compensation}}
			add(rev, TriggerOperatorRetry, resend)
			addEndBelow(rev, TriggerOperatorRetry, i)
			compensateReview(rev, resend)
			addEndBelow(rev, TriggerOperatorCompensate, i)
		}
	}
	for _, t := range []string{StateCompleted, StateFailed, StateCancelled} {
		terminalSource = terminalSource || sources[t]
	}
	if terminalSource {
		// A saga a business cancel stopped reaches review from a terminal
		// state too: through a compensation's review and a resolve when
		// there are compensations, otherwise by a late reply of the step
		// (a check or the pivot) it stopped, or by
		// an event conflicting with one of a later external step that was
		// recorded in a review before the cancel (the saga was in review
		// at a step a cancel stops, then retried), or by a reply
		// conflicting with a check step that completed before the step
		// the cancel stopped.
		endAt := add
		lateStopped := slices.ContainsFunc(steps, func(s Step) bool { return s.Role != RoleRetriable && s.Late == LateManualReview })
		recordedEarly := steps[0].Role != RoleRetriable && slices.ContainsFunc(steps[1:], func(s Step) bool {
			return s.External && len(conflictsWithAny(s)) > 0
		})
		checkConflict := false
		for m, s := range steps {
			checkConflict = checkConflict || (s.Role == RoleCheck && len(conflictsWithSuccess(s)) > 0 &&
				slices.ContainsFunc(steps[m+1:], func(s Step) bool { return s.Role != RoleRetriable }))
		}
		if cancel != "" && (hasCompensation || recordedEarly || checkConflict || lateStopped) {
			endAt = addEnd
		}
		for i := range steps {
			endAt(rev, TriggerOperatorCompensate, compensateFrom(i)...)
		}
		endAt(rev, TriggerOperatorCompensate, dest{StateFailed, nil})
	}
	for _, t := range []string{StateCompleted, StateFailed, StateCancelled} {
		add(rev, TriggerOperatorResolve, dest{t, nil})
	}
	add(rev, TriggerOperatorCancel, dest{StateCancelled, nil})
	return d.sortRows(rows)
}

// sortRows orders the table: by from state (in States order, the start row
// first), trigger (messages in step order, then timeout, deadline and the
// operator actions), to state, emitted messages.
func (d *Definition) sortRows(rows rowSet) []Transition {
	ix := d.compiled
	out := make([]Transition, 0, len(rows))
	for _, t := range rows {
		out = append(out, t)
	}
	rank := func(state string) int {
		if state == "" {
			return -1
		}
		return ix.stateRank[state]
	}
	slices.SortFunc(out, func(a, b Transition) int {
		return cmp.Or(
			cmp.Compare(rank(a.From), rank(b.From)),
			cmp.Compare(ix.trigRank[a.Trigger], ix.trigRank[b.Trigger]),
			cmp.Compare(rank(a.To), rank(b.To)),
			slices.Compare(a.Emits, b.Emits),
		)
	})
	return out
}

// Mermaid renders the transition table as a Mermaid stateDiagram-v2. Rows
// between the same two states share one arrow, labelled with one line per
// trigger ("trigger / emitted messages", short names). It returns "" before
// Compile.
func (d *Definition) Mermaid() string {
	if d.compiled == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("stateDiagram-v2\n")
	for _, e := range d.Edges() {
		from := e.From
		if from == "" {
			from = "[*]"
		}
		fmt.Fprintf(&b, "    %s --> %s : %s\n", from, e.To, strings.Join(e.Lines, "<br/>"))
	}
	for _, s := range d.States {
		if s.Kind == StateKindTerminal {
			fmt.Fprintf(&b, "    %s --> [*]\n", s.Name)
		}
	}
	for _, s := range d.Steps {
		if s.Conditional {
			fmt.Fprintf(&b, "    note right of %s : conditional, the decider may skip it\n", StateName(s.Name))
		}
		if s.Child != "" {
			fmt.Fprintf(&b, "    note right of %s : starts child saga %s\n", StateName(s.Name), shortName(s.Child))
		}
	}
	// A parallel group is a composite state: a fork sends every member,
	// a join waits for them all.
	for _, g := range d.Groups {
		st := StateName(g.Name)
		fmt.Fprintf(&b, "    state %s {\n", st)
		fmt.Fprintf(&b, "        state %s_fork <<fork>>\n", st)
		fmt.Fprintf(&b, "        state %s_join <<join>>\n", st)
		fmt.Fprintf(&b, "        [*] --> %s_fork\n", st)
		for _, m := range d.Members(g.Name) {
			fmt.Fprintf(&b, "        %s_fork --> %s_%s\n", st, st, StateName(m))
			fmt.Fprintf(&b, "        %s_%s --> %s_join\n", st, StateName(m), st)
		}
		fmt.Fprintf(&b, "        %s_join --> [*]\n", st)
		b.WriteString("    }\n")
	}
	return b.String()
}

// Edge is the rows of the transition table between two states, merged into
// one arrow of a diagram.
type Edge struct {
	From, To string // From is "" for the start row
	// Triggers are the rows' distinct triggers, short names ("timeout",
	// "InventoryReserved", "operator.retry"), in table order.
	Triggers []string
	// Lines are the rows' distinct "trigger / emitted messages" lines.
	Lines []string
}

// Edges merges the rows of the transition table by (from, to), in table
// order: the arrows of the Mermaid diagram and of the console's SVG.
func (d *Definition) Edges() []Edge {
	var out []Edge
	at := map[[2]string]int{}
	for _, t := range d.Transitions {
		k := [2]string{t.From, t.To}
		i, ok := at[k]
		if !ok {
			i = len(out)
			at[k] = i
			out = append(out, Edge{From: t.From, To: t.To})
		}
		e := &out[i]
		trig := shortName(t.Trigger)
		if strings.HasPrefix(t.Trigger, "operator.") {
			trig = t.Trigger
		}
		l := trig
		if len(t.Emits) > 0 {
			short := make([]string, len(t.Emits))
			for i, m := range t.Emits {
				short[i] = shortName(m)
			}
			l += " / " + strings.Join(short, ", ")
		}
		if !slices.Contains(e.Triggers, trig) {
			e.Triggers = append(e.Triggers, trig)
		}
		if !slices.Contains(e.Lines, l) {
			e.Lines = append(e.Lines, l)
		}
	}
	return out
}
