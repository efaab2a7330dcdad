package sagadef

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/message"
)

// IsTransition reports whether the result is a row of the transition table:
// it changed state, sent something, or was a new or conflicting trigger.
// Duplicates, invalid messages and late replies that are only audited (or
// only recorded) are not transitions.
func (r Result) IsTransition() bool {
	return isTransition(r.From, r.To, r.Class, len(r.Emit))
}

func isTransition(from, to string, class Class, emits int) bool {
	return from != to || emits > 0 || class == ClassNew || class == ClassConflicting
}

// Begin starts a new instance with the given saga id from its start
// message: Hooks.Start builds the saga data and business key, then the saga
// enters its first step (sending the step's command unless the step is
// External), with Attempt 1, the step's timeout and the saga's deadline
// armed. The returned instance has Version 1.
func (d *Definition) Begin(ctx context.Context, env Env, id string, start message.Message) (Result, error) {
	if d.compiled == nil {
		return Result{}, fmt.Errorf("begin saga %s: %w", d.Name, ErrNotCompiled)
	}
	if err := env.check(); err != nil {
		return Result{}, fmt.Errorf("begin saga %s %s: %w", d.Name, id, err)
	}
	if id == "" {
		return Result{}, fmt.Errorf("begin saga %s: empty saga id: %w", d.Name, ErrInvalidTrigger)
	}
	name, err := fullName(start)
	if err != nil {
		return Result{}, fmt.Errorf("begin saga %s %s: %w", d.Name, id, err)
	}
	if name != d.StartMessage {
		return Result{}, fmt.Errorf("begin saga %s %s: %s is not the start message %s: %w",
			d.Name, id, name, d.StartMessage, ErrInvalidTrigger)
	}
	data, key, err := env.Hooks.Start(ctx, start)
	if err != nil {
		return Result{}, fmt.Errorf("begin saga %s %s: start hook: %w", d.Name, id, err)
	}
	if key == "" {
		return Result{}, fmt.Errorf("begin saga %s %s: the start message's business key is empty: %w", d.Name, id, ErrInvalidTrigger)
	}
	res, _, err := d.begin(ctx, env, id, data, key, mode{})
	if err != nil {
		return Result{}, fmt.Errorf("begin saga %s %s: %w", d.Name, id, err)
	}
	return res, nil
}

// Apply classifies trig against inst and performs the transition it calls
// for. It is pure: it reads the clock, ids and hooks only from env, never
// modifies inst (the returned instance is a copy, with copied maps, slices
// and data), and touches no database or broker.
//
// The result carries the class, the state before and after, the new instance
// (Version+1 when anything changed; inst itself, same version, when nothing
// did: duplicates, invalid messages, audited late replies, stale timeouts),
// the messages to send (their ids already recorded in Progress) and a note
// for the audit trail.
//
// Errors: [ErrNotCompiled]; [ErrUnknownState] when inst.State is not a state
// of the definition; [ErrInvalidTrigger] for malformed triggers and operator
// actions the state does not allow; [ErrTerminal] for operator actions on a
// terminal instance; a [*CausationError] (matching [ErrMisaddressed]) for a
// reply whose causation id names no command the saga sent for the step or
// compensation its type answers; [ErrNotReached] for an external step's
// event that arrives before the saga waits for it; and errors of the hooks,
// wrapped.
func (d *Definition) Apply(ctx context.Context, env Env, inst Instance, trig Trigger) (Result, error) {
	if err := env.check(); err != nil {
		return Result{}, fmt.Errorf("saga %s %s: %w", d.Name, inst.ID, err)
	}
	res, _, err := d.apply(ctx, env, inst, trig, mode{})
	return res, err
}

// Classify returns the class Apply would give trig, without calling hooks
// or building messages. Timeouts and deadlines are judged as due whenever
// one is armed. A trigger Apply would reject is ClassInvalid.
func (d *Definition) Classify(inst Instance, trig Trigger) Class {
	res, _, err := d.apply(context.Background(), Env{NewID: newCounter("classify-")}, inst, trig,
		mode{dry: true, assumeDue: true})
	if err != nil {
		return ClassInvalid
	}
	return res.Class
}

// mode switches Apply between running for real and the dry runs used by
// Classify and by Compile's exploration of the state space.
type mode struct {
	// dry skips hooks: no data is folded and no message is built (emitted
	// message names are still reported).
	dry bool
	// assumeDue treats any armed timeout or deadline as due.
	assumeDue bool
}

