package sagadef

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/message"
)

// enterStep waits for step i: it sends the step's command (unless External)
// and arms the step's timeout.
func (w *work) enterStep(i, attempt int) error {
	s := w.step(i)
	w.leaveReview()
	w.resumeForward()
	w.out.State = StateName(s.Name)
	w.out.Attempt = attempt
	w.progress().Stopped = without(w.progress().Stopped, s.Name)
	w.out.TimeoutAt = w.env.Now.Add(s.Timeout)
	w.out.PendingMessageID = ""
	if s.External {
		w.note("waiting for step %s (attempt %d)", s.Name, attempt)
		return nil
	}
	id, err := w.send(s.Command, s.Name, &w.progress().Sent)
	if err != nil {
		return err
	}
	w.out.PendingMessageID = id
	w.note("sent %s for step %s (attempt %d of %d)", shortName(s.Command), s.Name, attempt, s.maxAttempts())
	return nil
}

// enterCompensation waits for the compensation of step i: it sends the
// compensating command and arms the step's timeout. The saga deadline no
// longer applies: it bounds the forward path only.
func (w *work) enterCompensation(i, attempt int) error {
	s := w.step(i)
	w.leaveReview()
	w.out.State = CompensatingStateName(s.Name)
	w.out.Attempt = attempt
	w.out.TimeoutAt = w.env.Now.Add(s.Timeout)
	w.out.DeadlineAt = time.Time{}
	id, err := w.send(s.Compensation, s.Name, &w.progress().SentCompensations)
	if err != nil {
		return err
	}
	w.markCompensates(s)
	w.out.PendingMessageID = id
	w.note("sent %s to compensate step %s (attempt %d of %d)", shortName(s.Compensation), s.Name, attempt, s.maxAttempts())
	return nil
}

// markCompensates names, on the compensation just emitted for step s, the
// command it undoes when s stopped waiting without an answer: that command
// may still be in a retry tier or a slow handler, and the participant must
// not apply it after its compensation. The command is built again from the
// saga data for its idempotency key; when that fails, the compensation goes
// without the name (as before there was one) rather than not at all.
func (w *work) markCompensates(s *Step) {
	if w.mode.dry || s.Command == "" || !slices.Contains(w.progress().Stopped, s.Name) || len(w.emit) == 0 {
		return
	}
	cmd, err := w.env.Hooks.Build(w.ctx, s.Command, w.out.Data)
	if err != nil {
		return
	}
	if name, err := fullName(cmd); err != nil || name != s.Command {
		return
	}
	w.emit[len(w.emit)-1].Compensates = message.OnceKey(cmd, w.out.Progress.OperatorRetries[s.Command])
}

// send builds command from the saga data, gives it a fresh id and records
// the id in sent.
func (w *work) send(command, step string, sent *map[string]string) (string, error) {
	id := w.env.NewID()
	if id == "" {
		return "", errors.New("NewID returned an empty id")
	}
	if _, dup := w.progress().Sent[id]; dup {
		return "", fmt.Errorf("NewID returned id %s twice", id)
	}
	if _, dup := w.progress().SentCompensations[id]; dup {
		return "", fmt.Errorf("NewID returned id %s twice", id)
	}
	if !w.mode.dry {
		msg, err := w.env.Hooks.Build(w.ctx, command, w.out.Data)
		if err != nil {
			return "", fmt.Errorf("build %s for step %s: %w", command, step, err)
		}
		name, err := fullName(msg)
		if err != nil {
			return "", fmt.Errorf("build %s for step %s: %w", command, step, err)
		}
		if name != command {
			return "", fmt.Errorf("build %s for step %s: hook returned a %s", command, step, name)
		}
		w.emit = append(w.emit, Outgoing{MessageID: id, Message: msg, OperatorRetry: w.out.Progress.OperatorRetries[command]})
	}
	w.emitNames = append(w.emitNames, command)
	if *sent == nil {
		*sent = map[string]string{}
	}
	(*sent)[id] = step
	return id, nil
}

