package sagatest

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
)

// Epoch is the harness clock's starting time.
var Epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// Harness drives one saga instance in memory. Methods whose names do not
// start with Try fail the test on error. A Harness is not safe for
// concurrent use; use one per (sub)test.
type Harness struct {
	t     testing.TB
	def   *sagadef.Definition
	hooks sagadef.Hooks
	now   time.Time
	seq   int

	started bool
	inst    sagadef.Instance
	history []Entry
	sent    []sagadef.Outgoing
	// table holds the definition's transition rows, keyed by rowKey.
	table map[string]bool
	// lastMessage is the last message trigger delivered, for Duplicate.
	lastMessage *sagadef.Trigger

	// OperatorName is the operator recorded on operator triggers.
	OperatorName string
}

// New returns a harness for def with the given hooks, a fake clock at
// [Epoch] and sequential message ids ("msg-1", "msg-2", ...). It compiles
// def when it is not compiled yet (so do not share an uncompiled definition
// between parallel tests).
func New(t testing.TB, def *sagadef.Definition, hooks sagadef.Hooks) *Harness {
	t.Helper()
	if !def.Compiled() {
		if err := def.Compile(); err != nil {
			t.Fatalf("sagatest: compile %s: %v", def.Name, err)
		}
	}
	h := &Harness{t: t, def: def, hooks: hooks, now: Epoch, OperatorName: "sagatest", table: map[string]bool{}}
	for _, tr := range def.Transitions {
		h.table[rowKey(tr.From, tr.Trigger, tr.To, tr.Emits)] = true
	}
	return h
}

// Entry is one trigger the harness applied and its result.
type Entry struct {
	Trigger sagadef.Trigger
	Result  sagadef.Result
}

func rowKey(from, trigger, to string, emits []string) string {
	return fmt.Sprintf("%s\x00%s\x00%s\x00%v", from, trigger, to, emits)
}

// Env returns the environment the harness passes to the machine.
func (h *Harness) Env() sagadef.Env {
	return sagadef.Env{Now: h.now, NewID: h.NewID, Hooks: h.hooks}
}

// NewID returns the next sequential id.
func (h *Harness) NewID() string {
	h.seq++
	return fmt.Sprintf("msg-%d", h.seq)
}

// Now returns the fake clock's time.
func (h *Harness) Now() time.Time { return h.now }

// Advance moves the fake clock forward by d.
func (h *Harness) Advance(d time.Duration) { h.now = h.now.Add(d) }

// Start begins the instance (saga id "saga-1") from its start message.
func (h *Harness) Start(msg message.Message) sagadef.Result {
	h.t.Helper()
	if h.started {
		h.t.Fatalf("sagatest: saga already started")
	}
	res, err := h.def.Begin(context.Background(), h.Env(), "saga-1", msg)
	if err != nil {
		h.t.Fatalf("sagatest: begin: %v", err)
	}
	h.started = true
	h.record(sagadef.Trigger{Kind: sagadef.TriggerStart, Message: msg}, res)
	return res
}

// Reply delivers msg as the answer to the command the saga waits on: its
// CausationID is the pending message id (empty while an External step
// waits, which needs none). While the saga waits on a parallel group, it
// is the pending command of the member whose reply msg is (see
// PendingFor).
func (h *Harness) Reply(msg message.Message) sagadef.Result {
	h.t.Helper()
	h.requireStarted()
	id := h.inst.PendingMessageID
	if h.inst.Progress.Group != nil && msg != nil && msg.SagaMessageInfo() != nil {
		if ref, ok := h.def.Lookup(msg.SagaMessageInfo().FullName); ok && ref.Step != "" {
			if p := h.PendingFor(ref.Step); p != "" {
				id = p
			}
		}
	}
	return h.ReplyTo(id, msg)
}

// PendingFor returns the id of the command the saga waits on for step: a
// waiting member's pending command in a parallel group's state, the
// pending command when the saga waits on step alone, "" otherwise.
func (h *Harness) PendingFor(step string) string {
	if g := h.inst.Progress.Group; g != nil && h.inst.State != sagadef.StateManualReview {
		for _, m := range g.Members {
			if m.Step == step {
				return m.Pending
			}
		}
		return ""
	}
	if st, ok := h.def.LookupState(h.inst.State); ok && st.Step == step && st.Kind == sagadef.StateKindStep {
		return h.inst.PendingMessageID
	}
	return ""
}

