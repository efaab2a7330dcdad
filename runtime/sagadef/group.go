package sagadef

import (
	"fmt"
	"slices"
	"time"
)

// A parallel group (Definition.Groups) is one state, named after the
// group, in which the saga waits on every member at once. Progress.Group
// holds the members still waiting: each one's pending command id, attempt
// and timeout, so classification (new, duplicate, late, conflicting) works
// per member exactly as it does for a step waited on alone. Instance
// TimeoutAt is the earliest of the group's timeout and the waiting
// members'; Instance.PendingMessageID and Attempt are unused (empty, 0)
// in a group state.

// span is the positions of a group's members (consecutive steps) and the
// group's timeout.
type span struct {
	first, last int
	timeout     time.Duration
}

func (g *GroupProgress) clone() *GroupProgress {
	if g == nil {
		return nil
	}
	cp := *g
	cp.Members = slices.Clone(g.Members)
	return &cp
}

// member returns the waiting member of the given step, or false.
func (g *GroupProgress) member(step string) (MemberProgress, bool) {
	if g == nil {
		return MemberProgress{}, false
	}
	for _, m := range g.Members {
		if m.Step == step {
			return m, true
		}
	}
	return MemberProgress{}, false
}

// validateGroups checks the groups and their members and records each
// group's span in ix: a group is declared once under an identifier no step
// has, with a positive timeout; its members are at least two consecutive
// steps, none of them the pivot, External or Conditional, all before the
// point of no return or all after it.
func (d *Definition) validateGroups(ix *index, fail func(step, format string, args ...any), claimState func(step, state string)) {
	declared := map[string]Group{}
	for i, g := range d.Groups {
		label := fmt.Sprintf("group %s", g.Name)
		switch _, step := ix.steps[g.Name]; {
		case !isIdent(g.Name):
			fail(fmt.Sprintf("group #%d", i+1), "name %q is not an identifier", g.Name)
			continue
		case step:
			fail(label, "has the name of a step; its state is named after it")
			continue
		}
		if _, dup := declared[g.Name]; dup {
			fail(label, "is declared twice")
			continue
		}
		declared[g.Name] = g
		claimState(label, StateName(g.Name))
		if g.Timeout <= 0 {
			fail(label, "timeout %s is not positive; every wait needs a bound", g.Timeout)
		}
	}
	for i, s := range d.Steps {
		if s.Group == "" {
			continue
		}
		g, ok := declared[s.Group]
		if !ok {
			fail(s.Name, "names group %q, which the saga does not declare", s.Group)
			continue
		}
		sp, seen := ix.groups[s.Group]
		if seen && sp.last != i-1 {
			fail(s.Name, "joins group %s, whose members are not right before it; a group is one run of consecutive steps", s.Group)
		}
		if !seen {
			sp = span{first: i, timeout: g.Timeout}
		}
		sp.last = i
		ix.groups[s.Group] = sp
		switch {
		case s.Role == RolePivot:
			fail(s.Name, "the pivot is a member of group %s; the point of no return runs alone", s.Group)
		case s.External:
			fail(s.Name, "external step is a member of group %s; members send commands", s.Group)
		case s.Conditional:
			fail(s.Name, "conditional step is a member of group %s; members always run", s.Group)
		}
		if seen && (s.Role == RoleRetriable) != (d.Steps[sp.first].Role == RoleRetriable) {
			fail(s.Name, "group %s mixes retriable steps with steps before the point of no return", s.Group)
		}
	}
	for _, g := range d.Groups {
		if _, ok := declared[g.Name]; !ok {
			continue
		}
		switch sp, ok := ix.groups[g.Name]; {
		case !ok:
			fail("group "+g.Name, "has no members")
		case sp.first == sp.last:
			fail("group "+g.Name, "has one member, %s; a group runs at least two", d.Steps[sp.first].Name)
		}
	}
}

// GroupOf returns the group step belongs to, or false when it runs alone
// (or before Compile).
func (d *Definition) GroupOf(step string) (Group, bool) {
	for _, s := range d.Steps {
		if s.Name == step && s.Group != "" {
			for _, g := range d.Groups {
				if g.Name == s.Group {
					return g, true
				}
			}
		}
	}
	return Group{}, false
}

// Members returns the names of the members of the named group, in
// contract order.
func (d *Definition) Members(group string) []string {
	var out []string
	for _, s := range d.Steps {
		if s.Group == group && group != "" {
			out = append(out, s.Name)
		}
	}
	return out
}