// newCounter returns an id source yielding prefix1, prefix2, ...
func newCounter(prefix string) func() string {
	n := 0
	return func() string {
		n++
		return fmt.Sprintf("%s%d", prefix, n)
	}
}

func (e Env) check() error {
	if e.NewID == nil {
		return errors.New("env: NewID is nil")
	}
	if e.Hooks == nil {
		return errors.New("env: Hooks is nil")
	}
	return nil
}

// fullName returns the contract full name of m.
func fullName(m message.Message) (string, error) {
	if m == nil {
		return "", fmt.Errorf("nil message: %w", ErrInvalidTrigger)
	}
	info := m.SagaMessageInfo()
	if info == nil || info.FullName == "" {
		return "", fmt.Errorf("message without SagaMessageInfo: %w", ErrInvalidTrigger)
	}
	return info.FullName, nil
}

func (d *Definition) begin(ctx context.Context, env Env, id string, data proto.Message, key string, m mode) (Result, []string, error) {
	w := &work{d: d, ctx: ctx, env: env, mode: m, kind: TriggerStart, dataOwned: true, progressOwned: true,
		out: Instance{ID: id, Type: d.Name, BusinessKey: key, Data: data}}
	if d.Deadline > 0 {
		w.out.DeadlineAt = env.Now.Add(d.Deadline)
	}
	w.class = ClassNew
	w.note("started by %s", shortName(d.StartMessage))
	if err := w.enterStep(0, 1); err != nil {
		return Result{}, nil, err
	}
	w.out.Version = 1
	return Result{Class: ClassNew, To: w.out.State, Instance: w.out, Emit: w.emit,
		Note: strings.Join(w.notes, "; ")}, w.emitNames, nil
}

func (d *Definition) apply(ctx context.Context, env Env, inst Instance, trig Trigger, m mode) (Result, []string, error) {
	if d.compiled == nil {
		return Result{}, nil, fmt.Errorf("apply to saga %s: %w", d.Name, ErrNotCompiled)
	}
	kind := trig.Kind
	if trig.Message != nil {
		name, err := fullName(trig.Message)
		if err != nil {
			return Result{}, nil, fmt.Errorf("saga %s %s: %w", d.Name, inst.ID, err)
		}
		if kind == "" {
			kind = name
		} else if kind != name {
			return Result{}, nil, fmt.Errorf("saga %s %s: trigger kind %s carries a %s message: %w",
				d.Name, inst.ID, kind, name, ErrInvalidTrigger)
		}
	}
	if _, ok := d.compiled.states[inst.State]; !ok {
		return Result{}, nil, fmt.Errorf("saga %s %s: state %q: %w", d.Name, inst.ID, inst.State, ErrUnknownState)
	}
	w := &work{d: d, ctx: ctx, env: env, mode: m, in: inst, trig: trig, kind: kind, out: inst}
	var err error
	switch kind {
	case "":
		err = fmt.Errorf("empty trigger: %w", ErrInvalidTrigger)
	case TriggerStart:
		err = fmt.Errorf("a running saga cannot be started; use Begin for new instances: %w", ErrInvalidTrigger)
	case TriggerTimeout:
		err = w.onTimeout()
	case TriggerDeadline:
		w.onDeadline()
	case TriggerStuck:
		w.onStuck()
	case TriggerOperatorRetry, TriggerOperatorCompensate, TriggerOperatorResolve, TriggerOperatorCancel:
		err = w.onOperator()
	default:
		ref, ok := d.compiled.messages[kind]
		switch {
		case !ok || !ref.use.incoming():
			w.noop(ClassInvalid, "%s is not a message saga %s receives", kind, d.Name)
		case trig.Message == nil && !m.dry:
			err = fmt.Errorf("message trigger %s without a message: %w", kind, ErrInvalidTrigger)
		default:
			err = w.onMessage(ref)
		}
	}
	if err != nil {
		return Result{}, nil, fmt.Errorf("saga %s %s: %s in state %s: %w", d.Name, inst.ID, kind, inst.State, err)
	}
	return w.result()
}

