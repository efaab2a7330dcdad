package sagadef

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

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
// compensation its type answers; and errors of the hooks, wrapped.
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
	// skips decides, in dry runs, which conditional steps are skipped:
	// bit i skips step i.
	skips uint64
	// timer, in dry runs, names the one timer (a group's or a member's)
	// a timeout in a group state finds due; "" leaves it to assumeDue.
	timer string
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
	if err := w.advance(-1); err != nil {
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

	class    Class
	noChange bool
	notes    []string
	// reasonNoted is set once a note says the trigger's reason (read with
	// reason), so the engine does not repeat it (Result.ReasonNoted).
	reasonNoted bool
	emit        []Outgoing
	emitNames   []string
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
	res := Result{Class: w.class, From: w.in.State, Note: strings.Join(w.notes, "; "), ReasonNoted: w.reasonNoted}
	if w.noChange {
		res.To, res.Instance = w.in.State, w.in
		return res, nil, nil
	}
	if w.in.Progress.Deferrals != 0 {
		w.progress().Deferrals = 0 // the instance moved on
	}
	if r := w.out.Progress.ChildReview; r != nil && w.out.State != StateName(r.Step) {
		w.progress().ChildReview = nil // the saga left the step
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

// reason returns the trigger's reason for a note that says it, and records
// that the note does.
func (w *work) reason() string {
	w.reasonNoted = true
	return strings.TrimSpace(w.trig.Reason)
}

// noop ends the work without any change to the instance.
func (w *work) noop(c Class, format string, args ...any) {
	w.class, w.noChange = c, true
	w.note(format, args...)
}

func (w *work) step(i int) *Step { return &w.d.Steps[i] }

func (w *work) stepIndex(name string) int { return w.d.compiled.steps[name] }

func (w *work) state() State { return w.d.compiled.states[w.in.State] }

// clone deep-copies the progress.
func (p Progress) clone() Progress {
	return Progress{
		Completed:            slices.Clone(p.Completed),
		Compensated:          slices.Clone(p.Compensated),
		Outcomes:             cloneMap(p.Outcomes),
		Sent:                 cloneMap(p.Sent),
		Skipped:              slices.Clone(p.Skipped),
		Stopped:              slices.Clone(p.Stopped),
		SentCompensations:    cloneMap(p.SentCompensations),
		CompensationOutcomes: cloneMap(p.CompensationOutcomes),
		ReviewFrom:           p.ReviewFrom,
		OperatorRetries:      maps.Clone(p.OperatorRetries),
		Deferrals:            p.Deferrals,
		Cancel:               cloneCancel(p.Cancel),
		Group:                p.Group.clone(),
		Parent:               cloneParent(p.Parent),
		ChildReview:          cloneChildReview(p.ChildReview),
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
