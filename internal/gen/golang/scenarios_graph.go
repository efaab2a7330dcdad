package golang

import (
	"slices"

	"github.com/protosaga/saga/runtime/sagadef"
)

// The generated scenario tests are computed here from a saga's step graph
// (its steps' roles, replies, timeout actions, attempt budgets and late
// policies) by the rules docs/options.md states, never by running the
// state machine: they are a second, independent statement of what the
// definition implies, which the harness then holds runtime/sagadef to.
//
// For every step the scenarios reach it by answering the steps before it
// with their first success reply, then apply one of: a business failure
// (and, when that compensates, a failure of the first compensation), a
// timeout (every attempt), a late success reply to the step's first
// command once the saga stopped waiting for it, and a duplicate of the
// step's success reply. A happy path completes the saga.
//
// Check steps have nothing to undo: their failure and timeout compensate
// the compensatable steps before them, and compensation passes over them.
// Conditional steps run unless a scenario skips them (sagatest's runner
// decides them as the scenario says): for each conditional step one
// scenario skips it on the happy path (it sends nothing, is never
// compensated, and the saga waits on the next step), and when skipping it
// changes what a later step's failure or timeout compensates (it is
// compensatable), that step's scenarios are repeated with it skipped.
//
// A parallel group is entered with every member's command sent at once.
// A member's failure scenarios fail it while the other members still wait
// (they stop and are compensated, in reverse contract order with the
// completed ones); its timeout and late-reply scenarios first answer the
// other members, so that its own timer is the one that fires; its
// duplicate scenario repeats its success while the others wait. Replies
// to members name their step (sagatest answers that member's command).

// scenario and move mirror sagatest.Scenario and sagatest.Move, which the
// emitter writes them as (the generator does not link package testing).
type scenario struct {
	Name        string
	Moves       []move
	Final       string
	Compensated []string
	Skipped     []string
	// undo lists the steps the compensation undoes when the scenario
	// compensates (not emitted): the skip variants of a step's scenarios
	// are kept where it differs.
	undo        []string
	compensates bool
}

type move struct {
	Do      moveKind
	Step    string
	Message string
	State   string
	Class   sagadef.Class
	Sent    []string
}

// moveKind names a sagatest.MoveKind constant.
type moveKind string

const (
	moveStart        moveKind = "MoveStart"
	moveReply        moveKind = "MoveReply"
	moveEarlierReply moveKind = "MoveEarlierReply"
	moveTimeout      moveKind = "MoveTimeout"
	moveDuplicate    moveKind = "MoveDuplicate"
)

// stepKind is what a kind of step does in the scenarios. Each step maps
// to one kind (kindOf); a new kind of step adds a row here.
type stepKind struct {
	// sends is set when the step sends a command (an External step waits
	// for an event).
	sends bool
	// failureReviews is set when a business failure sends the saga to
	// manual review instead of compensating.
	failureReviews bool
	// undone is set when a later failure compensates the step.
	undone bool
}

// kindOf returns the scenario behaviour of step s. A pivot and a check
// step are alike here: their failure compensates the steps before them,
// and nothing undoes them (a check step has nothing to undo; past the
// pivot nothing compensates).
func kindOf(s *sagadef.Step) stepKind {
	k := stepKind{sends: !s.External}
	switch s.Role {
	case sagadef.RoleCompensatable:
		k.undone = true
	case sagadef.RoleRetriable:
		k.failureReviews = true
	case sagadef.RolePivot, sagadef.RoleCheck:
	}
	return k
}

// attempts is how many times a step's command (or compensation) is sent.
func attempts(s *sagadef.Step) int { return max(s.MaxAttempts, 1) }

// lateOutcome is what a success reply to a step's earlier command does:
// the step's late-reply policy decides while the step waits for a later
// attempt, and when the saga compensates or failed (a success contradicts
// it); in manual review it is recorded.
type lateOutcome int