// enterGroup waits on the named group: it sends the command of every
// member that has not completed, in one transition, and arms the members'
// and the group's timeouts. With every member completed (an operator's
// retry after their successes were recorded in review), the saga goes on.
func (w *work) enterGroup(name string) error {
	sp := w.d.compiled.groups[name]
	w.leaveReview()
	w.resumeForward()
	p := w.progress()
	p.Group = nil
	w.out.State = StateName(name)
	w.out.Attempt = 0
	w.out.PendingMessageID = ""
	gp := &GroupProgress{Name: name, TimeoutAt: w.env.Now.Add(sp.timeout)}
	for j := sp.first; j <= sp.last; j++ {
		s := w.step(j)
		if slices.Contains(p.Completed, s.Name) {
			continue
		}
		p.Stopped = without(p.Stopped, s.Name)
		id, err := w.send(s.Command, s.Name, &p.Sent)
		if err != nil {
			return err
		}
		gp.Members = append(gp.Members, MemberProgress{Step: s.Name, Pending: id, Attempt: 1, TimeoutAt: w.env.Now.Add(s.Timeout)})
		w.note("sent %s for step %s of group %s (attempt 1 of %d)", shortName(s.Command), s.Name, name, s.maxAttempts())
	}
	if len(gp.Members) == 0 {
		w.note("every member of group %s succeeded", name)
		return w.advance(sp.last)
	}
	p.Group = gp
	w.armGroup()
	return nil
}

// armGroup sets TimeoutAt to the earliest timer of the group waited on.
func (w *work) armGroup() {
	gp := w.out.Progress.Group
	at := gp.TimeoutAt
	for _, m := range gp.Members {
		if m.TimeoutAt.Before(at) {
			at = m.TimeoutAt
		}
	}
	w.out.TimeoutAt = at
}

// waitingMember reports whether the saga waits, in its group state, on
// step's command, and whether causation names the pending attempt.
func (w *work) waitingMember(s *Step, causation string) (waiting, pending bool) {
	if s.Group == "" || w.in.State != StateName(s.Group) {
		return false, false
	}
	m, ok := w.in.Progress.Group.member(s.Name)
	return ok, ok && causation == m.Pending
}

// concludeMember continues after member i of the group waited on was
// settled by reply: a success leaves the group's wait, and the last one
// joins the group; a failure stops the members still waiting and
// compensates (after the pivot it goes to manual review instead).
func (w *work) concludeMember(i int, success bool, reply string) error {
	s := w.step(i)
	p := w.progress()
	p.Group.Members = slices.DeleteFunc(p.Group.Members, func(m MemberProgress) bool { return m.Step == s.Name })
	if success {
		p.Completed = append(p.Completed, s.Name)
		w.note("step %s of group %s succeeded with %s", s.Name, s.Group, shortName(reply))
		if len(p.Group.Members) == 0 {
			p.Group = nil
			w.note("every member of group %s succeeded", s.Group)
			return w.advance(w.d.compiled.groups[s.Group].last)
		}
		w.armGroup()
		return nil
	}
	w.out.LastError = fmt.Sprintf("step %s failed with %s", s.Name, shortName(reply))
	if s.Role == RoleRetriable {
		w.review(fmt.Sprintf("retriable step %s of group %s failed with %s; steps after the pivot must not fail", s.Name, s.Group, shortName(reply)))
		return nil
	}
	w.note("step %s of group %s failed with %s; stopping the members still waiting and compensating", s.Name, s.Group, shortName(reply))
	w.stopGroup()
	return w.compensate()
}

// stopGroup ends the wait on a group: its members still waiting (without
// an outcome recorded in review) stop, so that compensation covers them.
func (w *work) stopGroup() {
	p := w.progress()
	if p.Group == nil {
		return
	}
	for _, m := range p.Group.Members {
		w.stop(m.Step)
	}
	p.Group = nil
}

// completeRecorded adds to Completed the members of the group the saga
// waited on whose success was recorded in manual review.
func (w *work) completeRecorded(group string) {
	p := w.progress()
	sp := w.d.compiled.groups[group]
	for j := sp.first; j <= sp.last; j++ {
		name := w.step(j).Name
		if rec, ok := p.Outcomes[name]; ok && w.isSuccess(rec) && !slices.Contains(p.Completed, name) {
			p.Completed = append(p.Completed, name)
		}
	}
}

// timerDue reports whether the timer of name (a group or a member) armed
// at at has fired; dry explorations pick one timer at a time.
func (w *work) timerDue(name string, at time.Time) bool {
	if w.mode.timer != "" {
		return w.mode.timer == name
	}
	return w.due(at)
}