// advance continues after step i succeeded, with the next step the saga has
// not completed: an instance an earlier release of the definition ran may
// have completed a step that this release orders later, and sending it
// again would only wait for a reply its recorded outcome makes a duplicate.
func (w *work) advance(i int) error {
	w.resumeForward()
	for j := i + 1; j < len(w.d.Steps); j++ {
		s := w.step(j)
		if slices.Contains(w.progress().Completed, s.Name) {
			continue
		}
		if s.Group != "" {
			return w.enterGroup(s.Group)
		}
		skip, err := w.skip(j)
		if err != nil {
			return err
		}
		if skip {
			w.dropEarly(j, "the decider skipped the step")
			continue
		}
		if err := w.enterStep(j, 1); err != nil {
			return err
		}
		// An External step's event recorded before the saga reached the
		// step settles it now.
		if rec, ok := w.out.Progress.Outcomes[s.Name]; ok && s.External {
			w.note("%s, recorded early for step %s, settles it", shortName(rec), s.Name)
			return w.conclude(j, w.isSuccess(rec), rec)
		}
		return nil
	}
	w.finish(StateCompleted)
	return nil
}

// skip asks the decider whether conditional step i is skipped, and records
// the skip. Steps that are not conditional always run.
func (w *work) skip(i int) (bool, error) {
	s := w.step(i)
	if !s.Conditional {
		return false, nil
	}
	var skip bool
	reason := "explored"
	if w.mode.dry {
		skip = i < 64 && w.mode.skips&(1<<i) != 0
	} else {
		sk, ok := w.env.Hooks.(Skipper)
		if !ok {
			return false, fmt.Errorf("step %s is conditional, but the hooks (%T) do not implement sagadef.Skipper", s.Name, w.env.Hooks)
		}
		var err error
		skip, reason, err = sk.Skip(w.ctx, s.Name, w.out.Data)
		if err != nil {
			return false, fmt.Errorf("decide whether to skip step %s: %w", s.Name, err)
		}
	}
	if !skip {
		return false, nil
	}
	if !slices.Contains(w.progress().Skipped, s.Name) {
		w.progress().Skipped = append(w.progress().Skipped, s.Name)
	}
	if reason == "" {
		reason = "no reason given"
	}
	w.note("skipped conditional step %s: %s", s.Name, reason)
	return true, nil
}

// compensate continues compensation with the last compensatable step that
// completed (or stopped waiting, so may have taken effect) and is not yet
// compensated; with none left, the saga has FAILED.
func (w *work) compensate() error {
	w.dropUnreached("the saga compensates")
	p := w.progress()
	// In reverse of the order the steps ran, not of the definition's: an
	// earlier release may have ordered them otherwise. A step the saga
	// stopped waiting on ran last, unless it completed afterwards.
	ran := slices.Clone(p.Completed)
	for _, name := range p.Stopped {
		if !slices.Contains(ran, name) {
			ran = append(ran, name)
		}
	}
	ran = w.groupOrder(ran)
	for k := len(ran) - 1; k >= 0; k-- {
		i, known := w.d.compiled.steps[ran[k]]
		if !known || w.step(i).Role != RoleCompensatable || slices.Contains(p.Compensated, ran[k]) {
			continue
		}
		return w.enterCompensation(i, 1)
	}
	// A step an earlier release of the definition ran, and this one no
	// longer has (removed or renamed), cannot be compensated from here:
	// its effect may still be in place, so an operator decides.
	var gone []string
	for _, name := range slices.Concat(p.Completed, p.Stopped) {
		if _, known := w.d.compiled.steps[name]; !known && !slices.Contains(p.Compensated, name) && !slices.Contains(gone, name) {
			gone = append(gone, name)
		}
	}
	if len(gone) > 0 {
		w.out.LastError = fmt.Sprintf("step %s ran under an earlier definition that this one no longer has; its compensation, if it had one, was not sent",
			strings.Join(gone, ", "))
		w.review(w.out.LastError + ": compensate it by hand, then resolve")
		return nil
	}
	if p.Cancel != nil {
		w.finish(StateCancelled)
		return nil
	}
	w.finish(StateFailed)
	return nil
}

// resumeForward drops a recorded business cancel when the saga goes
// forward again (an operator's retry from manual review overrides it).
func (w *work) resumeForward() {
	if w.out.Progress.Cancel != nil {
		w.progress().Cancel = nil
	}
}