const (
	lateAudited  lateOutcome = iota + 1 // audited, nothing changes
	lateApplied                         // settles the step as the awaited reply
	lateReviewed                        // recorded; the saga goes to manual review
	lateRecorded                        // recorded in manual review
)

// lateOn returns what a late success reply of a step with policy p does
// when the saga waits for a later attempt of the step (waiting), is in
// manual review (inReview), or neither (it compensates or failed).
func lateOn(p sagadef.LatePolicy, waiting, inReview bool) lateOutcome {
	switch {
	case inReview:
		return lateRecorded
	case waiting && p == sagadef.LateApplyIfWaiting:
		return lateApplied
	case p == sagadef.LateManualReview:
		return lateReviewed
	default:
		return lateAudited
	}
}

// walk builds one scenario.
type walk struct {
	steps []sagadef.Step
	sc    scenario
	// completed and stopped are the steps that succeeded, and the steps
	// that stopped waiting without an answer, in order.
	completed []string
	stopped   []string
	state     string
	// skip lists the conditional steps the scenario skips; skipped those
	// the saga passed over so far, and at the step it waits on.
	skip    []string
	skipped []string
	at      int
}

func (w *walk) move(m move) {
	w.state = m.State
	w.sc.Moves = append(w.sc.Moves, m)
}

func (w *walk) send(i int) []string {
	if s := &w.steps[i]; kindOf(s).sends {
		return []string{s.Command}
	}
	return nil
}

// enter is the state and messages of going forward to step i: waiting on
// it, or, past the conditional steps from i on that the scenario skips,
// on the next step (COMPLETED past the last step).
func (w *walk) enter(i int) (string, []string) {
	for i < len(w.steps) && w.steps[i].Conditional && slices.Contains(w.skip, w.steps[i].Name) {
		w.skipped = append(w.skipped, w.steps[i].Name)
		i++
	}
	w.at = i
	if i >= len(w.steps) {
		return sagadef.StateCompleted, nil
	}
	if first, last, ok := groupSpan(w.steps, i); ok {
		var sent []string
		for m := first; m <= last; m++ {
			sent = append(sent, w.send(m)...)
		}
		return sagadef.StateName(w.steps[i].Group), sent
	}
	return sagadef.StateName(w.steps[i].Name), w.send(i)
}

// start begins the saga, skipping the conditional steps listed in skip,
// and answers the steps it waits on with success until it reaches step i.
func start(steps []sagadef.Step, skip []string, name string, i int) *walk {
	w := &walk{steps: steps, sc: scenario{Name: name}, skip: skip}
	st, sent := w.enter(0)
	w.move(move{Do: moveStart, State: st, Sent: sent})
	for w.at < i && !sameGroup(steps, w.at, i) {
		w.succeedAll(w.at)
	}
	return w
}

// succeed answers step i with its first success reply.
func (w *walk) succeed(i int, class sagadef.Class) {
	s := &w.steps[i]
	w.completed = append(w.completed, s.Name)
	if _, last, ok := groupSpan(w.steps, i); ok {
		st, sent := w.state, []string(nil)
		if w.groupDone(i) {
			st, sent = w.enter(last + 1)
		}
		w.move(move{Do: moveReply, Step: s.Name, Message: s.SuccessReplies[0], State: st, Class: class, Sent: sent})
		return
	}
	st, sent := w.enter(i + 1)
	w.move(move{Do: moveReply, Message: s.SuccessReplies[0], State: st, Class: class, Sent: sent})
}

// chain returns the steps a compensation undoes, in order: the
// compensatable steps that completed or stopped waiting, latest first.
func (w *walk) chain() []*sagadef.Step {
	ran := slices.Clone(w.completed)
	for _, s := range w.stopped {
		if !slices.Contains(ran, s) {
			ran = append(ran, s)
		}
	}
	ran = groupOrder(w.steps, ran)
	var out []*sagadef.Step
	for k := len(ran) - 1; k >= 0; k-- {
		for i := range w.steps {
			if s := &w.steps[i]; s.Name == ran[k] && kindOf(s).undone {
				out = append(out, s)
			}
		}
	}
	return out
}