// ReplyFor delivers msg as the answer to the command the saga waits on for
// step (see PendingFor): in a parallel group, each member's reply names
// its own command.
func (h *Harness) ReplyFor(step string, msg message.Message) sagadef.Result {
	h.t.Helper()
	h.requireStarted()
	id := h.PendingFor(step)
	if id == "" {
		h.t.Fatalf("sagatest: the saga (state %s) waits on no command of step %s", h.inst.State, step)
	}
	return h.ReplyTo(id, msg)
}

// ReplyTo delivers msg with the given CausationID (the MessageID of the
// command it answers).
func (h *Harness) ReplyTo(causationID string, msg message.Message) sagadef.Result {
	h.t.Helper()
	h.requireStarted()
	if msg == nil || msg.SagaMessageInfo() == nil {
		h.t.Fatalf("sagatest: reply without a message")
	}
	return h.must(sagadef.Trigger{Kind: msg.SagaMessageInfo().FullName, Message: msg, CausationID: causationID})
}

// Duplicate re-delivers the last message (Reply or ReplyTo) with a new
// message id, as a redelivery by a participant that ran twice would.
func (h *Harness) Duplicate() sagadef.Result {
	h.t.Helper()
	if h.lastMessage == nil {
		h.t.Fatalf("sagatest: no message delivered yet")
	}
	trig := *h.lastMessage
	trig.MessageID = ""
	return h.must(trig)
}

// Timeout moves the clock past the armed timeout and fires it.
func (h *Harness) Timeout() sagadef.Result {
	h.t.Helper()
	h.requireStarted()
	if h.inst.TimeoutAt.IsZero() {
		h.t.Fatalf("sagatest: no timeout armed in state %s", h.inst.State)
	}
	if h.now.Before(h.inst.TimeoutAt) {
		h.now = h.inst.TimeoutAt.Add(time.Millisecond)
	}
	return h.must(sagadef.Trigger{Kind: sagadef.TriggerTimeout})
}

// Deadline moves the clock past the saga's deadline and fires it.
func (h *Harness) Deadline() sagadef.Result {
	h.t.Helper()
	h.requireStarted()
	if h.inst.DeadlineAt.IsZero() {
		h.t.Fatalf("sagatest: no deadline armed in state %s", h.inst.State)
	}
	if h.now.Before(h.inst.DeadlineAt) {
		h.now = h.inst.DeadlineAt.Add(time.Millisecond)
	}
	return h.must(sagadef.Trigger{Kind: sagadef.TriggerDeadline})
}

// Operator applies an operator trigger (one of the sagadef.TriggerOperator*
// kinds except resolve) with the given reason.
func (h *Harness) Operator(kind, reason string) sagadef.Result {
	h.t.Helper()
	return h.must(sagadef.Trigger{Kind: kind, Operator: h.OperatorName, Reason: reason})
}

// OperatorRetry applies an operator's retry (sagadef.TriggerOperatorRetry)
// with the given reason.
func (h *Harness) OperatorRetry(reason string) sagadef.Result {
	h.t.Helper()
	return h.Operator(sagadef.TriggerOperatorRetry, reason)
}

// OperatorCompensate applies an operator's forced compensation
// (sagadef.TriggerOperatorCompensate) with the given reason.
func (h *Harness) OperatorCompensate(reason string) sagadef.Result {
	h.t.Helper()
	return h.Operator(sagadef.TriggerOperatorCompensate, reason)
}

// OperatorCancel applies an operator's cancel (sagadef.TriggerOperatorCancel,
// no compensation) with the given reason.
func (h *Harness) OperatorCancel(reason string) sagadef.Result {
	h.t.Helper()
	return h.Operator(sagadef.TriggerOperatorCancel, reason)
}