// onGroupTimeout applies the due timers of the group waited on. A
// member's timeout applies its TimeoutAction to it alone: compensate stops
// the group as its failure would, manual review (or a spent retry budget)
// parks the saga; the first member in contract order whose timer ends the
// wait decides, so a member's own policy applies when it falls due with
// the group's. Then the group's own timeout stops every waiting member and
// compensates (after the pivot: manual review). Otherwise the first due
// member that retries resends only its command, and the others, still
// due, at the next timeout: one command per timeout, as for a step waited
// on alone.
func (w *work) onGroupTimeout(name string) error {
	gp := w.in.Progress.Group
	sp := w.d.compiled.groups[name]
	if gp == nil {
		w.noop(ClassLate, "stale timeout: group %s waits on no member", name)
		return nil
	}
	retry := -1
	for k, m := range gp.Members {
		if !w.timerDue(m.Step, m.TimeoutAt) {
			continue
		}
		s := w.step(w.stepIndex(m.Step))
		switch s.OnTimeout {
		case TimeoutCompensate:
			w.class = ClassNew
			w.out.LastError = fmt.Sprintf("step %s timed out after %s", s.Name, s.Timeout)
			w.note("step %s of group %s timed out; stopping the members still waiting and compensating", s.Name, name)
			w.stopGroup()
			return w.compensate()
		case TimeoutRetry:
			if m.Attempt < s.maxAttempts() {
				if retry < 0 {
					retry = k
				}
				continue
			}
			w.class = ClassNew
			w.out.LastError = fmt.Sprintf("step %s: retry budget exhausted after %d attempts", s.Name, m.Attempt)
			w.review(w.out.LastError)
			return nil
		default:
			w.class = ClassNew
			w.out.LastError = fmt.Sprintf("step %s timed out after %s", s.Name, s.Timeout)
			w.review(w.out.LastError)
			return nil
		}
	}
	if w.timerDue(name, gp.TimeoutAt) {
		w.class = ClassNew
		w.out.LastError = fmt.Sprintf("group %s timed out after %s", name, sp.timeout)
		if w.step(sp.first).Role == RoleRetriable {
			w.review(w.out.LastError)
			return nil
		}
		w.note("group %s timed out; stopping the members still waiting and compensating", name)
		w.stopGroup()
		return w.compensate()
	}
	if retry < 0 {
		w.noop(ClassLate, "stale timeout: no timer of group %s is due", name)
		return nil
	}
	w.class = ClassNew
	p := w.progress()
	m := &p.Group.Members[retry]
	s := w.step(w.stepIndex(m.Step))
	id, err := w.send(s.Command, s.Name, &p.Sent)
	if err != nil {
		return err
	}
	m.Pending, m.Attempt, m.TimeoutAt = id, m.Attempt+1, w.env.Now.Add(s.Timeout)
	w.note("step %s of group %s unanswered after %s; resent %s (attempt %d of %d)",
		s.Name, name, s.Timeout, shortName(s.Command), m.Attempt, s.maxAttempts())
	w.armGroup()
	return nil
}

// retryGroupFromReview is an operator's retry of the group the saga waited
// on when it entered manual review: members whose success was recorded
// count as completed, a recorded failure is retried (counted, see
// retriedAfterFailure), and the group is entered again for the rest.
func (w *work) retryGroupFromReview(group string) error {
	p := w.progress()
	sp := w.d.compiled.groups[group]
	for j := sp.first; j <= sp.last; j++ {
		s := w.step(j)
		rec, ok := p.Outcomes[s.Name]
		if !ok || slices.Contains(p.Completed, s.Name) {
			continue
		}
		if w.isSuccess(rec) {
			p.Completed = append(p.Completed, s.Name)
			w.note("step %s succeeded with %s while in review", s.Name, shortName(rec))
			continue
		}
		delete(p.Outcomes, s.Name)
		w.retriedAfterFailure(s.Command)
		w.note("retrying step %s despite %s", s.Name, shortName(rec))
	}
	return w.enterGroup(group)
}

// groupOrder reorders ran (steps in the order they ran) so that the
// members of each group stand in contract order where the group's first
// one ran: members run together, and are compensated in reverse contract
// order.
func (w *work) groupOrder(ran []string) []string {
	if len(w.d.Groups) == 0 {
		return ran
	}
	out := make([]string, 0, len(ran))
	done := map[string]bool{}
	for _, name := range ran {
		i, known := w.d.compiled.steps[name]
		if !known || w.step(i).Group == "" {
			out = append(out, name)
			continue
		}
		g := w.step(i).Group
		if done[g] {
			continue
		}
		done[g] = true
		sp := w.d.compiled.groups[g]
		for j := sp.first; j <= sp.last; j++ {
			if m := w.step(j).Name; slices.Contains(ran, m) {
				out = append(out, m)
			}
		}
	}
	return out
}