// work is one application of a trigger: the input instance (never
// modified), the working copy, and what the transition decided so far.
type work struct {
	d    *Definition
	ctx  context.Context
	env  Env
	mode mode
	in   Instance
	out  Instance
	trig Trigger
	kind string // trigger kind (message full name or Trigger* constant)

	class     Class
	noChange  bool
	notes     []string
	emit      []Outgoing
	emitNames []string
	// dataOwned is set once out.Data is a copy Apply may modify;
	// progressOwned once out.Progress is (see progress).
	dataOwned     bool
	progressOwned bool
}

// progress returns the working copy's progress, copying the input's on
// first use, so that the input is never modified and no-op paths copy
// nothing.
func (w *work) progress() *Progress {
	if !w.progressOwned {
		w.out.Progress = w.in.Progress.clone()
		w.progressOwned = true
	}
	return &w.out.Progress
}

func (w *work) result() (Result, []string, error) {
	res := Result{Class: w.class, From: w.in.State, Note: strings.Join(w.notes, "; ")}
	if w.noChange {
		res.To, res.Instance = w.in.State, w.in
		return res, nil, nil
	}
	if w.in.Progress.Deferrals != 0 {
		w.progress().Deferrals = 0 // the instance moved on
	}
	w.out.Version = w.in.Version + 1
	res.To, res.Instance, res.Emit = w.out.State, w.out, w.emit
	return res, w.emitNames, nil
}

func (w *work) note(format string, args ...any) {
	if w.mode.dry {
		return // nobody reads notes of dry runs
	}
	w.notes = append(w.notes, fmt.Sprintf(format, args...))
}

// noop ends the work without any change to the instance.
func (w *work) noop(c Class, format string, args ...any) {
	w.class, w.noChange = c, true
	w.note(format, args...)
}

func (w *work) step(i int) *Step { return &w.d.Steps[i] }

func (w *work) stepIndex(name string) int { return w.d.compiled.steps[name] }

func (w *work) state() State { return w.d.compiled.states[w.in.State] }

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
		if err := w.enterStep(j, 1); err != nil {
			return err
		}
		// An External step's event recorded in manual review before the
		// saga reached the step settles it now.
		if rec, ok := w.out.Progress.Outcomes[s.Name]; ok && s.External {
			w.note("%s, recorded before the saga reached step %s, settles it", shortName(rec), s.Name)
			return w.conclude(j, w.isSuccess(rec), rec)
		}
		return nil
	}
	w.finish(StateCompleted)
	return nil
}