// finish ends the saga in a terminal state.
func (w *work) finish(state string) {
	w.dropUnreached("the saga ended " + state)
	w.leaveReview()
	w.out.State = state
	w.out.TimeoutAt, w.out.DeadlineAt = time.Time{}, time.Time{}
	w.out.PendingMessageID = ""
	w.note("saga %s", state)
}

// review parks the saga in MANUAL_REVIEW, remembering where it came from.
// Already in review, the reason is appended.
func (w *work) review(reason string) {
	if w.out.State == StateManualReview {
		w.out.ReviewReason += "; " + reason
	} else {
		w.progress().ReviewFrom = w.out.State
		w.out.ReviewReason = reason
	}
	w.out.State = StateManualReview
	w.out.TimeoutAt = time.Time{}
	w.out.PendingMessageID = ""
	w.note("manual review: %s", reason)
}

func (w *work) leaveReview() {
	w.progress().ReviewFrom = ""
	w.out.ReviewReason = ""
}

// stop records that step name stopped waiting without an outcome.
func (w *work) stop(name string) {
	if _, settled := w.progress().Outcomes[name]; settled {
		return
	}
	if !slices.Contains(w.progress().Stopped, name) {
		w.progress().Stopped = append(w.progress().Stopped, name)
	}
}

// fold applies the trigger's message to the saga data (on a copy).
func (w *work) fold() error {
	if w.mode.dry {
		return nil
	}
	if !w.dataOwned {
		if w.in.Data != nil {
			w.out.Data = proto.Clone(w.in.Data)
		}
		w.dataOwned = true
	}
	if err := w.env.Hooks.Apply(w.ctx, w.out.Data, w.trig.Message); err != nil {
		return fmt.Errorf("apply %s to saga data: %w", w.kind, err)
	}
	return nil
}

func (w *work) onMessage(ref msgRef) error {
	switch ref.use {
	case UseStart:
		w.noop(ClassDuplicate, "start message %s for a running saga", shortName(w.kind))
		return nil
	case UseSuccess, UseFailure:
		return w.onStepReply(ref.step, ref.use == UseSuccess)
	case UseCancel:
		return w.onCancel()
	case UseChildReview:
		return w.onChildReview(ref.step)
	default:
		return w.onCompensationReply(ref.step, ref.use == UseCompensationReply)
	}
}

func (w *work) onStepReply(i int, success bool) error {
	s := w.step(i)
	in := &w.in.Progress
	if !s.External {
		// A reply names the command it answers: one that names none of
		// this step's commands was misaddressed by its sender, whatever
		// the step's outcome.
		if c := w.trig.CausationID; c == "" || in.Sent[c] != s.Name {
			return w.misaddressed(s, false)
		}
	}
	if rec, ok := in.Outcomes[s.Name]; ok {
		if rec == w.kind {
			w.noop(ClassDuplicate, "%s repeats the outcome of step %s", shortName(w.kind), s.Name)
			return nil
		}
		w.class = ClassConflicting
		w.out.LastError = fmt.Sprintf("conflicting %s for step %s, settled by %s", shortName(w.kind), s.Name, shortName(rec))
		w.review(fmt.Sprintf("conflicting reply %s for step %s, which %s already settled", shortName(w.kind), s.Name, shortName(rec)))
		return nil
	}
	stepState := StateName(s.Name)
	waiting := w.in.State == stepState
	pending := true
	if s.External {
		reached := waiting || slices.Contains(in.Stopped, s.Name) ||
			(w.in.State == StateManualReview && in.ReviewFrom == stepState)
		if !reached {
			at, ok := w.forwardStep()
			switch {
			case ok && at < i:
				// Early rather than stray: the message that moves the
				// saga on (or an operator's retry from review) can come
				// after it.
				return w.recordEarly(s, at)
			case slices.Contains(in.Skipped, s.Name):
				w.noop(ClassInvalid, "%s for step %s, which the saga skipped", shortName(w.kind), s.Name)
				return nil
			default:
				w.noop(ClassInvalid, "%s for step %s, which the saga has not reached", shortName(w.kind), s.Name)
				return nil
			}
		}
	} else if s.Group != "" {
		waiting, pending = w.waitingMember(s, w.trig.CausationID)
	} else {
		pending = w.trig.CausationID == w.in.PendingMessageID
	}
	if waiting && pending {
		w.class = ClassNew
		return w.settle(i, success)
	}
	when := w.lateSituation(waiting)
	w.class = ClassLate
	m := lateForward(s, success)
	what := w.lateWhat("step "+s.Name, when)
	if m == lateSuccessReply && when == lateUndone && w.trig.Once && w.compensationSent(s.Name) {
		w.noop(ClassLate, "%s; audited: its participant runs each command once and records it as done when "+
			"the compensation comes first, so the compensation, sent after this attempt, undid its effect", what)
		return nil
	}
	switch lateRule(m, when, s.Late) {
	case lateApply:
		w.note("%s; applied (late policy: %s)", what, s.Late)
		return w.settle(i, success)
	case lateRecord:
		w.note("%s; recorded", what)
		return w.record(s.Name)
	case lateReview:
		if err := w.record(s.Name); err != nil {
			return err
		}
		w.review(what + w.lateRisk(s, m, when, true))
		return nil
	default:
		w.noop(ClassLate, "%s; audited (late policy: %s)%s", what, s.Late, w.lateRisk(s, m, when, false))
		return nil
	}
}