// compensating returns the state and messages of beginning compensation:
// the first compensation of the chain, or FAILED with nothing to undo.
func (w *walk) compensating() (string, []string) {
	c := w.chain()
	w.sc.compensates = true
	w.sc.undo = nil
	for _, s := range c {
		w.sc.undo = append(w.sc.undo, s.Name)
	}
	if len(c) == 0 {
		return sagadef.StateFailed, nil
	}
	return sagadef.CompensatingStateName(c[0].Name), []string{c[0].Compensation}
}

// compensateAll answers every compensation of the chain with success.
func (w *walk) compensateAll() {
	c := w.chain()
	for k, s := range c {
		st, sent := sagadef.StateFailed, []string(nil)
		if k+1 < len(c) {
			st, sent = sagadef.CompensatingStateName(c[k+1].Name), []string{c[k+1].Compensation}
		}
		w.move(move{Do: moveReply, Message: s.CompensationReply, State: st, Class: sagadef.ClassNew, Sent: sent})
		w.sc.Compensated = append(w.sc.Compensated, s.Name)
	}
}

// failCompensation makes the first compensation of the chain fail: with
// its failure reply, or by its timeouts when it declares none.
func (w *walk) failCompensation() {
	s := w.chain()[0]
	if len(s.CompensationFailureReplies) > 0 {
		w.move(move{Do: moveReply, Message: s.CompensationFailureReplies[0], State: sagadef.StateManualReview, Class: sagadef.ClassNew})
		return
	}
	for range attempts(s) - 1 {
		w.move(move{Do: moveTimeout, State: w.state, Class: sagadef.ClassNew, Sent: []string{s.Compensation}})
	}
	w.move(move{Do: moveTimeout, State: sagadef.StateManualReview, Class: sagadef.ClassNew})
}

// fail answers step i with its first failure reply.
func (w *walk) fail(i int) {
	s := &w.steps[i]
	step := ""
	if s.Group != "" {
		step = s.Name
	}
	if kindOf(s).failureReviews {
		w.move(move{Do: moveReply, Step: step, Message: s.FailureReplies[0], State: sagadef.StateManualReview, Class: sagadef.ClassNew})
		return
	}
	w.stopGroup(i)
	st, sent := w.compensating()
	w.move(move{Do: moveReply, Step: step, Message: s.FailureReplies[0], State: st, Class: sagadef.ClassNew, Sent: sent})
}

// timeout fires step i's timeout once.
func (w *walk) timeout(i int, attempt int) {
	s := &w.steps[i]
	switch s.OnTimeout {
	case sagadef.TimeoutCompensate:
		w.stopped = append(w.stopped, s.Name)
		w.stopGroup(i)
		st, sent := w.compensating()
		w.move(move{Do: moveTimeout, State: st, Class: sagadef.ClassNew, Sent: sent})
	case sagadef.TimeoutRetry:
		if attempt < attempts(s) {
			w.move(move{Do: moveTimeout, State: w.state, Class: sagadef.ClassNew, Sent: w.send(i)})
			return
		}
		w.move(move{Do: moveTimeout, State: sagadef.StateManualReview, Class: sagadef.ClassNew})
	default:
		w.move(move{Do: moveTimeout, State: sagadef.StateManualReview, Class: sagadef.ClassNew})
	}
}

// timeouts fires step i's timeout until the step stops waiting.
func (w *walk) timeouts(i int) {
	waiting := stateOf(w.steps, i)
	for a := 1; w.state == waiting; a++ {
		w.timeout(i, a)
	}
}