// compensate continues compensation with the last compensatable step that
// completed (or stopped waiting, so may have taken effect) and is not yet
// compensated; with none left, the saga has FAILED.
func (w *work) compensate() error {
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
	var when lateWhen
	if s.External {
		reached := waiting || slices.Contains(in.Stopped, s.Name) ||
			(w.in.State == StateManualReview && in.ReviewFrom == stepState)
		if !reached {
			at, ok := w.forwardStep()
			switch {
			case ok && at < i && w.in.State == StateManualReview:
				// The operator's retry may lead the saga to the step:
				// kept in the saga until it gets there.
				when = lateBeforeStep
			case ok && at < i:
				// It may be early rather than stray: the message that
				// moves the saga on can be queued behind it.
				return fmt.Errorf("%s for step %s while the saga is at step %s: %w",
					shortName(w.kind), s.Name, w.step(at).Name, ErrNotReached)
			default:
				w.noop(ClassInvalid, "%s for step %s, which the saga has not reached", shortName(w.kind), s.Name)
				return nil
			}
		}
	} else {
		pending = w.trig.CausationID == w.in.PendingMessageID
	}
	if waiting && pending {
		w.class = ClassNew
		return w.settle(i, success)
	}
	if when == 0 {
		when = w.lateSituation(waiting)
	}
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
	case lateBeforeStep:
		return fmt.Sprintf("%s for %s while in manual review before the saga reached the step; it settles the step when the saga gets there", name, subject)
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

// onCancel applies the business cancel message (Definition.Cancel). Waiting
// on a compensatable step or the pivot, the saga stops waiting, records the
// cancel and compensates as after a business failure, ending CANCELLED.
// Everywhere else it changes nothing and says why in the audit note.
func (w *work) onCancel() error {
	by, why := w.cancelRequest()
	who := fmt.Sprintf("cancel requested by %s (%s)", orUnknown(by), orUnknown(why))
	st := w.state()
	switch st.Kind {
	case StateKindTerminal:
		w.noop(ClassLate, "%s ignored: the saga already ended %s", who, st.Name)
		return nil
	case StateKindCompensating:
		w.noop(ClassLate, "%s ignored: the saga is already compensating (step %s)", who, st.Step)
		return nil
	case StateKindManualReview:
		w.noop(ClassLate, "%s not applied: the saga is in manual review; an operator decides (compensate, or resolve to %s)", who, StateCancelled)
		return nil
	}
	if passed := w.pointOfNoReturn(w.stepIndex(st.Step)); passed != "" {
		w.noop(ClassLate, "%s refused: %s, past the point of no return; the saga runs to completion", who, passed)
		return nil
	}
	w.class = ClassNew
	if err := w.fold(); err != nil {
		return err
	}
	w.progress().Cancel = &Cancellation{RequestedBy: by, Reason: why, MessageID: w.trig.MessageID}
	w.note("%s while waiting on step %s; compensating", who, st.Step)
	w.stop(st.Step)
	return w.compensate()
}

// pointOfNoReturn says how the saga, waiting on step i, is past its point
// of no return (waiting on a retriable step, or a pivot or retriable step
// completed), or returns "" when it is not.
func (w *work) pointOfNoReturn(i int) string {
	for _, name := range w.in.Progress.Completed {
		if j, ok := w.d.compiled.steps[name]; ok && w.step(j).Role != RoleCompensatable {
			return fmt.Sprintf("%s step %s completed", w.step(j).Role, name)
		}
	}
	if s := w.step(i); s.Role == RoleRetriable {
		return fmt.Sprintf("it waits on retriable step %s", s.Name)
	}
	return ""
}

// cancelRequest returns who asked for the cancel and why: the trigger's
// Operator and Reason when set, otherwise the cancel message's fields.
func (w *work) cancelRequest() (by, why string) {
	by, why = strings.TrimSpace(w.trig.Operator), strings.TrimSpace(w.trig.Reason)
	if by == "" || why == "" {
		mb, mw := w.d.CancelRequest(w.trig.Message)
		if by == "" {
			by = mb
		}
		if why == "" {
			why = mw
		}
	}
	return by, why
}

func orUnknown(s string) string {
	if s == "" {
		return "(not given)"
	}
	return s
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

// due reports whether a timer armed at t has fired.
func (w *work) due(t time.Time) bool {
	return w.mode.assumeDue || !w.env.Now.Before(t)
}

func (w *work) onTimeout() error {
	at := w.in.TimeoutAt
	switch {
	case at.IsZero():
		w.noop(ClassLate, "stale timeout: no timeout armed")
		return nil
	case !w.due(at):
		w.noop(ClassLate, "stale timeout: next timeout due at %s", at.Format(time.RFC3339Nano))
		return nil
	}
	st := w.state()
	if st.Kind != StateKindStep && st.Kind != StateKindCompensating {
		w.class = ClassLate
		w.out.TimeoutAt = time.Time{}
		w.note("timeout in state %s, which waits for no reply; cleared", st.Name)
		return nil
	}
	w.class = ClassNew
	i := w.stepIndex(st.Step)
	s := w.step(i)
	if st.Kind == StateKindCompensating {
		if w.in.Attempt < s.maxAttempts() {
			w.note("compensation of step %s unanswered after %s; resending", s.Name, s.Timeout)
			return w.enterCompensation(i, w.in.Attempt+1)
		}
		w.out.LastError = fmt.Sprintf("compensation of step %s unanswered after %d attempts", s.Name, w.in.Attempt)
		w.review(w.out.LastError)
		return nil
	}
	switch s.OnTimeout {
	case TimeoutCompensate:
		w.out.LastError = fmt.Sprintf("step %s timed out after %s", s.Name, s.Timeout)
		w.stop(s.Name)
		w.note("step %s timed out; compensating", s.Name)
		return w.compensate()
	case TimeoutRetry:
		if w.in.Attempt < s.maxAttempts() {
			w.note("step %s unanswered after %s; retrying", s.Name, s.Timeout)
			return w.enterStep(i, w.in.Attempt+1)
		}
		w.out.LastError = fmt.Sprintf("step %s: retry budget exhausted after %d attempts", s.Name, w.in.Attempt)
		w.review(w.out.LastError)
		return nil
	default:
		w.out.LastError = fmt.Sprintf("step %s timed out after %s", s.Name, s.Timeout)
		w.review(w.out.LastError)
		return nil
	}
}

func (w *work) onDeadline() {
	at := w.in.DeadlineAt
	switch {
	case at.IsZero():
		w.noop(ClassLate, "stale deadline: no deadline armed")
		return
	case !w.due(at):
		w.noop(ClassLate, "stale deadline: due at %s", at.Format(time.RFC3339Nano))
		return
	}
	w.out.DeadlineAt = time.Time{}
	switch w.state().Kind {
	case StateKindStep, StateKindManualReview:
		w.class = ClassNew
		w.out.LastError = fmt.Sprintf("deadline exceeded (%s)", w.d.Deadline)
		w.review(w.out.LastError)
	default:
		w.class = ClassLate
		w.note("deadline passed in state %s, which it no longer bounds; cleared", w.in.State)
	}
}

// onStuck sends a saga whose due timeout or deadline kept failing to manual
// review, with its deadline cleared too (unlike review, which keeps it): the
// scanner has nothing left to do for it.
func (w *work) onStuck() {
	switch w.state().Kind {
	case StateKindStep, StateKindCompensating:
		w.class = ClassNew
		reason := strings.TrimSpace(w.trig.Reason)
		if reason == "" {
			reason = "its due timeout or deadline could not be applied"
		}
		w.out.DeadlineAt = time.Time{}
		w.review(reason)
	default:
		w.noop(ClassLate, "stuck in state %s, which no clock acts on; nothing to do", w.in.State)
	}
}

func (w *work) onOperator() error {
	t := w.trig
	if strings.TrimSpace(t.Operator) == "" || strings.TrimSpace(t.Reason) == "" {
		return fmt.Errorf("operator triggers need an operator and a reason: %w", ErrInvalidTrigger)
	}
	if t.ResolveTo != "" && w.kind != TriggerOperatorResolve {
		return fmt.Errorf("ResolveTo is only for %s: %w", TriggerOperatorResolve, ErrInvalidTrigger)
	}
	st := w.state()
	if st.Kind == StateKindTerminal {
		return fmt.Errorf("%s: %w", st.Name, ErrTerminal)
	}
	w.class = ClassNew
	w.note("%s by %s: %s", w.kind, t.Operator, t.Reason)
	switch w.kind {
	case TriggerOperatorRetry:
		return w.operatorRetry(st)
	case TriggerOperatorCompensate:
		return w.operatorCompensate(st)
	case TriggerOperatorResolve:
		if st.Kind != StateKindManualReview {
			return fmt.Errorf("resolve applies to %s only; use cancel or compensate: %w", StateManualReview, ErrInvalidTrigger)
		}
		if !IsTerminal(t.ResolveTo) {
			return fmt.Errorf("resolve to %q: want %s, %s or %s: %w",
				t.ResolveTo, StateCompleted, StateFailed, StateCancelled, ErrInvalidTrigger)
		}
		w.stopReviewStep()
		w.finish(t.ResolveTo)
		return nil
	default: // cancel
		switch st.Kind {
		case StateKindStep:
			w.stop(st.Step)
		case StateKindManualReview:
			w.stopReviewStep()
		}
		w.finish(StateCancelled)
		return nil
	}
}

// reviewState returns the state the saga entered manual review from.
func (w *work) reviewState() (State, bool) {
	s, ok := w.d.compiled.states[w.in.Progress.ReviewFrom]
	return s, ok
}

// stopReviewStep marks the step the saga was waiting on when it entered
// manual review as stopped, when the review ends without resuming it.
func (w *work) stopReviewStep() {
	if rs, ok := w.reviewState(); ok && rs.Kind == StateKindStep {
		w.stop(rs.Step)
	}
}

// isSuccess reports whether reply is a success reply of its step.
func (w *work) isSuccess(reply string) bool {
	return w.d.compiled.messages[reply].use == UseSuccess
}

func (w *work) operatorRetry(st State) error {
	switch st.Kind {
	case StateKindStep:
		return w.enterStep(w.stepIndex(st.Step), 1)
	case StateKindCompensating:
		return w.enterCompensation(w.stepIndex(st.Step), 1)
	}
	rs, ok := w.reviewState()
	p := w.progress()
	switch {
	case ok && rs.Kind == StateKindStep:
		i := w.stepIndex(rs.Step)
		if rec, settled := p.Outcomes[rs.Step]; settled {
			if w.isSuccess(rec) {
				if !slices.Contains(p.Completed, rs.Step) {
					p.Completed = append(p.Completed, rs.Step)
				}
				w.note("step %s succeeded with %s while in review; continuing", rs.Step, shortName(rec))
				return w.advance(i)
			}
			delete(p.Outcomes, rs.Step)
			w.retriedAfterFailure(w.step(i).Command)
			w.note("retrying step %s despite %s", rs.Step, shortName(rec))
		}
		return w.enterStep(i, 1)
	case ok && rs.Kind == StateKindCompensating:
		i := w.stepIndex(rs.Step)
		if rec, settled := p.CompensationOutcomes[rs.Step]; settled {
			if rec == w.step(i).CompensationReply {
				if !slices.Contains(p.Compensated, rs.Step) {
					p.Compensated = append(p.Compensated, rs.Step)
				}
				w.note("compensation of step %s succeeded while in review; continuing", rs.Step)
				return w.compensate()
			}
			delete(p.CompensationOutcomes, rs.Step)
			w.retriedAfterFailure(w.step(i).Compensation)
			w.note("retrying the compensation of step %s despite %s", rs.Step, shortName(rec))
		}
		return w.enterCompensation(i, 1)
	}
	from := w.in.Progress.ReviewFrom
	if from == "" {
		from = "an unknown state"
	}
	return fmt.Errorf("nothing to retry: the saga entered manual review from %s; resolve, compensate or cancel it: %w",
		from, ErrInvalidTrigger)
}

// retriedAfterFailure counts an operator retry of command after its
// recorded failure (see Progress.OperatorRetries).
func (w *work) retriedAfterFailure(command string) {
	if command == "" {
		return // an external step sends nothing
	}
	p := w.progress()
	if p.OperatorRetries == nil {
		p.OperatorRetries = map[string]int{}
	}
	p.OperatorRetries[command]++
}

func (w *work) operatorCompensate(st State) error {
	p := w.progress()
	switch st.Kind {
	case StateKindCompensating:
		return fmt.Errorf("already compensating step %s; use retry to resend: %w", st.Step, ErrInvalidTrigger)
	case StateKindStep:
		w.stop(st.Step)
		return w.compensate()
	}
	if rs, ok := w.reviewState(); ok {
		switch rs.Kind {
		case StateKindStep:
			if rec, settled := p.Outcomes[rs.Step]; settled {
				if w.isSuccess(rec) && !slices.Contains(p.Completed, rs.Step) {
					p.Completed = append(p.Completed, rs.Step)
				}
			} else {
				w.stop(rs.Step)
			}
		case StateKindCompensating:
			if rec, settled := p.CompensationOutcomes[rs.Step]; settled {
				if rec == w.step(w.stepIndex(rs.Step)).CompensationReply {
					if !slices.Contains(p.Compensated, rs.Step) {
						p.Compensated = append(p.Compensated, rs.Step)
					}
				} else {
					// Compensated again despite the recorded failure: as
					// a retry does (see retriedAfterFailure).
					delete(p.CompensationOutcomes, rs.Step)
					w.retriedAfterFailure(w.step(w.stepIndex(rs.Step)).Compensation)
				}
			}
		}
	}
	return w.compensate()
}

// clone deep-copies the progress.
func (p Progress) clone() Progress {
	return Progress{
		Completed:            slices.Clone(p.Completed),
		Compensated:          slices.Clone(p.Compensated),
		Outcomes:             cloneMap(p.Outcomes),
		Sent:                 cloneMap(p.Sent),
		Stopped:              slices.Clone(p.Stopped),
		SentCompensations:    cloneMap(p.SentCompensations),
		CompensationOutcomes: cloneMap(p.CompensationOutcomes),
		ReviewFrom:           p.ReviewFrom,
		OperatorRetries:      maps.Clone(p.OperatorRetries),
		Deferrals:            p.Deferrals,
		Cancel:               cloneCancel(p.Cancel),
	}
}

func cloneCancel(c *Cancellation) *Cancellation {
	if c == nil {
		return nil
	}
	cp := *c
	return &cp
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func without(list []string, s string) []string {
	return slices.DeleteFunc(list, func(x string) bool { return x == s })
}

// shortName returns the last segment of a full name, for notes.
func shortName(full string) string {
	if i := strings.LastIndexByte(full, '.'); i >= 0 {
		return full[i+1:]
	}
	return full
}