// misaddressed returns the error of a reply to step s (to its compensation
// when compensation is set) whose causation id names no such command:
// none of the saga's, or one it sent for something else.
func (w *work) misaddressed(s *Step, compensation bool) error {
	c := w.trig.CausationID
	e := &CausationError{Reply: w.kind, Step: s.Name, Compensation: compensation, CausationID: c}
	if c != "" {
		if step, ok := w.in.Progress.Sent[c]; ok {
			e.NamedStep = step
		} else if step, ok := w.in.Progress.SentCompensations[c]; ok {
			e.NamedStep, e.NamedCompensation = step, true
		}
	}
	return e
}

// compensationSent reports whether the saga sent the compensation of step.
func (w *work) compensationSent(step string) bool {
	for _, s := range w.in.Progress.SentCompensations {
		if s == step {
			return true
		}
	}
	return false
}

// forwardStep returns the index of the step the saga waits on while on its
// forward path, or waited on when it entered manual review; false while it
// compensates, after it ended, or in review from a compensation.
func (w *work) forwardStep() (int, bool) {
	st := w.state()
	if st.Kind == StateKindManualReview {
		rs, ok := w.reviewState()
		if !ok {
			return 0, false
		}
		st = rs
	}
	if st.Kind == StateKindGroup {
		return w.d.compiled.groups[st.Group].last, true
	}
	if st.Kind != StateKindStep {
		return 0, false
	}
	return w.stepIndex(st.Step), true
}

// settle applies the outcome of step i in the state waiting for it.
func (w *work) settle(i int, success bool) error {
	if err := w.record(w.step(i).Name); err != nil {
		return err
	}
	return w.conclude(i, success, w.kind)
}

// conclude continues after step i, waited on, was settled by reply (a
// success or not), already recorded as its outcome.
func (w *work) conclude(i int, success bool, reply string) error {
	s := w.step(i)
	if s.Group != "" {
		return w.concludeMember(i, success, reply)
	}
	p := w.progress()
	if success {
		p.Completed = append(p.Completed, s.Name)
		w.note("step %s succeeded with %s", s.Name, shortName(reply))
		return w.advance(i)
	}
	w.out.LastError = fmt.Sprintf("step %s failed with %s", s.Name, shortName(reply))
	if s.Role == RoleRetriable {
		w.review(fmt.Sprintf("retriable step %s failed with %s; steps after the pivot must not fail", s.Name, shortName(reply)))
		return nil
	}
	w.note("step %s failed with %s; compensating", s.Name, shortName(reply))
	return w.compensate()
}

// record folds the reply into the data and records it as the step's outcome.
func (w *work) record(step string) error {
	if err := w.fold(); err != nil {
		return err
	}
	if w.progress().Outcomes == nil {
		w.progress().Outcomes = map[string]string{}
	}
	w.progress().Outcomes[step] = w.kind
	return nil
}