// earlierSuccess answers step i's first command with its success reply
// once the saga stopped waiting for that command.
func (w *walk) earlierSuccess(i int) {
	s := &w.steps[i]
	waiting := w.state == stateOf(w.steps, i)
	m := move{Do: moveEarlierReply, Step: s.Name, Message: s.SuccessReplies[0], State: w.state, Class: sagadef.ClassLate}
	switch lateOn(s.Late, waiting, w.state == sagadef.StateManualReview) {
	case lateApplied:
		w.completed = append(w.completed, s.Name)
		if _, last, ok := groupSpan(w.steps, i); ok {
			if w.groupDone(i) {
				m.State, m.Sent = w.enter(last + 1)
			}
			break
		}
		m.State, m.Sent = w.enter(i + 1)
	case lateReviewed:
		m.State = sagadef.StateManualReview
	}
	w.move(m)
}

func (w *walk) done() scenario {
	w.sc.Final = w.state
	w.sc.Skipped = w.skipped
	return w.sc
}

// graphScenarios returns the scenarios of a saga with the given steps.
func graphScenarios(steps []sagadef.Step) []scenario {
	var out []scenario
	w := start(steps, nil, "complete", len(steps))
	out = append(out, w.done())
	for i := range steps {
		out = append(out, stepScenarios(steps, nil, i, "")...)
	}
	for c := range steps {
		sc := &steps[c]
		if !sc.Conditional {
			continue
		}
		skip := []string{sc.Name}
		w := start(steps, skip, sc.Name+"/skipped", len(steps))
		out = append(out, w.done())
		if !kindOf(sc).undone {
			continue // skipping it changes no compensation
		}
		suffix := "/" + sc.Name + "-skipped"
		for i := c + 1; i < len(steps); i++ {
			base := map[string]scenario{}
			for _, b := range stepScenarios(steps, nil, i, "") {
				base[b.Name+suffix] = b
			}
			for _, v := range stepScenarios(steps, skip, i, suffix) {
				if b, ok := base[v.Name]; v.compensates && (!ok || !slices.Equal(b.undo, v.undo)) {
					out = append(out, v)
				}
			}
		}
	}
	return out
}

// stepScenarios returns the scenarios of step i (failure, timeout, late
// and duplicate reply), with the conditional steps in skip skipped and
// suffix appended to their names.
func stepScenarios(steps []sagadef.Step, skip []string, i int, suffix string) []scenario {
	var out []scenario
	s := &steps[i]
	if len(s.FailureReplies) > 0 {
		w := start(steps, skip, s.Name+"/failure"+suffix, i)
		w.fail(i)
		undo := !kindOf(s).failureReviews && len(w.chain()) > 0
		if undo {
			w.compensateAll()
		}
		out = append(out, w.done())
		if undo {
			w := start(steps, skip, s.Name+"/failure/compensation-fails"+suffix, i)
			w.fail(i)
			w.failCompensation()
			out = append(out, w.done())
		}
	}
	w := start(steps, skip, s.Name+"/timeout"+suffix, i)
	w.answerOthers(i)
	w.timeouts(i)
	if len(w.stopped) > 0 && len(w.chain()) > 0 {
		w.compensateAll()
	}
	out = append(out, w.done())

	w = start(steps, skip, s.Name+"/late-reply"+suffix, i)
	w.answerOthers(i)
	if s.OnTimeout == sagadef.TimeoutRetry && kindOf(s).sends && attempts(s) > 1 {
		// The answer to attempt 1 while the saga waits for attempt 2.
		w.timeout(i, 1)
	} else {
		w.timeouts(i)
	}
	w.earlierSuccess(i)
	if w.state == stateOf(steps, i) {
		// Audited while waiting: the awaited answer still settles it.
		w.succeed(i, sagadef.ClassNew)
	}
	out = append(out, w.done())

	w = start(steps, skip, s.Name+"/duplicate-reply"+suffix, i)
	w.succeed(i, sagadef.ClassNew)
	st := w.state
	w.move(move{Do: moveDuplicate, State: st, Class: sagadef.ClassDuplicate})
	out = append(out, w.done())
	return out
}