// Cancel delivers the saga's business cancel message (Definition.Cancel);
// who asked and why come from its fields.
func (h *Harness) Cancel(msg message.Message) sagadef.Result {
	h.t.Helper()
	h.requireStarted()
	if msg == nil || msg.SagaMessageInfo() == nil {
		h.t.Fatalf("sagatest: cancel without a message")
	}
	if name := msg.SagaMessageInfo().FullName; name != h.def.Cancel.Message {
		h.t.Fatalf("sagatest: %s is not the cancel message of %s (%q)", name, h.def.Name, h.def.Cancel.Message)
	}
	return h.must(sagadef.Trigger{Kind: msg.SagaMessageInfo().FullName, Message: msg})
}

// Resolve applies an operator resolve to the given terminal state.
func (h *Harness) Resolve(to, reason string) sagadef.Result {
	h.t.Helper()
	return h.must(sagadef.Trigger{Kind: sagadef.TriggerOperatorResolve, Operator: h.OperatorName, Reason: reason, ResolveTo: to})
}

// TryApply applies any trigger and returns the machine's error instead of
// failing the test. A message trigger without MessageID gets a new one. On
// success the instance advances and the result is recorded. Either way the
// harness checks that Apply left its input untouched.
func (h *Harness) TryApply(trig sagadef.Trigger) (sagadef.Result, error) {
	h.t.Helper()
	h.requireStarted()
	if trig.MessageID == "" && trig.Message != nil {
		trig.MessageID = h.NewID()
	}
	before := snapshot(h.inst)
	res, err := h.def.Apply(context.Background(), h.Env(), h.inst, trig)
	if diff := before.diff(h.inst); diff != "" {
		h.t.Errorf("sagatest: Apply(%s) modified its input instance: %s", trig.Kind, diff)
	}
	if err != nil {
		return res, err
	}
	if trig.Message != nil {
		t := trig
		h.lastMessage = &t
	}
	h.record(trig, res)
	return res, nil
}

func (h *Harness) must(trig sagadef.Trigger) sagadef.Result {
	h.t.Helper()
	res, err := h.TryApply(trig)
	if err != nil {
		h.t.Fatalf("sagatest: apply %s in state %s: %v", trig.Kind, h.inst.State, err)
	}
	return res
}

// record keeps the result and checks that a transition is a row of the
// definition's transition table.
func (h *Harness) record(trig sagadef.Trigger, res sagadef.Result) {
	h.t.Helper()
	h.inst = res.Instance
	h.history = append(h.history, Entry{Trigger: trig, Result: res})
	h.sent = append(h.sent, res.Emit...)
	if !res.IsTransition() {
		return
	}
	kind := trig.Kind
	if kind == "" && trig.Message != nil {
		kind = trig.Message.SagaMessageInfo().FullName
	}
	var emits []string
	for _, o := range res.Emit {
		emits = append(emits, o.Message.SagaMessageInfo().FullName)
	}
	if !h.table[rowKey(res.From, kind, res.To, emits)] {
		h.t.Errorf("sagatest: transition %s --%s--> %s %v is not in the transition table of %s", res.From, kind, res.To, emits, h.def.Name)
	}
}

func (h *Harness) requireStarted() {
	h.t.Helper()
	if !h.started {
		h.t.Fatalf("sagatest: saga not started; call Start first")
	}
}

// Instance returns the current instance.
func (h *Harness) Instance() sagadef.Instance { return h.inst }

// History returns every trigger applied so far with its result, Start's
// first.
func (h *Harness) History() []Entry { return h.history }

// Last returns the latest result.
func (h *Harness) Last() sagadef.Result {
	h.t.Helper()
	if len(h.history) == 0 {
		h.t.Fatalf("sagatest: no result yet")
	}
	return h.history[len(h.history)-1].Result
}

// Sent returns every message the saga sent so far, in order.
func (h *Harness) Sent() []sagadef.Outgoing { return h.sent }

// LastSent returns the most recent message of the given type the saga sent.
func (h *Harness) LastSent(fullName string) sagadef.Outgoing {
	h.t.Helper()
	for i := len(h.sent) - 1; i >= 0; i-- {
		if h.sent[i].Message.SagaMessageInfo().FullName == fullName {
			return h.sent[i]
		}
	}
	h.t.Fatalf("sagatest: the saga never sent %s", fullName)
	return sagadef.Outgoing{}
}