// recordEarly records an External step's event that arrives while the saga
// is still on its way to the step, waiting on step at (or in manual review
// from it): folded into the data and recorded as the step's outcome, the
// state unchanged. Entering the step settles it at once (advance); the
// saga compensating, skipping the step or ending first discards it
// (dropUnreached, dropEarly).
func (w *work) recordEarly(s *Step, at int) error {
	w.class = ClassEarly
	w.note("%s for step %s recorded early, while the saga is at step %s; it settles the step when the saga gets there",
		shortName(w.kind), s.Name, w.step(at).Name)
	return w.record(s.Name)
}

// dropUnreached discards the events recorded early for the External steps
// after the one the saga was on when the trigger came (it will not reach
// them), saying why; the step this trigger led the saga to (an event
// recorded early that settled it with a failure) is not among them.
// Nothing is discarded once the saga left its forward path: it did so when
// it left.
func (w *work) dropUnreached(why string) {
	at, ok := w.forwardStep()
	if !ok {
		return
	}
	for j := at + 1; j < len(w.d.Steps); j++ {
		if StateName(w.step(j).Name) != w.out.State {
			w.dropEarly(j, why)
		}
	}
}

// dropEarly discards the event recorded early for step j, if it is an
// External step the saga has not completed, with an audit note.
func (w *work) dropEarly(j int, why string) {
	s := w.step(j)
	rec, ok := w.out.Progress.Outcomes[s.Name]
	if !ok || !s.External || slices.Contains(w.out.Progress.Completed, s.Name) {
		return
	}
	delete(w.progress().Outcomes, s.Name)
	w.note("%s, recorded early for step %s, discarded: %s", shortName(rec), s.Name, why)
}

func (w *work) onCompensationReply(i int, success bool) error {
	s := w.step(i)
	in := &w.in.Progress
	c := w.trig.CausationID
	if c == "" || in.SentCompensations[c] != s.Name {
		return w.misaddressed(s, true)
	}
	if rec, ok := in.CompensationOutcomes[s.Name]; ok {
		if rec == w.kind {
			w.noop(ClassDuplicate, "%s repeats the outcome of the compensation of step %s", shortName(w.kind), s.Name)
			return nil
		}
		w.class = ClassConflicting
		w.out.LastError = fmt.Sprintf("conflicting %s for the compensation of step %s, settled by %s", shortName(w.kind), s.Name, shortName(rec))
		w.review(fmt.Sprintf("conflicting reply %s for the compensation of step %s, which %s already settled",
			shortName(w.kind), s.Name, shortName(rec)))
		return nil
	}
	waiting := w.in.State == CompensatingStateName(s.Name)
	if waiting && c == w.in.PendingMessageID {
		w.class = ClassNew
		return w.settleCompensation(i, success)
	}
	w.class = ClassLate
	m := lateCompensation(success)
	when := w.lateSituation(waiting)
	what := w.lateWhat("the compensation of step "+s.Name, when)
	switch lateRule(m, when, s.Late) {
	case lateApply:
		w.note("%s; applied: every attempt sends the same compensating command", what)
		return w.settleCompensation(i, success)
	case lateRecord:
		w.note("%s; recorded", what)
		return w.recordCompensation(s.Name)
	case lateReview:
		if err := w.recordCompensation(s.Name); err != nil {
			return err
		}
		w.review(what + w.lateRisk(s, m, when, true))
		return nil
	default:
		w.noop(ClassLate, "%s; audited (late policy: %s)%s", what, s.Late, w.lateRisk(s, m, when, false))
		return nil
	}
}

func (w *work) settleCompensation(i int, success bool) error {
	s := w.step(i)
	if err := w.recordCompensation(s.Name); err != nil {
		return err
	}
	if success {
		w.progress().Compensated = append(w.progress().Compensated, s.Name)
		w.note("step %s compensated", s.Name)
		return w.compensate()
	}
	w.out.LastError = fmt.Sprintf("compensation of step %s failed with %s", s.Name, shortName(w.kind))
	w.review(fmt.Sprintf("compensation of step %s failed with %s", s.Name, shortName(w.kind)))
	return nil
}

func (w *work) recordCompensation(step string) error {
	if err := w.fold(); err != nil {
		return err
	}
	if w.progress().CompensationOutcomes == nil {
		w.progress().CompensationOutcomes = map[string]string{}
	}
	w.progress().CompensationOutcomes[step] = w.kind
	return nil
}