// RequireState fails the test unless the instance is in state.
func (h *Harness) RequireState(state string) {
	h.t.Helper()
	if h.inst.State != state {
		h.t.Fatalf("sagatest: state is %s, want %s (last note: %s)", h.inst.State, state, h.lastNote())
	}
}

// RequireSent fails the test unless the latest result sent exactly the
// messages of the given full names, in order (none when called without
// arguments).
func (h *Harness) RequireSent(fullNames ...string) {
	h.t.Helper()
	var got []string
	for _, o := range h.Last().Emit {
		got = append(got, o.Message.SagaMessageInfo().FullName)
	}
	if !reflect.DeepEqual(got, fullNames) && (len(got) != 0 || len(fullNames) != 0) {
		h.t.Fatalf("sagatest: last transition sent %v, want %v (note: %s)", got, fullNames, h.lastNote())
	}
}

// RequireClass fails the test unless the latest result has class c.
func (h *Harness) RequireClass(c sagadef.Class) {
	h.t.Helper()
	if got := h.Last().Class; got != c {
		h.t.Fatalf("sagatest: last trigger classified %s, want %s (note: %s)", got, c, h.lastNote())
	}
}

func (h *Harness) lastNote() string {
	if len(h.history) == 0 {
		return ""
	}
	return h.history[len(h.history)-1].Result.Note
}

// instanceSnapshot is a deep copy of an instance, to detect mutation.
type instanceSnapshot struct {
	inst     sagadef.Instance
	progress sagadef.Progress
	data     proto.Message
}

func snapshot(inst sagadef.Instance) instanceSnapshot {
	s := instanceSnapshot{inst: inst, progress: deepProgress(inst.Progress)}
	if inst.Data != nil {
		s.data = proto.Clone(inst.Data)
	}
	return s
}

// diff describes how inst differs from the snapshot ("" when equal).
func (s instanceSnapshot) diff(inst sagadef.Instance) string {
	if !reflect.DeepEqual(s.progress, inst.Progress) {
		return fmt.Sprintf("progress %+v became %+v", s.progress, inst.Progress)
	}
	if (s.data == nil) != (inst.Data == nil) || (s.data != nil && !proto.Equal(s.data, inst.Data)) {
		return "saga data changed"
	}
	a, b := s.inst, inst
	a.Progress, b.Progress, a.Data, b.Data = sagadef.Progress{}, sagadef.Progress{}, nil, nil
	if !reflect.DeepEqual(a, b) {
		return fmt.Sprintf("%+v became %+v", a, b)
	}
	return ""
}

func cancellation(c *sagadef.Cancellation) *sagadef.Cancellation {
	if c == nil {
		return nil
	}
	cp := *c
	return &cp
}

func deepProgress(p sagadef.Progress) sagadef.Progress {
	cp := func(m map[string]string) map[string]string {
		if m == nil {
			return nil
		}
		out := make(map[string]string, len(m))
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	cl := func(s []string) []string {
		if s == nil {
			return nil
		}
		return append([]string(nil), s...)
	}
	return sagadef.Progress{
		Completed: cl(p.Completed), Compensated: cl(p.Compensated), Stopped: cl(p.Stopped), Skipped: cl(p.Skipped),
		Outcomes: cp(p.Outcomes), Sent: cp(p.Sent),
		SentCompensations: cp(p.SentCompensations), CompensationOutcomes: cp(p.CompensationOutcomes),
		ReviewFrom: p.ReviewFrom, OperatorRetries: maps.Clone(p.OperatorRetries), Deferrals: p.Deferrals,
		Cancel: cancellation(p.Cancel), Group: groupProgress(p.Group),
	}
}

func groupProgress(g *sagadef.GroupProgress) *sagadef.GroupProgress {
	if g == nil {
		return nil
	}
	cp := *g
	cp.Members = append([]sagadef.MemberProgress(nil), g.Members...)
	return &cp
}
